"""Freeing leases their holders cannot free: one lock's, by token or owner (checked in Redis in
the same step), or a whole namespace's."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import LockConfigError
from ..handover import DEFAULT_HANDOVER_WINDOW, Handover
from ..keys import DEFAULT_NAMESPACE, check_namespace
from ..lock import DEFAULT_FENCE_KEEP, Lock
from ..store import Holder, RedisClient, backend_errors
from .listing import glob_escape, iter_locks

__all__ = ["Released", "force_release", "release_all"]

_DELETE_BATCH = 500


@dataclass(frozen=True, slots=True)
class Released:
    """What :func:`force_release` freed (or, with ``dry_run``, would free)."""

    name: str
    holders: list[Holder]
    dry_run: bool = False


def force_release(
    client: RedisClient,
    name: str,
    *,
    token: str | None = None,
    task_id: str | None = None,
    everything: bool = False,
    dry_run: bool = False,
    namespace: str = DEFAULT_NAMESPACE,
    fence_keep: float = DEFAULT_FENCE_KEEP,
    handover: Handover | None = None,
    handover_window: float = DEFAULT_HANDOVER_WINDOW,
) -> Released:
    """Frees leases of the lock ``name`` that their holders cannot free (a stuck worker): the
    lease whose token is ``token``, every lease whose holder recorded ``task_id``, or, with
    ``everything=True``, every live lease. Exactly one of the three.

    Each release is checked in Redis, in the same step, against the token or the task id, so a
    lease taken meanwhile by someone else is never freed. The lock is handed on as by any
    release: blocked waiters are woken, and the next tasks in its task line are published by
    ``handover`` (a framework's publisher, ``handover_window`` as a lock's; without one, by a
    worker's sweeper at its next sweep). The holders find their leases lost at their next
    renewal. ``dry_run`` frees nothing and returns what would be freed.

    >>> force_release(redis.Redis(), "sync:42", task_id="9b1c…").holders   # doctest: +SKIP
    [Holder(token='…', mode='write', ...)]
    """
    chosen = [token is not None, task_id is not None, everything]
    if chosen.count(True) != 1:
        raise LockConfigError(
            "force_release needs exactly one of token=, task_id= or everything=True", name=name
        )
    for value, what in ((token, "token"), (task_id, "task_id")):
        if value is not None and (not isinstance(value, str) or not value):
            raise LockConfigError(f"{what} must be a non-empty string, got {value!r}", name=name)
    # Only the release scripts' parts of the spec count (fairness and fence keep): a fair lock's
    # blocked waiters look again within a second and are served in order.
    lock = Lock(
        client,
        name,
        ttl=1,
        namespace=namespace,
        fence_keep=fence_keep,
        handover=handover,
        handover_window=handover_window,
    )
    holders = lock.holders()
    if task_id is not None:
        matched = [h for h in holders if h.info.get("task_id") == task_id]
    elif token is not None:
        matched = [h for h in holders if h.token == token]
    else:
        matched = holders
    if dry_run or not matched:
        return Released(lock.name, matched, dry_run=dry_run)
    if task_id is not None:
        freed = set(lock.release_where(task_id=task_id))
    else:
        freed = set(lock.release_tokens([h.token for h in matched]))
    return Released(lock.name, [h for h in matched if h.token in freed])


def release_all(client: RedisClient, namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    """Frees every lock of ``namespace``: deletes all its keys (leases, metadata, waiting lines),
    found with SCAN. Returns the names of the locks that had leases.

    Fencing tokens start over afterwards; holders still running find their leases lost. Keys of
    other namespaces and other data are left alone.

    >>> release_all(redis.Redis.from_url(url))   # doctest: +SKIP
    ['sync:42']
    """
    check_namespace(namespace)
    names = sorted(set(iter_locks(client, namespace)))
    batch: list[bytes | str] = []
    with backend_errors(None):
        for key in client.scan_iter(match=f"{glob_escape(namespace)}:*", count=_DELETE_BATCH):
            batch.append(key)
            if len(batch) >= _DELETE_BATCH:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
    return names
