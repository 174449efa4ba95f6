"""Several locks taken all or nothing (a task's ``lock=`` list): one script looks at every
lock and takes a lease in each only if each has room, so a caller never holds part of the set,
and two callers taking overlapping sets in any order cannot deadlock (nobody holds while it
waits). A caller that waits asks again: when a lease it needs lapses, or after a short pause
(several locks have no common line to wait in, so the wait is not fair)."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Mapping, Sequence

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from ..errors import JobFinished, LockConfigError, LockNotAcquired
from .lock import Lease, Lock, check_acquire
from .lock_base import info_json, not_acquired
from .protocol import AcquireAllArgs, AcquireAllReply, AcquireAllStatus
from .replicas import acknowledged
from .scripts import run
from .server_store import ServerStore
from .store import backend_error

__all__ = ["acquire_all", "check_lock_set"]

# A waiter asks again at least this often (a release pushes nothing to a caller of several
# locks), starting sooner: most holds are short.
_FIRST_PAUSE_S = 0.005
_LONGEST_PAUSE_S = 0.2


def check_lock_set(locks: Sequence[Lock]) -> None:
    """Refuses a set of locks that cannot be taken in one script: fewer than two, a name twice,
    locks on a quorum of masters (RedLock), on different clients, or, on a Redis Cluster, in
    different hash slots. Raises :class:`LockConfigError` naming the first lock.

    >>> check_lock_set([Lock(r, "{acme}:7", ttl=9), Lock(r, "{acme}:all", ttl=9)])  # doctest: +SKIP
    """
    if len(locks) < 2:
        raise LockConfigError("a lock set needs at least two locks")
    first = locks[0]
    names = [lock.name for lock in locks]
    if len(set(names)) != len(names) or any(lock.namespace != first.namespace for lock in locks):
        raise LockConfigError(
            f"the locks of a set must differ by name, got {names}", name=first.name
        )
    if any(not isinstance(lock.store, ServerStore) for lock in locks):
        raise LockConfigError(
            f"locks {names} cannot be taken all or nothing over a quorum of masters (RedLock): "
            "take one lock per task there",
            name=first.name,
        )
    if any(lock.client is not first.client or lock.replicas != first.replicas for lock in locks):
        raise LockConfigError(
            f"locks {names} must share one Redis client and replica policy to be taken at once",
            name=first.name,
        )
    if isinstance(first.client, RedisCluster):
        slots = {key_slot(key) for lock in locks for key in lock.encoded_keys}
        if len(slots) > 1:
            raise LockConfigError(
                f"locks {names} are in different Redis Cluster slots, so they cannot be taken "
                f"all or nothing: start every name with one hash tag (such as "
                f"'{{acme}}:{names[0]}'; a key template writes it '{{{{acme}}}}:...')",
                name=first.name,
            )


def acquire_all(
    locks: Sequence[Lock],
    blocking: bool = True,
    timeout: float | None = None,
    *,
    owner: str | None = None,
    info: Mapping[str, object] | None = None,
    reentrant: bool = True,
    job: str | None = None,
) -> list[Lease]:
    """Takes a lease in every lock of ``locks`` or in none, and returns them in order.

    ``blocking=False`` tries once; otherwise asks again until ``timeout`` seconds (``None``:
    for as long as it takes). :class:`LockNotAcquired` names the lock that had no room
    (``owner_expires_in`` set when ``owner`` holds a lease in it and ``reentrant=False``).
    ``owner`` is recorded with each lease, but a set is not re-entered: ``reentrant`` must be
    False when ``owner`` is given. ``job``: :class:`JobFinished` if the first lock records it
    as finished. Each lease is released, renewed and lost on its own, as
    :meth:`Lock.acquire`'s are.

    Lost replies: the tokens are chosen here, so a call sent again answers the leases it made.
    If the call fails with :class:`LockBackendError`, the leases it may have made are given back
    before the error reaches the caller (or lapse within their ttl).

    >>> tenant = Lock(r, "{api}:acme", ttl=30, limit=2)       # doctest: +SKIP
    >>> every = Lock(r, "{api}:all", ttl=30, limit=10)        # doctest: +SKIP
    >>> leases = acquire_all([tenant, every], timeout=5)    # doctest: +SKIP
    """
    check_lock_set(locks)
    first = locks[0]
    check_acquire(first.name, blocking, timeout, owner, reentrant, job)
    if owner is not None and reentrant:
        raise LockConfigError(
            "a lock set is not re-entrant: pass reentrant=False with an owner", name=first.name
        )
    # A token per lock (a lease is known by its token: the heartbeat keeps one entry each).
    base = os.urandom(15).hex()
    tokens = [f"{base}{n:02x}" for n in range(len(locks))]
    args = AcquireAllArgs(
        tokens=tokens,
        specs=[lock.spec for lock in locks],
        info=info_json(info),
        once=owner is not None,
        owner=owner,
        job=job,
    ).encode()
    keys = [key for lock in locks for key in lock.encoded_keys]
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = _FIRST_PAUSE_S
    while True:
        sent = time.monotonic()
        try:
            reply = _run(first, keys, args)
        except BaseException:
            give_back_all(locks, tokens)
            raise
        if reply.status is AcquireAllStatus.HELD:
            return [
                lock._lease(token, fence, expiry, lock.mode, owner, sent)
                for lock, token, (fence, expiry) in zip(locks, tokens, reply.held, strict=True)
            ]
        blocked = locks[reply.at]
        if reply.status is AcquireAllStatus.PART_GONE:
            give_back_all(locks, tokens)
            raise LockNotAcquired(
                f"lock {blocked.name!r}: the lease this call took is gone already",
                name=blocked.name,
            )
        if reply.status is AcquireAllStatus.JOB_FINISHED:
            raise JobFinished(
                f"lock {first.name!r}: job {job!r} is recorded as finished",
                name=first.name,
                job=job or "",
            )
        own = reply.ms / 1000 if reply.status is AcquireAllStatus.OWNER_HOLDS else None
        remaining = float("inf") if deadline is None else deadline - time.monotonic()
        if own is not None or not blocking or remaining <= 0:
            raise not_acquired(blocked.name, owner, timeout, own)
        # Ask again when the blocking lease lapses at the latest, and meanwhile at pauses
        # growing to 0.2 s (jittered: callers that met must not meet again).
        until_expiry = reply.ms / 1000 + 0.001 if reply.ms > 0 else _LONGEST_PAUSE_S
        time.sleep(min(remaining, until_expiry, pause * random.uniform(0.5, 1.0)))
        pause = min(pause * 2, _LONGEST_PAUSE_S)


def _run(first: Lock, keys: list[bytes], args: list[str]) -> AcquireAllReply:
    """The script; with a replica policy, WAIT after it (a set held but not acknowledged fails
    closed: the caller gives it back)."""
    try:
        if first.replicas is None:
            return AcquireAllReply.decode(run("acquire_all", first.client, keys, args))
        raw, acks = acknowledged(
            first.client, "acquire_all", keys, args, first.replicas, slot_key=first.keys.leases
        )
    except redis.RedisError as exc:
        raise backend_error(first.name, exc) from exc
    reply = AcquireAllReply.decode(raw)
    if reply.status is AcquireAllStatus.HELD:
        first.replicas.check(acks, first.name, "acquire")
    return reply


def give_back_all(locks: Sequence[Lock], tokens: Sequence[str]) -> None:
    """Drops the leases a call with ``tokens`` may have made (best effort: what cannot be
    reached lapses within its ttl)."""
    for lock, token in zip(locks, tokens, strict=True):
        lock._abandon(token)
