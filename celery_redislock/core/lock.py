"""The lock and its leases: a set of leases in a store (one Redis server, or a quorum of
masters), taken and given back by Lua scripts, each operation written once here (over 300
lines: a lock makes leases, a lease gives itself back to its lock, and the batch renewal).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Unpack

import redis
from redis.cluster import RedisCluster

from ..errors import LockBackendError, LockConfigError, RedisLockError
from .durations import TTL, seconds
from .handover import hand_over, is_line_token
from .keys import check_name
from .lock_base import (
    DEFAULT_FENCE_KEEP,
    AwaitPush,
    ClaimGrant,
    LeaseBase,
    LockBase,
    LockExtras,
    TryAcquire,
    check_acquire,
    check_pause,
)
from .protocol import AcquireArgs, AcquireReply, Grant, LimitsReply, Mode, ReleaseClaimReply
from .replicas import check_policy, policy_of
from .scripts import run
from .server_store import ServerStore
from .store import Holder, RedisClient, Store, backend_error, backend_errors

__all__ = [
    "DEFAULT_FENCE_KEEP",
    "Lease",
    "Lock",
    "LockExtras",
    "RenewReport",
    "check_acquire",
    "check_pause",
    "renew_leases",
]

log = logging.getLogger(__name__)


class Lock(LockBase[Store, "Lease"]):
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
        name = check_name(name)
        if more and not more.keys() <= LockExtras.__optional_keys__:
            unknown = min(more.keys() - LockExtras.__optional_keys__)
            raise TypeError(f"Lock() got an unexpected keyword argument {unknown!r}")
        store = _store_of(client, more, name)
        super().__init__(store, name, ttl=ttl, mode=mode, limit=limit, fair=fair, more=more)
        self.client = store.client

    def _rename(self, name: str) -> None:
        super()._rename(name)
        self.__dict__.pop("_entered", None)  # (a copy's leases entered with `with` are its own)

    @property
    def _entered(self) -> threading.local:
        """Each thread's leases entered with ``with`` (made at the first: most locks, a task
        run's among them, are never entered so)."""
        entered = self.__dict__.get("_entered")
        if entered is None:  # (setdefault: two threads at once keep one)
            entered = self.__dict__.setdefault("_entered", threading.local())
        return entered  # type: ignore[no-any-return]

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
        request = self.acquire_request(blocking, timeout, owner, info, reentrant, job)
        try:
            return self._acquire(request, blocking, timeout)
        except LockBackendError:
            self._abandon(request.token)
            raise

    def acquire_giving_up(
        self,
        give_up: str,
        blocking: bool,
        timeout: float | None,
        *,
        owner: str,
        info: Mapping[str, object] | None,
        job: str | None,
    ) -> tuple[Lease, ReleaseClaimReply | None]:
        """:meth:`acquire` with ``reentrant=False``, for a run whose unique claim (``owner``'s,
        on the key named like this lock) ends as its lease is taken: in the same call where it
        can (a plain mutex on one server, in the lean layout, without a job), ``give_up`` as
        ``AcquireArgs.give_up``. Returns the lease and how the claim ended (None: untouched,
        for the caller to end)."""
        request = self.acquire_request(blocking, timeout, owner, info, False, job)
        store = self.store
        if not job and isinstance(store, ServerStore) and store.gives_up_claims(self):
            request = request._replace(give_up=give_up)
        ended: list[ReleaseClaimReply | None] = [None]
        try:
            return self._acquire(request, blocking, timeout, ended), ended[0]
        except LockBackendError:
            self._abandon(request.token)
            raise

    def _acquire(
        self,
        request: AcquireArgs,
        blocking: bool,
        timeout: float | None,
        ended: list[ReleaseClaimReply | None] | None = None,
    ) -> Lease:
        """Runs :meth:`acquire_steps` on the store (``ended``: where the last reply's
        ``gave_up`` goes)."""
        steps = self.acquire_steps(request, blocking, timeout)
        store = self.store
        step = next(steps)
        try:
            while True:
                # (try/except, not the backend_errors context manager: this is the hot path)
                try:
                    if type(step) is TryAcquire:
                        reply = store.acquire(self, step.args)
                        self._notify(reply.granted)
                        if ended is not None:
                            ended[0] = reply.gave_up
                        step = steps.send(reply)
                    elif type(step) is AwaitPush:
                        step = steps.send(
                            store.await_push(self, step.key, step.seconds, step.tries)
                        )
                    elif isinstance(step, ClaimGrant):
                        step = steps.send(store.claim(self, step.token))
                except redis.RedisError as exc:
                    raise backend_error(self.name, exc) from exc
        except StopIteration as done:
            lease: Lease = done.value
            return lease

    def new_lease(
        self, token: str, fence: int, mode: Mode, owner: str | None, expiry_ms: int, valid: float
    ) -> Lease:
        return Lease(self, token, fence, mode, owner, expiry_ms, valid)

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

    def _notify(self, granted: Sequence[Grant]) -> None:
        """Wakes the fair-mode waiters a script just handed the lock to, and publishes the
        parked tasks it handed the lock to."""
        if not granted:
            return
        parked = [g for g in granted if is_line_token(g.token)]
        if parked:
            hand_over(self, parked)
        notify = self.notify_args(granted)
        if notify is not None:
            run("notify", self.client, notify[0], notify[1])

    # -- releasing ---------------------------------------------------------------------------

    def release(
        self, lease: Lease, *, finish_job: str | None = None, keep: float | None = None
    ) -> None:
        """Releases ``lease`` (one re-entry level). Raises :class:`LockNotOwned` if not held
        (over a quorum: unless a majority released it). ``finish_job``/``keep``: see
        :meth:`Lease.release`."""
        args = self.release_args(lease, finish_job, keep)
        try:
            reply = self.store.release(self, args)
            self._notify(reply.granted)
        except redis.RedisError as exc:
            raise backend_error(self.name, exc) from exc
        self.released(lease, reply)

    def release_where(self, **match: object) -> list[str]:
        """Releases every lease whose recorded info matches all of ``match``, e.g.
        ``lock.release_where(task_id="…", pid="4242")``; returns the released tokens.

        This is how a supervising process frees what a killed worker held.
        """
        return self._release_where(self.release_where_args(match))

    def release_tokens(self, tokens: Sequence[str]) -> list[str]:
        """Releases the leases ``tokens``, each whatever its re-entry count, and hands the lock
        on as :meth:`release_where` does; returns the tokens of those that were live. This is
        how an operator frees the leases of a holder that is stuck or gone
        (:func:`~celery_redislock.core.admin.force_release`).

        >>> lock.release_tokens(["4ae20de475d793086c92d6ff5cb7a8a6"])   # doctest: +SKIP
        ['4ae20de475d793086c92d6ff5cb7a8a6']
        """
        args = self.release_tokens_args(tokens)
        return [] if args is None else self._release_where(args)

    def _release_where(self, args: list[str]) -> list[str]:
        with backend_errors(self.name):
            reply = self.store.release_where(self, args)
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
            self.store.finish(self, self.finish_args(job, keep).encode())

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
class Lease(LeaseBase[Lock]):
    """A held lease. Release it (or leave a ``with`` block) to give the lock back.

    ``fence`` grows strictly with every acquisition of the lock's name: pass it along with
    writes so a store can refuse a write from a holder whose lease has since been lost.

    >>> with lock.acquire() as lease:          # doctest: +SKIP
    ...     store.write(data, fence=lease.fence)
    """

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
