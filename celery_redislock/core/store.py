"""Where a lock keeps its leases: the :class:`Store` protocol a :class:`~.lock.Lock` runs every
operation through (one Redis server: :class:`~.server_store.ServerStore`; a quorum of masters:
:class:`~.redlock_store.QuorumStore`), and the types the lock's modules share. Nothing here
imports the lock: a store sees a lock as a :class:`LockView`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import redis
from redis.cluster import RedisCluster

from ..errors import LockBackendError
from .keys import LockKeys
from .protocol import AcquireReply, Mode, ReleaseReply, ReleaseWhereReply
from .replicas import ReplicaPolicy
from .scripts import explain_denial

__all__ = [
    "Holder",
    "LeaseView",
    "LockView",
    "RedisClient",
    "Renewals",
    "Store",
    "backend_error",
    "backend_errors",
]

RedisClient = redis.Redis | RedisCluster


def backend_error(name: str | None, exc: redis.RedisError, what: str = "lock") -> LockBackendError:
    """``exc`` as a :class:`LockBackendError` naming the lock (and what an ACL refused)."""
    denied = explain_denial(exc)
    hint = f" ({denied})" if denied else ""
    return LockBackendError(f"{what} {name!r}: Redis failed{hint}: {exc}", name=name)


@contextmanager
def backend_errors(name: str | None, what: str = "lock") -> Iterator[None]:
    """Turns redis-py's errors into LockBackendError naming the lock (or ``what`` it is)."""
    try:
        yield
    except redis.RedisError as exc:
        raise backend_error(name, exc, what) from exc


@dataclass(frozen=True, slots=True)
class Holder:
    """One live lease, as :meth:`Lock.holders` reports it."""

    token: str
    mode: Mode
    fence: int
    owner: str | None
    info: dict[str, str]
    count: int
    expires_in: float


class Renewals(NamedTuple):
    """What one renewal call found, as lists in the order of its leases (no object per lease:
    a call renews thousands, and each tuple made would feed the garbage collector)."""

    expiries: list[int]
    """> 0: renewed (the server time until which it is held; on a quorum, until which a
    majority has it); 0: lost (gone, or a quorum's answer came after its validity); -1: not
    known this time (too few masters answered): try again."""
    valid_until: list[float]
    """Each lease's new validity end (``time.monotonic()``), if renewed."""
    why: list[str | None] | None
    """Why each was not renewed (None: nothing to say)."""


class LockView(Protocol):
    """What a store reads of a lock (a :class:`~.lock.Lock` is one)."""

    name: str
    ttl: float
    ttl_ms: int
    keys: LockKeys

    @property
    def encoded_keys(self) -> list[bytes]:
        """KEYS of every general-path script, encoded."""

    spec: str
    """:meth:`LockSpec.encode` of the lock's settings (every lock script takes it)."""
    replicas: ReplicaPolicy | None
    namespace: str
    lean_keys: list[bytes] | None
    """The fast path's KEYS (``lua/lean_*.lua``), for a plain mutex; None: never."""


class LeaseView(Protocol):
    """What a store reads of a lease to renew it (a :class:`~.lock.Lease` is one)."""

    token: str
    valid_until: float

    @property
    def lock(self) -> LockView: ...


@runtime_checkable
class Store(Protocol):
    """Runs a lock's scripts where its leases live, and says what came back as one reply.

    Every method takes the lock (its keys, spec, name and ttl) and the script's encoded ARGV;
    a failure to reach enough of Redis raises :class:`LockBackendError` (or a
    ``redis.RedisError``, which the lock turns into one).
    """

    @property
    def client(self) -> RedisClient:
        """The one server's client (a quorum: its first master's), for the task line's calls."""

    key: object
    """Leases whose stores have the same key renew in one batch."""
    replicas: ReplicaPolicy | None
    """The replicas that must acknowledge each acquire and renewal (None: none)."""
    queues: bool
    """Whether a blocked acquire waits in line on the store, woken by a push; else it tries
    again after a pause (no push crosses a quorum's masters)."""

    def where(self) -> str:
        """Where the leases live, for log lines."""

    def drift(self, ttl: float) -> float:
        """Seconds of ``ttl`` a lease is not counted on for (a quorum's clock drift)."""

    def max_block(self) -> float:
        """The longest blocking call the client's socket timeout allows (inf: no limit)."""

    def acquire(self, lock: LockView, args: list[str]) -> AcquireReply:
        """``acquire.lua`` with ``args``; on a quorum, the majority's answer (a new token per
        try) with the fence agreed, what a failed try took given back."""

    def abandon(self, lock: LockView, token: str) -> None:
        """After an acquire that failed with an error: drops the lease it may have made."""

    def await_push(self, lock: LockView, key: str, seconds: float, tries: int) -> Any | None:
        """Waits up to ``seconds`` for a push on ``key`` (the popped item); a quorum has no
        pushes: it pauses for its ``tries``-th retry and returns None."""

    def claim(self, lock: LockView, token: str) -> int:
        """Extends a lease handed to a fair waiter to the full ttl: its expiry (0: lapsed)."""

    def release(self, lock: LockView, args: list[str]) -> ReleaseReply:
        """``release.lua``; on a quorum, released if a majority released it."""

    def release_where(self, lock: LockView, args: list[str]) -> ReleaseWhereReply:
        """``release_where.lua``; on a quorum, the tokens released anywhere."""

    def finish(self, lock: LockView, args: list[str]) -> None:
        """``finish.lua`` (on a quorum, recorded on a majority)."""

    def holders(self, lock: LockView) -> list[Holder]:
        """The live leases, oldest fence first (on a quorum, those a majority holds)."""

    def renew(self, leases: Sequence[LeaseView], ttl: float | None) -> Renewals:
        """Renews ``leases`` (of locks whose stores share this one's :attr:`key`) to ``ttl``
        seconds (None: each lock's ttl). Touches no lease, so it may run on any thread."""
