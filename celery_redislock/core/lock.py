"""The lock and its leases: a set of leases in a store (one Redis server, or a quorum of
masters), taken and given back by Lua scripts, each operation written once here (over 300
lines: a lock makes leases, a lease gives itself back to its lock, and the batch renewal).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TypedDict, Unpack

import redis
from redis.cluster import RedisCluster

from ..errors import (
    JobFinished,
    LockBackendError,
    LockConfigError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    LockUpgradeError,
    RedisLockError,
)
from ._validate import finite_real, refuse
from .durations import MAX_PAUSE, TIMEOUT, TTL, by_name, seconds, seconds_or_none
from .handover import DEFAULT_HANDOVER_WINDOW, Handover, hand_over, is_line_token
from .keys import DEFAULT_NAMESPACE, LockKeys, check_name, check_namespace
from .protocol import (
    AcquireArgs,
    AcquireReply,
    AcquireStatus,
    FinishArgs,
    Grant,
    LimitsReply,
    LockSpec,
    Mode,
    NotifyArgs,
    ReleaseArgs,
    ReleaseWhereArgs,
    Wake,
)
from .replicas import ReplicaPolicy, check_policy, policy_of
from .scripts import run
from .server_store import ServerStore
from .store import Holder, RedisClient, Store, backend_error, backend_errors

__all__ = ["DEFAULT_FENCE_KEEP", "Lease", "Lock", "LockExtras", "RenewReport", "renew_leases"]

log = logging.getLogger(__name__)

# A blocked waiter looks again at least this often: its place in line is refreshed, and a holder
# that died without releasing is noticed even if its lease outlives the push it never sent.
_WAIT_SLICE_S = 1.0
# A waiter's place in line lapses this long after its last refresh (it crashed or went away).
_QUEUE_ENTRY_MS = int(_WAIT_SLICE_S * 1000) + 2000
# The shortest blocking pop sent: Redis 6.2 turns a timeout under 1 ms into 0, which blocks
# for ever (it truncates seconds x 1000), and it ends blocking calls on a 100 ms tick anyway.
_MIN_BLOCK_S = 0.01
# A fair-mode wake-up list lives this long if its waiter never pops it.
_WAKE_LIST_MS = _QUEUE_ENTRY_MS
DEFAULT_FENCE_KEEP = 86400.0
"""Seconds the fence mark outlives a lock's last use: fences stay strictly increasing through a
Redis server clock stepping back by less than this (an NTP step, a VM resume, a failover)."""


class LockExtras(TypedDict, total=False):
    """The keyword arguments of :class:`Lock` that most locks leave alone."""

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


def _positive_seconds(value: object, what: str, name: str) -> float:
    """``value`` in seconds, in the range :mod:`celery_redislock.core.durations` gives ``what``."""
    return seconds(value, by_name(what), what, name=name)


class Lock:
    """A named lock made of leases: a mutex, a cap of N holders, or a read/write lock.

    ``mode="write"`` (the default) holders exclude every reader and are at most ``limit`` at once
    (``limit=None`` means 1: a mutex). ``mode="read"`` holders share with each other (at most
    ``limit`` when given) and are excluded by any writer; a queued writer is not starved by new
    readers. ``fair=True`` serves waiters strictly in arrival order, handing the lock over
    directly on release. The rarer settings are :class:`LockExtras`: ``min_replicas=n`` makes
    each acquire and renewal wait (at most ``replica_timeout`` seconds) until ``n`` replicas
    acknowledged it, and fail closed otherwise (see :mod:`celery_redislock.core.replicas`).

    ``client`` is a Redis client (plain, Sentinel-managed or a Cluster), or a
    :class:`~celery_redislock.core.store.Store` (:class:`~.redlock.RedLock` passes a quorum of
    masters).

    >>> lock = Lock(redis.Redis(), "nightly-report", ttl=30)   # doctest: +SKIP
    >>> with lock.acquire(timeout=5) as lease:                  # doctest: +SKIP
    ...     print(lease.fence)
    """

    def __init__(
        self,
        client: RedisClient | Store,
        name: str,
        *,
        ttl: float,
        mode: Mode = "write",
        limit: int | None = None,
        fair: bool = False,
        **more: Unpack[LockExtras],
    ) -> None:
        self.name = check_name(name)
        if more and not more.keys() <= LockExtras.__optional_keys__:
            unknown = min(more.keys() - LockExtras.__optional_keys__)
            raise TypeError(f"Lock() got an unexpected keyword argument {unknown!r}")
        self.store = _store_of(client, more, self.name)
        self.client = self.store.client
        self.replicas: ReplicaPolicy | None = self.store.replicas
        self.ttl = _positive_seconds(ttl, "ttl", self.name)
        if mode not in ("read", "write"):
            raise LockConfigError(f"mode must be 'read' or 'write', got {mode!r}", name=self.name)
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise LockConfigError(
                f"limit must be None or an integer >= 1, got {limit!r}", name=self.name
            )
        if not isinstance(fair, bool):
            raise LockConfigError(f"fair must be True or False, got {fair!r}", name=self.name)
        self.mode: Mode = mode
        self.limit = limit
        self.fair = fair
        self.handover = more.get("handover")
        self.handover_window = _positive_seconds(
            more.get("handover_window", DEFAULT_HANDOVER_WINDOW), "handover_window", self.name
        )
        self.namespace = check_namespace(more.get("namespace", DEFAULT_NAMESPACE))
        self.keys = LockKeys.of(self.namespace, self.name)
        self.ttl_ms = max(1, round(self.ttl * 1000))
        self.fence_keep = _positive_seconds(
            more.get("fence_keep", DEFAULT_FENCE_KEEP), "fence_keep", self.name
        )
        # Encoded once: every lock script takes it (``_spec``: the task line's and tests' name).
        # Readers are unbounded unless a limit is given; writers default to one at a time.
        self.spec = self._spec = LockSpec(
            mode=mode,
            limit=limit if limit is not None else (0 if mode == "read" else 1),
            ttl_ms=self.ttl_ms,
            fair=fair,
            entry_ms=_QUEUE_ENTRY_MS,
            keep_ms=max(1, round(self.fence_keep * 1000)),
        ).encode()
        # KEYS of every lock script, encoded once (the hot path).
        self.encoded_keys = [key.encode() for key in self.keys.all]
        self._entered = threading.local()
        # How long a lease is counted on after its acquire was sent.
        self._validity = self.ttl - self.store.drift(self.ttl)

    def __repr__(self) -> str:
        return f"Lock({self.name!r}, mode={self.mode!r}, limit={self.limit}, ttl={self.ttl})"

    # -- acquiring ---------------------------------------------------------------------------

    def acquire(
        self,
        blocking: bool = True,
        timeout: float | None = None,
        *,
        owner: str | None = None,
        info: Mapping[str, object] | None = None,
        reentrant: bool = True,
        job: str | None = None,
    ) -> Lease:
        """Takes a lease and returns it; raises :class:`LockNotAcquired` when it cannot.

        ``blocking=False`` tries once. Otherwise waits up to ``timeout`` seconds (``None``: for
        as long as it takes), woken by a push when the lock is released (over a quorum of
        masters, which push nothing, by tries at random pauses of up to 0.2 s). ``owner`` makes
        the lease re-entrant: the same owner acquiring again gets the same lease back with its
        count raised, and must release as many times. ``info`` is stored with the lease (for
        :meth:`holders` and :meth:`release_where`); host and pid are always recorded.
        ``reentrant=False`` makes ``owner`` an identity that holds at most one lease at a time:
        while it holds one, acquiring again raises :class:`LockNotAcquired` at once, even when
        blocking, with ``owner_expires_in`` set to the time that lease has left.
        ``job`` names the unit of work this lease is for: if :meth:`finish_job` recorded it as
        finished, :class:`JobFinished` is raised instead (a redelivered message that already ran).

        Lost replies: the token is chosen here, so a call redis-py sends again returns the lease
        the first run made. If the call fails with :class:`LockBackendError`, the lease it may
        have made is dropped before the error reaches the caller (or, with Redis unreachable,
        lapses within ``ttl``).
        """
        check_acquire(self.name, blocking, timeout, owner, reentrant, job)
        request = AcquireArgs(
            token=os.urandom(16).hex(),
            spec=self.spec,
            wait=blocking and timeout != 0 and self.store.queues,
            once=not reentrant,
            owner=owner,
            info=_info_json(info),
            job=job,
        )
        try:
            return self._acquire(request, blocking, timeout)
        except LockBackendError:
            self._abandon(request.token)
            raise

    def _acquire(self, request: AcquireArgs, blocking: bool, timeout: float | None) -> Lease:
        owner, job = request.owner, request.job
        deadline = None if timeout is None else time.monotonic() + timeout
        args = request.encode()
        tries = 0
        while True:
            sent = time.monotonic()
            # (try/except, not the backend_errors context manager: this is the hot path)
            try:
                reply = self.store.acquire(self, args)
                self._notify(reply.granted)
            except redis.RedisError as exc:
                raise backend_error(self.name, exc) from exc
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
                raise LockNotAcquired(
                    f"lock {self.name!r} is held"
                    + (f" by owner {owner!r} already" if own is not None else "")
                    + (f" (gave up after {timeout}s)" if timeout and own is None else ""),
                    name=self.name,
                    timeout=timeout,
                    owner_expires_in=own,
                )
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
                lease = self._await_grant(block, request.token, owner)
                if lease is not None:
                    return lease
                continue
            # Non-fair: a wake-up that comes is passed on by the next try if it cannot use it.
            woke = self.store.await_push(self, self.keys.all[4], block, tries) is not None
            tries += 1
            if woke != request.woke:
                request = request._replace(woke=woke)
                args = request.encode()

    def _run_acquire(self, args: list[str]) -> AcquireReply:
        """``acquire.lua`` on the store (the task line's park calls it too)."""
        return self.store.acquire(self, args)

    def _abandon(self, token: str) -> None:
        """After a failed call that may have run: drop the lease it may have made for ``token``
        (best effort; if Redis is still unreachable the lease lapses within its ttl)."""
        try:
            self.store.abandon(self, token)
        except redis.RedisError as exc:
            log.warning(
                "lock %r: could not drop the lease a failed acquire may have made (it lapses "
                "within %ss): %s",
                self.name,
                self.ttl,
                exc,
            )

    def _await_grant(self, seconds: float, token: str, owner: str | None) -> Lease | None:
        """Fair: waits up to ``seconds`` to be handed the lock; the lease if it was."""
        popped = self.store.await_push(self, self.keys.waiter(token), seconds, 0)
        if popped is None:
            return None
        # Handed over with a short lease (as long as a place in line lasts): claim the full
        # ttl. Too late (paused for seconds): the next try queues again.
        sent = time.monotonic()
        wake = Wake.decode(popped)
        if wake.fence == 0:
            # Woken with no lease: its owner holds one already (another call of the same
            # owner was served first); the next try re-enters it, or is refused.
            return None
        claimed = self.store.claim(self, token)
        return self._lease(token, wake.fence, claimed, self.mode, owner, sent) if claimed else None

    def _lease(
        self, token: str, fence: int, expiry_ms: int, mode: Mode, owner: str | None, sent: float
    ) -> Lease:
        return Lease(
            lock=self,
            token=token,
            fence=fence,
            mode=mode,
            owner=owner,
            expires_at_ms=expiry_ms,
            valid_until=sent + self._validity,
        )

    def _notify(self, granted: Sequence[Grant]) -> None:
        """Wakes the fair-mode waiters a script just handed the lock to, and publishes the
        parked tasks it handed the lock to."""
        if not granted:
            return
        parked = [g for g in granted if is_line_token(g.token)]
        if parked:
            hand_over(self, parked)
            granted = [g for g in granted if not is_line_token(g.token)]
            if not granted:
                return
        run(
            "notify",
            self.client,
            [self.keys.waiter(g.token) for g in granted],
            NotifyArgs(list_ms=_WAKE_LIST_MS, grants=granted).encode(),
        )

    # -- releasing ---------------------------------------------------------------------------

    def release(
        self, lease: Lease, *, finish_job: str | None = None, keep: float | None = None
    ) -> None:
        """Releases ``lease`` (one re-entry level). Raises :class:`LockNotOwned` if not held
        (over a quorum: unless a majority released it). ``finish_job``/``keep``: see
        :meth:`Lease.release`."""
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
        request = ReleaseArgs(
            token=lease.token,
            spec=self.spec,
            whole=False,
            request=os.urandom(8).hex(),
            finish=None if finish_job is None else self._finish_args(finish_job, keep),
        )
        try:
            reply = self.store.release(self, request.encode())
            self._notify(reply.granted)
        except redis.RedisError as exc:
            raise backend_error(self.name, exc) from exc
        if not reply.released:
            lease.released = True
            raise LockNotOwned(
                f"lease {lease.token} of lock {self.name!r} is not held (expired or released)",
                name=self.name,
                token=lease.token,
            )
        if reply.left == 0:
            lease.released = True

    def release_where(self, **match: object) -> list[str]:
        """Releases every lease whose recorded info matches all of ``match``, e.g.
        ``lock.release_where(task_id="…", pid="4242")``; returns the released tokens.

        This is how a supervising process frees what a killed worker held.
        """
        if not match:
            raise LockConfigError(
                "release_where needs at least one field to match (e.g. task_id=..., pid=...)",
                name=self.name,
            )
        return self._release_where(json.dumps({k: str(v) for k, v in match.items()}))

    def release_tokens(self, tokens: Sequence[str]) -> list[str]:
        """Releases the leases ``tokens``, each whatever its re-entry count, and hands the lock
        on as :meth:`release_where` does; returns the tokens of those that were live. This is
        how an operator frees the leases of a holder that is stuck or gone
        (:func:`~celery_redislock.core.admin.force_release`).

        >>> lock.release_tokens(["4ae20de475d793086c92d6ff5cb7a8a6"])   # doctest: +SKIP
        ['4ae20de475d793086c92d6ff5cb7a8a6']
        """
        if isinstance(tokens, str) or not all(isinstance(t, str) and t for t in tokens):
            raise LockConfigError(
                f"tokens must be a sequence of non-empty strings, got {tokens!r}", name=self.name
            )
        if not tokens:
            return []
        return self._release_where("{}", tokens)

    def _release_where(self, match: str, tokens: Sequence[str] = ()) -> list[str]:
        request = ReleaseWhereArgs(self.spec, match, os.urandom(8).hex(), tokens)
        with backend_errors(self.name):
            reply = self.store.release_where(self, request.encode())
            self._notify(reply.granted)
        return list(reply.released)

    def finish_job(self, job: str, keep: float) -> None:
        """Records that ``job`` finished under this lock, for ``keep`` seconds: meanwhile an
        ``acquire(job=job)`` raises :class:`JobFinished` instead of taking a lease. This is how
        a second delivery of a message whose first delivery ran (its ack was lost) is told
        apart from one that must still run.

        >>> lock.finish_job("task-id.0", keep=3600)   # doctest: +SKIP
        """
        with backend_errors(self.name):
            self.store.finish(self, self._finish_args(job, keep).encode())

    def _finish_args(self, job: str, keep: float | None) -> FinishArgs:
        if not isinstance(job, str) or not job or " " in job:
            raise LockConfigError(
                f"job must be a non-empty string without spaces, got {job!r}", name=self.name
            )
        keep_ms = round(_positive_seconds(keep, "keep", self.name) * 1000)
        return FinishArgs(job=job, keep_ms=keep_ms)

    # -- pausing -----------------------------------------------------------------------------

    def pause(self, seconds: float) -> float:
        """Hands out no new lease of this lock's name for ``seconds`` from now, on any worker
        (after an upstream 429, say): acquires are refused or wait, tasks do what their
        ``on_conflict`` says, the task line holds its tasks; leases held go on. A longer pause
        already set is kept; up to 30 days. Answers the seconds the pause has left.
        ``core.admin.resume_lock`` (or ``redislock resume NAME``) ends it early.

        >>> Lock(client, "partner-api", ttl=30, limit=5).pause(60)   # doctest: +SKIP
        60.0
        """
        return self._limits("p", str(check_pause(seconds, self.name)))

    def paused_for(self) -> float:
        """Seconds left of this lock's pause (0: not paused)."""
        return self._limits("r")

    def _limits(self, *args: str) -> float:
        if not isinstance(self.store, ServerStore):
            raise LockConfigError(
                "a pause lives on one Redis server: a lock over a quorum of masters (RedLock) "
                "cannot be paused",
                name=self.name,
            )
        with backend_errors(self.name):
            raw = run("limits", self.client, self.encoded_keys, list(args))
        return LimitsReply.decode(raw).lock_paused_for

    # -- inspecting --------------------------------------------------------------------------

    def holders(self) -> list[Holder]:
        """The live leases of this lock's name, oldest fence first (over a quorum: those a
        majority holds, ``expires_in`` how long a majority still has each)."""
        with backend_errors(self.name):
            return self.store.holders(self)

    def locked(self) -> bool:
        """Whether any live lease exists on this lock's name."""
        return bool(self.holders())

    # -- context manager ---------------------------------------------------------------------

    def __enter__(self) -> Lease:
        lease = self.acquire()
        stack = self._entered.__dict__.setdefault("stack", [])
        stack.append(lease)
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease: Lease = self._entered.stack.pop()
        lease.__exit__(exc_type, exc, tb)


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


def _store_of(client: RedisClient | Store, more: LockExtras, name: str) -> Store:
    """The store a lock's ``client`` argument names: one server's (with the replica policy
    ``min_replicas`` sets, else the client's), or the store given."""
    min_replicas = more.get("min_replicas")
    if isinstance(client, redis.Redis | RedisCluster):
        replicas = (
            policy_of(client)
            if min_replicas is None
            else check_policy(min_replicas, more.get("replica_timeout"), name=name)
        )
        return ServerStore(client, replicas if replicas is not None and replicas.count else None)
    if isinstance(client, Store):
        if min_replicas:
            raise LockConfigError("min_replicas applies to a Redis client, not a store", name=name)
        return client
    raise LockConfigError(
        f"client must be a redis.Redis or redis.cluster.RedisCluster, got {type(client).__name__}",
        name=name,
    )


# -- leases ------------------------------------------------------------------------------------


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
    """Local ``time.monotonic()`` by which the lease is certainly still held if not lost (over
    a quorum: the end of its validity, ``ttl - elapsed - drift`` from its acquire or renewal)."""
    lost: bool = field(default=False, repr=False)
    released: bool = field(default=False, repr=False)

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

    def pause(self, seconds: float) -> float:
        """Pauses this lease's lock for ``seconds`` (see :meth:`Lock.pause`): no new lease on
        any worker meanwhile; this one goes on. Answers the seconds the pause has left.

        >>> current_lease().pause(60)   # doctest: +SKIP
        """
        return self.lock.pause(seconds)

    def renew(self, ttl: float | None = None) -> None:
        """Extends the lease to ``ttl`` seconds from now (default: the lock's ttl); a lease that
        already runs longer is left as it is (renewal never shortens).

        Raises :class:`LockLost` if the lease had already lapsed or was removed.
        """
        if renew_leases([self], ttl=ttl).lost:
            raise self._lost()

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

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # A failed release raises on a clean exit, but never hides the exception the body
        # raised (it is logged instead, as redis-py's Lock does).
        if self.released:
            return
        try:
            self.release()
        except RedisLockError as error:
            if exc is None:
                raise
            log.warning(
                "lock %r: release after the block raised %r failed: %s", self.name, exc, error
            )


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
    removed is reported in ``lost`` and marked ``lease.lost``; it is never revived. Over a
    quorum of masters, a lease is renewed if a majority renewed it within its validity;
    :class:`LockBackendError` if too few masters answered for some (after applying the rest).
    """
    if ttl is not None:
        ttl = seconds(ttl, TTL, "ttl")
    renewed: list[Lease] = []
    lost: list[Lease] = []
    unknown: list[Lease] = []
    why = ""
    by_store: dict[object, list[Lease]] = {}
    for lease in leases:
        by_store.setdefault(lease.lock.store.key, []).append(lease)
    for group in by_store.values():
        got = group[0].lock.store.renew(group, ttl)
        for i, (lease, expiry, valid_until) in enumerate(
            zip(group, got.expiries, got.valid_until, strict=True)
        ):
            if expiry > 0:
                lease.expires_at_ms = expiry
                lease.valid_until = valid_until
                renewed.append(lease)
            elif expiry == 0:
                lease.lost = True
                lost.append(lease)
            else:
                unknown.append(lease)
                why = (got.why and got.why[i]) or why
    if unknown:
        names = {lease.name for lease in unknown}
        raise LockBackendError(f"renewal: {why}", name=names.pop() if len(names) == 1 else None)
    return RenewReport(renewed, lost)


# -- the holder's record -----------------------------------------------------------------------

_HOST = socket.gethostname()


@functools.lru_cache(maxsize=1)
def _default_info(pid: int) -> str:
    """The record of a lease acquired with no ``info``: host and pid (made once per process)."""
    return json.dumps({"host": _HOST, "pid": str(pid)})


def _info_json(info: Mapping[str, object] | None) -> str:
    if not info:
        return _default_info(os.getpid())
    record = {"host": _HOST, "pid": str(os.getpid())}
    record.update({str(k): str(v) for k, v in info.items()})
    return json.dumps(record)
