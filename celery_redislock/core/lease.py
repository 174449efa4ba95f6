"""A lease and what holds it: a lock's token with its fence, expiry and owner; and the batch
renewal that extends many leases in one round trip per Redis node."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

import redis
from redis.cluster import RedisCluster
from redis.exceptions import MovedError

from ..errors import LockBackendError, LockLost, LockNotOwned, RedisLockError
from .durations import TTL, seconds
from .protocol import Mode, RenewArgs, RenewReply
from .replicas import ReplicaPolicy, pipelined, refresh
from .scripts import explain_denial, run

if TYPE_CHECKING:
    from .lock import Lock

__all__ = [
    "Holder",
    "Lease",
    "Mode",
    "RedisClient",
    "RenewReport",
    "backend_errors",
    "renew_leases",
]

log = logging.getLogger(__name__)

RedisClient = redis.Redis | RedisCluster


def _backend_error(name: str | None, exc: redis.RedisError) -> LockBackendError:
    denied = explain_denial(exc)
    hint = f" ({denied})" if denied else ""
    return LockBackendError(f"lock {name!r}: Redis failed{hint}: {exc}", name=name)


@contextmanager
def backend_errors(name: str | None) -> Iterator[None]:
    """Turns redis-py's errors into LockBackendError carrying the lock name."""
    try:
        yield
    except redis.RedisError as exc:
        raise _backend_error(name, exc) from exc


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


@dataclass(eq=False)
class Lease:
    """A held lease. Release it (or leave a ``with`` block) to give the lock back.

    ``fence`` grows strictly with every acquisition of the lock's name: pass it along with
    writes so a store can refuse a write from a holder whose lease has since been lost.

    >>> with lock.acquire() as lease:          # doctest: +SKIP
    ...     store.write(data, fence=lease.fence)
    """

    lock: Lock
    token: str
    fence: int
    mode: Mode
    owner: str | None
    expires_at_ms: int
    """Server time (ms since the epoch) at which the lease lapses unless renewed."""
    valid_until: float = field(repr=False)
    """Local ``time.monotonic()`` by which the lease is certainly still held if not lost."""
    lost: bool = field(default=False, repr=False)
    released: bool = field(default=False, repr=False)
    # A kind of lease not renewed by one script call on its lock's client (a RedLock lease: on
    # a majority of masters) names the batch renewal :func:`renew_leases` hands it to.
    renew_apart: ClassVar[Callable[[list[Lease], float | None], RenewReport] | None] = None

    @property
    def name(self) -> str:
        return self.lock.name

    def release(self, *, finish_job: str | None = None, keep: float | None = None) -> None:
        """Gives the lease back (one level of it, if the owner re-entered). With ``finish_job``,
        records that job as finished for ``keep`` seconds in the same step (see
        :meth:`Lock.finish_job`), even if the lease had lapsed.

        Raises :class:`LockNotOwned` if it was not held any more (expired, or released already).
        """
        self.lock.release(self, finish_job=finish_job, keep=keep)

    def renew(self, ttl: float | None = None) -> None:
        """Extends the lease to ``ttl`` seconds from now (default: the lock's ttl); a lease that
        already runs longer is left as it is (renewal never shortens).

        Raises :class:`LockLost` if the lease had already lapsed or was removed.
        """
        report = renew_leases([self], ttl=ttl)
        if report.lost:
            raise LockLost(
                f"lease {self.token} of lock {self.name!r} was lost",
                name=self.name,
                token=self.token,
            )

    def check(self) -> None:
        """Raises :class:`LockLost` if the lease is known lost or may have lapsed, and
        :class:`LockNotOwned` if it was released."""
        if self.released:
            raise LockNotOwned(
                f"lease {self.token} of lock {self.name!r} was released",
                name=self.name,
                token=self.token,
            )
        if self.lost or time.monotonic() >= self.valid_until:
            raise LockLost(
                f"lease {self.token} of lock {self.name!r} was lost",
                name=self.name,
                token=self.token,
            )

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.released:
            _release_on_exit(self, exc)


def _release_on_exit(lease: Lease, exc: BaseException | None) -> None:
    """Leaving a ``with`` block: a failed release raises on a clean exit, but never hides the
    exception the body raised (it is logged instead, as redis-py's Lock does)."""
    if exc is None:
        lease.release()
        return
    try:
        lease.release()
    except RedisLockError as error:
        log.warning("lock %r: release after the block raised %r failed: %s", lease.name, exc, error)


@dataclass(frozen=True, slots=True)
class RenewReport:
    """What one :func:`renew_leases` call found: leases extended, and leases that were lost."""

    renewed: list[Lease]
    lost: list[Lease]


def renew_leases(leases: Iterable[Lease], *, ttl: float | None = None) -> RenewReport:
    """Extends every lease to ``ttl`` seconds from now (default: each lock's own ttl), never
    shortening one.

    One script call per Redis client (one per slot, pipelined per node, on Redis Cluster), so
    renewing thousands of leases costs one round trip per node. A lease that had lapsed or was
    removed is reported in ``lost`` and marked ``lease.lost``; it is never revived.
    """
    if ttl is not None:
        ttl = seconds(ttl, TTL, "ttl")
    renewed: list[Lease] = []
    lost: list[Lease] = []
    plain: list[Lease] = []
    apart: dict[object, list[Lease]] = {}
    for lease in leases:
        if type(lease).renew_apart is None:
            plain.append(lease)
        else:
            apart.setdefault(type(lease).renew_apart, []).append(lease)
    for group in apart.values():
        renew_apart = type(group[0]).renew_apart
        assert renew_apart is not None
        report = renew_apart(group, ttl)
        renewed += report.renewed
        lost += report.lost
    for client, group in _by_client(plain).values():
        sent, expiries = _send(client, group, ttl)
        for lease, expiry in zip(group, expiries, strict=True):
            if expiry > 0:
                lease.expires_at_ms = expiry
                lease.valid_until = sent + (ttl if ttl is not None else lease.lock.ttl)
                renewed.append(lease)
            else:
                lease.lost = True
                lost.append(lease)
    return RenewReport(renewed, lost)


def _by_client(leases: Iterable[Lease]) -> dict[int, tuple[RedisClient, list[Lease]]]:
    by_client: dict[int, tuple[RedisClient, list[Lease]]] = {}
    for lease in leases:
        client = lease.lock.client
        entry = by_client.get(id(client))
        if entry is None:
            entry = by_client[id(client)] = (client, [])
        entry[1].append(lease)
    return by_client


def _send(client: RedisClient, group: list[Lease], ttl: float | None) -> tuple[float, list[int]]:
    """One batch renewal on ``client``: when it was sent, and each lease's new expiry in server
    ms (0: lost). Touches no lease, so it may run on any thread."""
    sent = time.monotonic()
    with backend_errors(group[0].name if len(group) == 1 else None):
        return sent, _run(client, group, ttl)


def _calls(group: list[Lease], ttl: float | None) -> list[tuple[list[int], list[bytes], list[str]]]:
    """Script calls for ``group``: one per distinct ttl (index list, keys, args)."""
    # One pass, building each call's keys and tokens as it goes: thousands of leases a call.
    fixed = None if ttl is None else max(1, round(ttl * 1000))
    by_ttl: dict[int, tuple[list[int], list[bytes], list[str]]] = {}
    for i, lease in enumerate(group):
        lock = lease.lock
        ms = lock._ttl_ms if fixed is None else fixed
        entry = by_ttl.get(ms)
        if entry is None:
            entry = by_ttl[ms] = ([], [], [])
        entry[0].append(i)
        entry[1].extend(lock.encoded_keys[:2])
        entry[2].append(lease.token)
    return [
        (indexes, keys, RenewArgs(ttl_ms=ms, tokens=tokens).encode())
        for ms, (indexes, keys, tokens) in by_ttl.items()
    ]


def _strictest(group: list[Lease]) -> ReplicaPolicy | None:
    """The replica acknowledgement the batch needs: the most replicas any of its locks asks
    for, waited for as long as the longest of their timeouts."""
    policies = [lease.lock.replicas for lease in group if lease.lock.replicas is not None]
    if not policies:
        return None
    return ReplicaPolicy(max(p.count for p in policies), max(p.timeout for p in policies))


def _run(client: RedisClient, group: list[Lease], ttl: float | None) -> list[int]:
    policy = _strictest(group)
    if isinstance(client, RedisCluster):
        try:
            return _run_cluster(client, group, ttl, policy)
        except MovedError:
            # A failover moved slots: ask the cluster where they are now, and try once more
            # (renewal is safe to run twice).
            refresh(client)
            return _run_cluster(client, group, ttl, policy)
        except (redis.ConnectionError, redis.TimeoutError):
            refresh(client)  # a node is gone: the next try goes where its slots went
            raise
    out = [0] * len(group)
    if policy is not None:
        calls = _calls(group, ttl)
        replies = _pipelined(client, [(keys, args) for _, keys, args in calls], group, policy)
        for (indexes, _, _), raw in zip(calls, replies, strict=True):
            for i, expiry in zip(indexes, RenewReply.decode(raw).expiries, strict=True):
                out[i] = expiry
        return out
    for indexes, keys, args in _calls(group, ttl):
        reply = RenewReply.decode(run("renew", client, keys, args))
        for i, expiry in zip(indexes, reply.expiries, strict=True):
            out[i] = expiry
    return out


def _run_cluster(
    client: RedisCluster, group: list[Lease], ttl: float | None, policy: ReplicaPolicy | None
) -> list[int]:
    out = [0] * len(group)
    # A script may touch one slot only: one call per slot, pipelined to each node in one go.
    by_node: dict[str, tuple[redis.Redis, dict[int, list[int]]]] = {}
    for i, lease in enumerate(group):
        key = lease.lock.keys.leases
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        entry = by_node.setdefault(node.name, (client.get_redis_connection(node), {}))
        entry[1].setdefault(client.keyslot(key), []).append(i)  # type: ignore[no-untyped-call]
    for node_client, by_slot in by_node.values():
        calls = []
        for indexes in by_slot.values():
            for sub, keys, args in _calls([group[i] for i in indexes], ttl):
                calls.append(([indexes[j] for j in sub], keys, args))
        replies = _pipelined(
            node_client,
            [(keys, args) for _, keys, args in calls],
            [group[i] for indexes, _, _ in calls for i in indexes],
            policy,
            client,
        )
        for (indexes, _, _), raw in zip(calls, replies, strict=True):
            for i, expiry in zip(indexes, RenewReply.decode(raw).expiries, strict=True):
                out[i] = expiry
    return out


def _pipelined(
    client: redis.Redis,
    calls: list[tuple[list[bytes], list[str]]],
    group: list[Lease],
    policy: ReplicaPolicy | None,
    cluster: RedisCluster | None = None,
) -> list[Any]:
    """The renew calls on one node's connection, in one round trip (an ASK answer sends its
    calls on to the node named). With ``policy``, WAIT follows on the same connection, and fewer
    acknowledgements than asked raise :class:`LockBackendError`: the renewal is not counted
    (its leases are at risk: the heartbeat tries again, and reports them lost if they lapse)."""
    replies, acks = pipelined(client, "renew", calls, policy, cluster=cluster)
    if policy is not None:
        names = {lease.name for lease in group}
        policy.check(acks or 0, names.pop() if len(names) == 1 else None, "renewal")
    return replies
