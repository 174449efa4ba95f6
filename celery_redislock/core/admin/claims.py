"""Unique tasks' queued claims (a key held by a message from publish until it starts): listing
them and freeing one, checked in Redis against the task id holding it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..claims import ReleaseMode, release_claim
from ..keys import DEFAULT_NAMESPACE, LockKeys, check_name, check_namespace
from ..protocol import text
from ..store import RedisClient, backend_errors
from .listing import scan_names

__all__ = [
    "ClaimState",
    "claim_state_of",
    "describe_claim",
    "force_release_claim",
    "iter_claims",
    "list_claims",
]

STARTED = "!"
"""A claim value's mark of a once_per_period run that started (lua/_claim.lua)."""


@dataclass(frozen=True, slots=True)
class ClaimState:
    """A unique task's claim on its key while its message is queued (or, ``started``, while a
    once_per_period run's period lasts)."""

    name: str
    task_id: str
    expires_in: float | None
    """Seconds the claim has left (``None``: no expiry)."""
    started: bool = False
    """A once_per_period run started: the key stays taken for the rest of its period."""


def iter_claims(
    client: RedisClient, namespace: str = DEFAULT_NAMESPACE, pattern: str = "*"
) -> Iterator[str]:
    """Keys (lock names) of ``namespace`` that a queued unique task claims, found with SCAN."""
    return scan_names(client, namespace, pattern, "queued")


def describe_claim(
    client: RedisClient, name: str, namespace: str = DEFAULT_NAMESPACE
) -> ClaimState | None:
    """The queued claim on the key ``name`` (which task's message holds it, for how long), or
    None if no task claims it (one round trip; reads only).

    >>> describe_claim(redis.Redis(), "report:daily")   # doctest: +SKIP
    ClaimState(name='report:daily', task_id='4f0e…', expires_in=593.2, started=False)
    """
    return _claim_state(client, check_namespace(namespace), check_name(name))


def _claim_state(client: RedisClient, namespace: str, name: str) -> ClaimState | None:
    key = LockKeys.of(namespace, name).queued
    with backend_errors(name):
        pipe = client.pipeline(transaction=False)
        pipe.get(key)
        pipe.pttl(key)
        holder, pttl = pipe.execute()
    return claim_state_of(name, holder, pttl)


def claim_state_of(name: str, holder: object, pttl: int) -> ClaimState | None:
    """The claim on ``name`` as its ``queued`` key's value and PTTL say (None: no claim)."""
    if holder is None:
        return None
    value = text(holder)
    started = value.startswith(STARTED)  # (see lua/_claim.lua)
    return ClaimState(
        name, value.removeprefix(STARTED), pttl / 1000 if pttl >= 0 else None, started
    )


def list_claims(
    client: RedisClient, pattern: str = "*", namespace: str = DEFAULT_NAMESPACE
) -> list[ClaimState]:
    """The queued claims of ``namespace`` whose key matches the glob ``pattern``, by key.

    >>> list_claims(redis.Redis(), "report:*")   # doctest: +SKIP
    [ClaimState(name='report:daily', task_id='4f0e…', expires_in=593.2)]
    """
    found = (
        _claim_state(client, namespace, name)
        for name in sorted(set(iter_claims(client, namespace, pattern)))
    )
    return [state for state in found if state is not None]


def force_release_claim(
    client: RedisClient,
    name: str,
    *,
    task_id: str | None = None,
    dry_run: bool = False,
    namespace: str = DEFAULT_NAMESPACE,
) -> ClaimState | None:
    """Frees the queued claim on the key ``name`` (only if ``task_id`` holds it, when given),
    so the next call of the unique task is published. Checked in Redis against the task id read
    first: a claim taken meanwhile by another call is left alone. Returns the claim freed (or,
    with ``dry_run``, that would be freed); ``None`` if none matched.

    >>> force_release_claim(redis.Redis(), "report:daily")   # doctest: +SKIP
    ClaimState(name='report:daily', task_id='4f0e…', expires_in=593.2)
    """
    name, namespace = check_name(name), check_namespace(namespace)
    state = _claim_state(client, namespace, name)
    if state is None or (task_id is not None and state.task_id != task_id):
        return None
    if dry_run:
        return state
    freed = release_claim(client, namespace, name, state.task_id, mode=ReleaseMode.FORCE)
    return state if freed is None else None
