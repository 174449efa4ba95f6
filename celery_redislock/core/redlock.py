"""RedLock: a :class:`~celery_redislock.core.lock.Lock` whose store is a quorum of independent
Redis masters (:class:`~celery_redislock.core.redlock_store.QuorumStore`), held while a majority
of them hold its lease; ``limit`` above 1 and ``fair`` are refused (see docs/topologies.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

import redis
from redis.cluster import RedisCluster

from ..errors import LockConfigError
from .keys import check_name
from .lock import Lease, Lock, LockExtras
from .protocol import Mode
from .redlock_masters import check_masters, master_clients
from .redlock_store import QuorumStore
from .store import RedisClient

__all__ = ["RedLease", "RedLock", "lock_factory"]

RedLease = Lease
"""A lease held on a majority of a :class:`RedLock`'s masters: a :class:`Lease` whose
``valid_until`` is the end of its validity (``ttl - elapsed - drift`` from its acquisition or
last renewal)."""


class RedLock(Lock):
    """A lock over independent Redis masters: a mutex (``limit`` None or 1) or a read/write
    lock, held while a majority of the masters hold its lease.

    ``masters``: one ``redis.Redis`` client per master, an odd number of at least 3 (see
    :func:`~celery_redislock.core.redlock_masters.master_clients` to make them from URLs, with
    retries off and short timeouts). ``client`` is the first master's (it is not used alone).

    Failures: a majority of masters unreachable, or a majority granted only after the validity
    ran out, raise :class:`LockBackendError` (fail closed); the lock held elsewhere raises
    :class:`LockNotAcquired` (after ``timeout`` when blocking: waiting is by tries at random
    pauses of up to 0.2 s, as no wake-up crosses masters).

    >>> lock = RedLock(masters, "nightly-report", ttl=30)   # doctest: +SKIP
    >>> with lock.acquire(timeout=5) as lease:              # doctest: +SKIP
    ...     store.write(data, fence=lease.fence)
    """

    def __init__(
        self,
        masters: Sequence[redis.Redis],
        name: str,
        *,
        ttl: float,
        mode: Mode = "write",
        limit: int | None = None,
        fair: bool = False,
        **more: Unpack[LockExtras],
    ) -> None:
        name = check_name(name)
        store = QuorumStore(check_masters(masters, name=name))
        if limit is not None and limit != 1:
            raise LockConfigError(
                f"limit must be None or 1 in RedLock mode, got {limit!r}: a cap counted per "
                "master is not safe with majorities (3 masters, limit 2: holders on {A,B}, "
                "{B,C} and {A,C} each have a majority, no master counts more than 2, and 3 "
                "run); use one lock per permit instead",
                name=name,
            )
        if fair is not False:
            raise LockConfigError(
                "fair=True is not available in RedLock mode: each master would hand the lock "
                "to its own first waiter; blocking acquires try again instead",
                name=name,
            )
        if more.get("min_replicas") or more.get("replica_timeout") is not None:
            raise LockConfigError(
                "min_replicas does not apply in RedLock mode: the masters are independent, "
                "and a majority of them is what keeps a lease",
                name=name,
            )
        # (handover and its window pass through: nobody parks on a RedLock, see the docs)
        super().__init__(store, name, ttl=ttl, mode=mode, limit=limit, **more)
        self.masters = store.masters
        self.quorum = store.quorum
        self.drift = store.drift(self.ttl)
        """Seconds of the ttl a lease is not counted on for (clock drift)."""

    def __repr__(self) -> str:
        return (
            f"RedLock({self.name!r}, masters={len(self.masters)}, mode={self.mode!r}, "
            f"ttl={self.ttl})"
        )


def lock_factory(
    target: RedisClient | Sequence[redis.Redis] | Sequence[str], name: str, **options: Any
) -> Lock:
    """A lock on ``target``: one Redis client (plain, Sentinel-managed, or a Cluster) gives a
    :class:`Lock`; a list or tuple of master clients, or of master URLs (clients then made by
    :func:`~celery_redislock.core.redlock_masters.master_clients`, once per process), gives a
    :class:`RedLock`. ``options`` are :class:`Lock`'s keyword arguments (``ttl``, ``mode``, ...).

    >>> lock_factory(settings.redlock_urls or client, "report", ttl=30)   # doctest: +SKIP
    """
    if isinstance(target, redis.Redis | RedisCluster):
        return Lock(target, name, **options)
    if isinstance(target, list | tuple):
        if target and all(isinstance(item, str) for item in target):
            return RedLock(master_clients(target), name, **options)
        return RedLock(target, name, **options)
    raise LockConfigError(
        "a lock needs a Redis client (redis.Redis or RedisCluster), or a list of RedLock "
        f"masters (clients or URLs), got {type(target).__name__}",
        name=name,
    )
