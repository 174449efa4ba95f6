"""Unique tasks' claims from asyncio code: the claim a queued copy holds on its key, read, made
and given up with the synchronous core's scripts and arguments (:mod:`celery_redislock.core.
claims`), so a web handler sees and frees the claims Celery and RQ producers make."""

from __future__ import annotations

from ..admin.claims import ClaimState, claim_state_of
from ..claims import ClaimKind, ReleaseMode, claim_call, release_claim_call
from ..keys import DEFAULT_NAMESPACE, LockKeys, check_name, check_namespace
from ..protocol import ClaimReply, ReleaseClaimReply
from ..scripts import run_async
from ..store import backend_errors
from .store import AsyncClient

__all__ = ["ClaimKind", "ClaimState", "ReleaseMode", "claim", "claim_state", "release_claim"]


async def claim_state(
    client: AsyncClient, name: str, *, namespace: str = DEFAULT_NAMESPACE
) -> ClaimState | None:
    """Who claims the key ``name`` (a queued unique task), or None.

    >>> await claim_state(aclient, "report:daily")   # doctest: +SKIP
    ClaimState(name='report:daily', task_id='4f0e…', expires_in=593.2, started=False)
    """
    key = LockKeys.of(check_namespace(namespace), check_name(name)).queued
    with backend_errors(name):
        async with client.pipeline(transaction=False) as pipe:
            pipe.get(key)
            pipe.pttl(key)
            holder, pttl = await pipe.execute()
    return claim_state_of(name, holder, pttl)


async def claim(
    client: AsyncClient,
    name: str,
    *,
    task_id: str,
    lifetime: float,
    kind: ClaimKind = ClaimKind.NEW,
    running_counts: bool = False,
    namespace: str = DEFAULT_NAMESPACE,
) -> ClaimReply:
    """Claims the key ``name`` for ``task_id`` for ``lifetime`` seconds, as a unique task's
    publish does (see :func:`celery_redislock.core.claims.claim`)."""
    keys, args = claim_call(namespace, name, task_id, lifetime, kind, running_counts)
    with backend_errors(name):
        return ClaimReply.decode(await run_async("unique_claim", client, keys, args))


async def release_claim(
    client: AsyncClient,
    name: str,
    task_id: str,
    *,
    mode: ReleaseMode = ReleaseMode.GIVE_UP,
    keep: float = 0.0,
    namespace: str = DEFAULT_NAMESPACE,
) -> str | None:
    """Gives up ``task_id``'s claim on the key ``name`` (``mode=FORCE``: even a started
    once_per_period run's); see :func:`celery_redislock.core.claims.release_claim`."""
    keys, args = release_claim_call(namespace, name, task_id, mode, keep)
    with backend_errors(name):
        raw = await run_async("unique_release", client, keys, args)
    return ReleaseClaimReply.decode(raw).superseded_by
