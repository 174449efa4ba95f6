"""What a lock decides, apart from how it talks to Redis: its settings checked and encoded once,
the acquire loop as steps (:meth:`LockBase.acquire_steps`), and what a release sends and makes
of the answer. :class:`~.lock.Lock` runs the steps on a redis-py client, and
:class:`~celery_redislock.core.aio.AsyncLock` on redis-py's asyncio client: one source for both.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, Self, TypedDict, TypeVar

from ..errors import (
    JobFinished,
    LockConfigError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    LockUpgradeError,
)
from ._validate import finite_real, refuse
from .durations import MAX_PAUSE, TIMEOUT, by_name, seconds, seconds_or_none
from .handover import DEFAULT_HANDOVER_WINDOW, Handover, is_line_token
from .keys import DEFAULT_NAMESPACE, LockKeys, check_name, check_namespace
from .protocol import (
    AcquireArgs,
    AcquireReply,
    AcquireStatus,
    FinishArgs,
    Grant,
    LockSpec,
    Mode,
    NotifyArgs,
    ReleaseArgs,
    ReleaseReply,
    ReleaseWhereArgs,
    Wake,
)
from .replicas import ReplicaPolicy

__all__ = [
    "AwaitPush",
    "ClaimGrant",
    "LeaseBase",
    "LockBase",
    "LockExtras",
    "Step",
    "TryAcquire",
    "check_acquire",
    "check_pause",
    "info_json",
    "not_acquired",
]

# A blocked waiter looks again at least this often: its place in line is refreshed, and a holder
# that died without releasing is noticed even if its lease outlives the push it never sent.
_WAIT_SLICE_S = 1.0
# A waiter's place in line lapses this long after its last refresh (it crashed or went away).
QUEUE_ENTRY_MS = int(_WAIT_SLICE_S * 1000) + 2000
# The shortest blocking pop sent: Redis 6.2 turns a timeout under 1 ms into 0, which blocks
# for ever (it truncates seconds x 1000), and it ends blocking calls on a 100 ms tick anyway.
_MIN_BLOCK_S = 0.01
# A fair-mode wake-up list lives this long if its waiter never pops it.
WAKE_LIST_MS = QUEUE_ENTRY_MS
DEFAULT_FENCE_KEEP = 86400.0
"""Seconds the fence mark outlives a lock's last use: fences stay strictly increasing through a
Redis server clock stepping back by less than this (an NTP step, a VM resume, a failover)."""


class LockExtras(TypedDict, total=False):
    """The keyword arguments of :class:`~.lock.Lock` that most locks leave alone."""

    namespace: str
    """The prefix of the lock's keys (``"redislock"``)."""
    fence_keep: float
    """Seconds the fence mark outlives the lock's last use (:data:`DEFAULT_FENCE_KEEP`)."""
    min_replicas: int | None
    """Replicas that must acknowledge each acquire and renewal (None: the client's policy)."""
    replica_timeout: float | None
    """Seconds to wait for them (0.5 by default)."""
    handover: Handover | None
    """Publishes the parked tasks this lock's calls hand the lock to (:mod:`.line`)."""
    handover_window: float
    """Seconds a published hand-over waits for its task to claim it."""


class StoreBasics(Protocol):
    """What a lock's settings read of its store (a sync or an asyncio one)."""

    @property
    def replicas(self) -> ReplicaPolicy | None: ...

    @property
    def queues(self) -> bool: ...

    def drift(self, ttl: float) -> float: ...

    def max_block(self) -> float: ...


# -- the acquire loop's steps: what it asks of the store, and what comes back ----------------


class TryAcquire(NamedTuple):
    """Run ``acquire.lua`` with ``args`` (and wake whom its answer handed the lock to): the
    :class:`AcquireReply`."""

    args: list[str]


class AwaitPush(NamedTuple):
    """Wait up to ``seconds`` for a push on ``key``: the popped item, or None."""

    key: str
    seconds: float
    tries: int


class ClaimGrant(NamedTuple):
    """Extend the lease a fair waiter was handed (``token``) to the full ttl: its expiry (0:
    lapsed)."""

    token: str


Step = TryAcquire | AwaitPush | ClaimGrant

S = TypeVar("S", bound=StoreBasics)
L = TypeVar("L", bound="LeaseBase[Any]")


def _positive_seconds(value: object, what: str, name: str) -> float:
    """``value`` in seconds, in the range :mod:`celery_redislock.core.durations` gives ``what``."""
    return seconds(value, by_name(what), what, name=name)


class LockBase(Generic[S, L]):
    """A lock's settings and decisions (see the module's docstring); a subclass makes its
    leases (:meth:`new_lease`) and runs the steps on its client."""

    def __init__(
        self,
        store: S,
        name: str,
        *,
        ttl: float,
        mode: Mode,
        limit: int | None,
        fair: bool,
        more: LockExtras,
    ) -> None:
        self.name = name
        self.store = store
        self.replicas: ReplicaPolicy | None = store.replicas
        self.ttl = _positive_seconds(ttl, "ttl", name)
        if mode not in ("read", "write"):
            raise LockConfigError(f"mode must be 'read' or 'write', got {mode!r}", name=name)
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise LockConfigError(
                f"limit must be None or an integer >= 1, got {limit!r}", name=name
            )
        if not isinstance(fair, bool):
            raise LockConfigError(f"fair must be True or False, got {fair!r}", name=name)
        self.mode: Mode = mode
        self.limit = limit
        self.fair = fair
        self.handover = more.get("handover")
        self.handover_window = _positive_seconds(
            more.get("handover_window", DEFAULT_HANDOVER_WINDOW), "handover_window", name
        )
        self.namespace = check_namespace(more.get("namespace", DEFAULT_NAMESPACE))
        self.keys = LockKeys.of(self.namespace, name)
        self.ttl_ms = max(1, round(self.ttl * 1000))
        self.fence_keep = _positive_seconds(
            more.get("fence_keep", DEFAULT_FENCE_KEEP), "fence_keep", name
        )
        # Encoded once: every lock script takes it (``_spec``: the task line's and tests' name).
        # Readers are unbounded unless a limit is given; writers default to one at a time.
        self.spec = self._spec = LockSpec(
            mode=mode,
            limit=limit if limit is not None else (0 if mode == "read" else 1),
            ttl_ms=self.ttl_ms,
            fair=fair,
            entry_ms=QUEUE_ENTRY_MS,
            keep_ms=max(1, round(self.fence_keep * 1000)),
        ).encode()
        # The limit a holder's record carries (see info_json): 0, none, for a lock of one.
        self.info_limit = limit if limit is not None and limit >= 2 else 0
        # A plain mutex may take the fast path (lua/lean_*.lua: its meta and wake keys only).
        self.lean = mode == "write" and limit in (None, 1) and not fair
        self._set_keys()
        # How long a lease is counted on after its acquire was sent.
        self._validity = self.ttl - store.drift(self.ttl)

    def __repr__(self) -> str:
        kind = type(self).__name__
        return f"{kind}({self.name!r}, mode={self.mode!r}, limit={self.limit}, ttl={self.ttl})"

    def named(self, name: str, handover: Handover | None = None) -> Self:
        """This lock's settings under the name ``name`` (checked), with ``handover``: a copy
        that checks and encodes nothing else again. A framework makes each call's lock this
        way from one made per task and settings (see ``core.run.make_lock``).

        >>> lock.named("sync:42").keys.leases   # doctest: +SKIP
        'redislock:{sync:42}:leases'
        """
        other = object.__new__(type(self))  # (copy.copy, without its generic protocol)
        other.__dict__.update(self.__dict__)
        other._rename(check_name(name))
        other.handover = handover
        return other

    def _rename(self, name: str) -> None:
        """Sets what follows from the name (a copy's: see :meth:`named`)."""
        self.name = name
        self._set_keys()

    def _set_keys(self) -> None:
        self.keys = LockKeys.of(self.namespace, self.name)
        self._encoded_keys: list[bytes] | None = None
        # The fast path's KEYS (its meta and wake keys), for a plain mutex.
        prefix = self.keys.prefix
        self.lean_keys = (
            [f"{prefix}:meta".encode(), f"{prefix}:wake".encode()] if self.lean else None
        )

    @property
    def encoded_keys(self) -> list[bytes]:
        """KEYS of every general-path script, encoded once per lock name: when first needed (a
        call's copy on the fast path never needs them)."""
        keys = self._encoded_keys
        if keys is None:
            keys = self._encoded_keys = [key.encode() for key in self.keys.all]
        return keys

    # -- acquiring ---------------------------------------------------------------------------

    def acquire_request(
        self,
        blocking: bool,
        timeout: float | None,
        owner: str | None,
        info: Mapping[str, object] | None,
        reentrant: bool,
        job: str | None,
    ) -> AcquireArgs:
        """An acquire's arguments, checked (:class:`LockConfigError`), with a new token."""
        check_acquire(self.name, blocking, timeout, owner, reentrant, job)
        return AcquireArgs(
            token=os.urandom(16).hex(),
            spec=self.spec,
            wait=blocking and timeout != 0 and self.store.queues,
            once=not reentrant,
            owner=owner,
            info=info_json(info, self.info_limit),
            job=job,
        )

    def acquire_steps(
        self, request: AcquireArgs, blocking: bool, timeout: float | None
    ) -> Generator[Step, Any, L]:
        """The acquire loop: yields what it needs of the store (a :data:`Step`), is sent the
        answer, and returns the lease or raises (:class:`LockNotAcquired`, ...). A driver runs
        each step on its client; it turns a Redis error into :class:`LockBackendError`."""
        owner, job = request.owner, request.job
        deadline = None if timeout is None else time.monotonic() + timeout
        args = request.encode()
        tries = 0
        while True:
            sent = time.monotonic()
            reply: AcquireReply = yield TryAcquire(args)
            status = reply.status
            if status is AcquireStatus.JOB_FINISHED:
                raise JobFinished(
                    f"lock {self.name!r}: job {job!r} is recorded as finished",
                    name=self.name,
                    job=job or "",
                )
            if status is AcquireStatus.HELD:
                return self._lease(
                    reply.token, reply.fence, reply.expires_at_ms, reply.mode, owner, sent
                )
            if status is AcquireStatus.UPGRADE_REFUSED:
                raise LockUpgradeError(
                    f"lock {self.name!r}: owner {owner!r} holds a read lease and asked for write; "
                    "release the read lease first",
                    name=self.name,
                )
            # The owner's own lease refuses it: waiting would wait on itself (or on another
            # copy of its job, which the caller must tell apart), so it is said at once.
            own = reply.ms_left / 1000 if status is AcquireStatus.OWNER_HOLDS else None
            remaining = float("inf") if deadline is None else deadline - time.monotonic()
            if own is not None or not blocking or (remaining <= 0 and not request.wait):
                raise not_acquired(self.name, owner, timeout, own)
            if remaining <= 0:
                # One last try that also leaves the line, still passing on a wake-up it may
                # not use.
                request = request._replace(wait=False)
                args = request.encode()
                continue
            until_expiry = reply.ms_left / 1000 + 0.001 if reply.ms_left > 0 else _WAIT_SLICE_S
            longest = min(_WAIT_SLICE_S, self.store.max_block())
            block = max(_MIN_BLOCK_S, min(remaining, longest, until_expiry))
            if self.fair:
                # Fair: waits to be handed the lock, with a short lease (as long as a place in
                # line lasts), then claims the full ttl; too late (paused for seconds): the
                # next try queues again.
                popped = yield AwaitPush(self.keys.waiter(request.token), block, 0)
                if popped is None:
                    continue
                sent = time.monotonic()
                wake = Wake.decode(popped)
                if wake.fence == 0:
                    # Woken with no lease: its owner holds one already (another call of the
                    # same owner was served first); the next try re-enters it, or is refused.
                    continue
                claimed: int = yield ClaimGrant(request.token)
                if claimed:
                    return self._lease(request.token, wake.fence, claimed, self.mode, owner, sent)
                continue
            # Non-fair: a wake-up that comes is passed on by the next try if it cannot use it.
            woke = (yield AwaitPush(self.keys.all[4], block, tries)) is not None
            tries += 1
            if woke != request.woke:
                request = request._replace(woke=woke)
                args = request.encode()

    def _lease(
        self, token: str, fence: int, expiry_ms: int, mode: Mode, owner: str | None, sent: float
    ) -> L:
        return self.new_lease(token, fence, mode, owner, expiry_ms, sent + self._validity)

    def new_lease(
        self, token: str, fence: int, mode: Mode, owner: str | None, expiry_ms: int, valid: float
    ) -> L:
        """A lease of this lock (``valid``: its :attr:`LeaseBase.valid_until`)."""
        raise NotImplementedError

    def notify_args(self, granted: Sequence[Grant]) -> tuple[list[str], list[str]] | None:
        """``notify.lua``'s keys and args waking the fair waiters in ``granted`` (parked
        tasks left out), or None if there is none."""
        waiters = [g for g in granted if not is_line_token(g.token)]
        if not waiters:
            return None
        keys = [self.keys.waiter(g.token) for g in waiters]
        return keys, NotifyArgs(list_ms=WAKE_LIST_MS, grants=waiters).encode()

    # -- releasing ---------------------------------------------------------------------------

    def release_args(
        self, lease: LeaseBase[Any], finish_job: str | None, keep: float | None
    ) -> list[str]:
        """``release.lua``'s args giving back one level of ``lease``, checked first
        (:class:`LockNotOwned`: not this lock's, or released already)."""
        if lease.lock is not self and lease.lock.keys != self.keys:
            raise LockNotOwned(
                f"lease {lease.token} belongs to lock {lease.name!r} in namespace "
                f"{lease.lock.namespace!r}, not to lock {self.name!r} in namespace "
                f"{self.namespace!r}",
                name=self.name,
                token=lease.token,
            )
        if lease.released:
            raise LockNotOwned(
                f"lease {lease.token} of lock {self.name!r} is not held (released already)",
                name=self.name,
                token=lease.token,
            )
        return ReleaseArgs(
            token=lease.token,
            spec=self.spec,
            whole=False,
            request=os.urandom(8).hex(),
            finish=None if finish_job is None else self.finish_args(finish_job, keep),
        ).encode()

    def released(self, lease: LeaseBase[Any], reply: ReleaseReply) -> None:
        """Marks ``lease`` by a release's ``reply``; :class:`LockNotOwned` if it was not held."""
        if not reply.released:
            lease.released = True
            raise LockNotOwned(
                f"lease {lease.token} of lock {self.name!r} is not held (expired or released)",
                name=self.name,
                token=lease.token,
            )
        if reply.left == 0:
            lease.released = True

    def release_where_args(self, match: Mapping[str, object]) -> list[str]:
        """``release_where.lua``'s args for leases whose info matches all of ``match``."""
        if not match:
            raise LockConfigError(
                "release_where needs at least one field to match (e.g. task_id=..., pid=...)",
                name=self.name,
            )
        fields = json.dumps({k: str(v) for k, v in match.items()})
        return ReleaseWhereArgs(self.spec, fields, os.urandom(8).hex(), ()).encode()

    def release_tokens_args(self, tokens: Sequence[str]) -> list[str] | None:
        """``release_where.lua``'s args for the leases ``tokens`` (None: no token given)."""
        if isinstance(tokens, str) or not all(isinstance(t, str) and t for t in tokens):
            raise LockConfigError(
                f"tokens must be a sequence of non-empty strings, got {tokens!r}", name=self.name
            )
        if not tokens:
            return None
        return ReleaseWhereArgs(self.spec, "{}", os.urandom(8).hex(), tokens).encode()

    def finish_args(self, job: str, keep: float | None) -> FinishArgs:
        """``finish.lua``'s arguments recording ``job`` finished for ``keep`` seconds."""
        if not isinstance(job, str) or not job or " " in job:
            raise LockConfigError(
                f"job must be a non-empty string without spaces, got {job!r}", name=self.name
            )
        keep_ms = round(_positive_seconds(keep, "keep", self.name) * 1000)
        return FinishArgs(job=job, keep_ms=keep_ms)

    _finish_args = finish_args


def check_acquire(
    name: str,
    blocking: bool,
    timeout: float | None,
    owner: str | None,
    reentrant: bool,
    job: str | None,
) -> None:
    """The arguments of an acquire (:meth:`Lock.acquire`, ``acquire_all``), checked before
    anything is sent: :class:`LockConfigError` naming the lock ``name`` and what was wrong."""
    if timeout is not None:
        seconds_or_none(timeout, TIMEOUT, "timeout", name=name)  # no inf, NaN, > 1 day
        if not blocking:
            raise LockConfigError("timeout makes no sense with blocking=False", name=name)
    if owner is not None and (not isinstance(owner, str) or not owner):
        raise LockConfigError(f"owner must be a non-empty string, got {owner!r}", name=name)
    if not isinstance(reentrant, bool):
        raise LockConfigError(f"reentrant must be True or False, got {reentrant!r}", name=name)
    if job is not None and (not isinstance(job, str) or not job or " " in job):
        raise LockConfigError(
            f"job must be None or a non-empty string without spaces, got {job!r}", name=name
        )


def not_acquired(
    name: str, owner: str | None, timeout: float | None, own: float | None
) -> LockNotAcquired:
    """The refusal of an acquire of the lock ``name``: held by others (``timeout``: after
    waiting that long), or by ``owner`` itself (``own``: the seconds its lease has left)."""
    return LockNotAcquired(
        f"lock {name!r} is held"
        + (f" by owner {owner!r} already" if own is not None else "")
        + (f" (gave up after {timeout}s)" if timeout and own is None else ""),
        name=name,
        timeout=timeout,
        owner_expires_in=own,
    )


def check_pause(seconds: object, name: str) -> int:
    """``seconds`` of a lock's pause in ms; raises :class:`LockConfigError` naming the lock
    unless it is a finite number above 0 and at most 30 days (a rate limit's longest pause)."""
    number = finite_real(seconds)
    if number is None or not 0 < number <= MAX_PAUSE:
        raise refuse(
            f"lock {name!r}: pause",
            f"a number of seconds from 0 to {MAX_PAUSE:g}",
            seconds,
            name=name,
        )
    return max(1, round(number * 1000))


# -- leases ------------------------------------------------------------------------------------


class _LockOfLease(Protocol):
    """What a lease reads of its lock."""

    name: str
    keys: LockKeys
    namespace: str


K = TypeVar("K", bound=_LockOfLease)


@dataclass(eq=False)
class LeaseBase(Generic[K]):
    """A held lease, whatever client its lock runs on (see :class:`~.lock.Lease`)."""

    lock: K
    token: str
    fence: int
    mode: Mode
    owner: str | None
    expires_at_ms: int
    """Server time (ms since the epoch) at which the lease lapses unless renewed."""
    valid_until: float = field(repr=False)
    """Local ``time.monotonic()`` by which the lease is certainly still held if not lost (over
    a quorum: the end of its validity, ``ttl - elapsed - drift`` from its acquire or renewal)."""
    lost: bool = field(default=False, repr=False)
    released: bool = field(default=False, repr=False)

    @property
    def name(self) -> str:
        return self.lock.name

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
            raise self._lost()

    def _lost(self) -> LockLost:
        return LockLost(
            f"lease {self.token} of lock {self.name!r} was lost", name=self.name, token=self.token
        )


# -- the holder's record -----------------------------------------------------------------------

_HOST = socket.gethostname()
_DEFAULT_INFO: dict[int, str] = {}


def info_json(info: Mapping[str, object] | None, limit: int = 0) -> str:
    """The holder record stored with a lease: host and pid, then what ``info`` says; and a
    ``limit`` of 2 or more (a lock's limit lives in its callers, not in Redis: the record lets
    the CLI and the web view say "2 of 5")."""
    pid = os.getpid()
    if limit >= 2:
        info = {**(info or {}), "limit": limit}
    if not info:
        # Made once per process (a forked child has its own pid, so its own record).
        made = _DEFAULT_INFO.get(pid)
        if made is None:
            made = _DEFAULT_INFO[pid] = json.dumps({"host": _HOST, "pid": str(pid)})
        return made
    record = {"host": _HOST, "pid": str(pid)}
    record.update({str(k): str(v) for k, v in info.items()})
    return json.dumps(record)
