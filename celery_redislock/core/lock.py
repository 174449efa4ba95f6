"""The lock: a set of leases in Redis, taken and given back by Lua scripts in one round trip.

Over 300 lines: one class, whose methods each wrap one script (:mod:`.protocol` types the calls).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType

import redis
from redis.cluster import RedisCluster

from ..errors import (
    JobFinished,
    LockBackendError,
    LockConfigError,
    LockNotAcquired,
    LockNotOwned,
    LockUpgradeError,
)
from .durations import by_name, seconds
from .handover import DEFAULT_HANDOVER_WINDOW, Handover, hand_over, is_line_token
from .holders import read_holders
from .keys import DEFAULT_NAMESPACE, LockKeys, check_name, check_namespace
from .lease import (
    Holder,
    Lease,
    Mode,
    RedisClient,
    _backend_error,
    _release_on_exit,
    backend_errors,
)
from .protocol import (
    AcquireArgs,
    AcquireReply,
    AcquireStatus,
    FinishArgs,
    Grant,
    LockSpec,
    NotifyArgs,
    ReleaseArgs,
    ReleaseReply,
    ReleaseWhereArgs,
    ReleaseWhereReply,
    RenewArgs,
    RenewReply,
    Wake,
)
from .replicas import ReplicaPolicy, acknowledged, check_policy, policy_of
from .scripts import run

__all__ = ["DEFAULT_FENCE_KEEP", "Lock"]

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


def _positive_seconds(value: object, what: str, name: str) -> float:
    """``value`` in seconds, in the range :mod:`celery_redislock.core.durations` gives ``what``."""
    return seconds(value, by_name(what), what, name=name)


class Lock:
    """A named lock made of leases: a mutex, a cap of N holders, or a read/write lock.

    ``mode="write"`` (the default) holders exclude every reader and are at most ``limit`` at once
    (``limit=None`` means 1: a mutex). ``mode="read"`` holders share with each other (at most
    ``limit`` when given) and are excluded by any writer; a queued writer is not starved by new
    readers. ``fair=True`` serves waiters strictly in arrival order, handing the lock over
    directly on release. ``min_replicas=n`` makes each acquire and renewal wait (at most
    ``replica_timeout`` seconds) until ``n`` replicas acknowledged it, and fail closed otherwise
    (see :mod:`celery_redislock.core.replicas`).

    >>> lock = Lock(redis.Redis(), "nightly-report", ttl=30)   # doctest: +SKIP
    >>> with lock.acquire(timeout=5) as lease:                  # doctest: +SKIP
    ...     print(lease.fence)
    """

    def __init__(
        self,
        client: RedisClient,
        name: str,
        *,
        ttl: float,
        mode: Mode = "write",
        limit: int | None = None,
        fair: bool = False,
        namespace: str = DEFAULT_NAMESPACE,
        fence_keep: float = DEFAULT_FENCE_KEEP,
        min_replicas: int | None = None,
        replica_timeout: float | None = None,
        handover: Handover | None = None,
        handover_window: float = DEFAULT_HANDOVER_WINDOW,
    ) -> None:
        self.name = check_name(name)
        if not isinstance(client, redis.Redis | RedisCluster):
            raise LockConfigError(
                f"client must be a redis.Redis or redis.cluster.RedisCluster, got "
                f"{type(client).__name__}",
                name=self.name,
            )
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
        self.client = client
        # After each acquire and renewal, this many replicas must acknowledge the lease (see
        # core/replicas.py); None: the client's policy (require_replicas), else none.
        self.replicas: ReplicaPolicy | None = (
            policy_of(client)
            if min_replicas is None
            else check_policy(min_replicas, replica_timeout, name=self.name)
        )
        if self.replicas is not None and self.replicas.count == 0:
            self.replicas = None
        self.mode: Mode = mode
        self.limit = limit
        self.fair = fair
        # Publishes parked tasks this lock's calls hand the lock to (core/line.py); None: their
        # short hand-overs lapse at once, for the next call on the lock or a sweeper to publish.
        self.handover = handover
        self.handover_window = _positive_seconds(handover_window, "handover_window", self.name)
        self.namespace = check_namespace(namespace)
        self.keys = LockKeys.of(self.namespace, self.name)
        self._ttl_ms = max(1, round(self.ttl * 1000))
        # Readers are unbounded unless a limit is given; writers default to one at a time.
        self.fence_keep = _positive_seconds(fence_keep, "fence_keep", self.name)
        # Encoded once: every lock script takes it.
        self._spec = LockSpec(
            mode=mode,
            limit=limit if limit is not None else (0 if mode == "read" else 1),
            ttl_ms=self._ttl_ms,
            fair=fair,
            entry_ms=_QUEUE_ENTRY_MS,
            keep_ms=max(1, round(self.fence_keep * 1000)),
        ).encode()
        self.encoded_keys = [
            key.encode() for key in self.keys.all
        ]  # KEYS of every lock script, encoded once (the hot path)
        self._entered = threading.local()
        self._max_block = _WAIT_SLICE_S
        if isinstance(client, redis.Redis):
            socket_timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
            if socket_timeout:
                # A blocking pop must return before the client's own read timeout fires.
                self._max_block = min(self._max_block, float(socket_timeout) / 2)

    def __repr__(self) -> str:
        return f"Lock({self.name!r}, mode={self.mode!r}, limit={self.limit}, ttl={self.ttl})"

    def _renamed(self, name: str) -> Lock:
        """This lock's twin under another name: the same client and settings, which were
        checked when this one was made and are not checked again (a framework makes one lock
        per call of a task, each with the task's settings)."""
        twin = copy.copy(self)
        twin.name = check_name(name)
        twin.keys = LockKeys.of(self.namespace, twin.name)
        twin.encoded_keys = [key.encode() for key in twin.keys.all]
        twin._entered = threading.local()  # what this thread entered is per lock
        return twin

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
        as long as it takes), woken by a push when the lock is released. ``owner`` makes the
        lease re-entrant: the same owner acquiring again gets the same lease back with its
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
        self._check_acquire_args(blocking, timeout, owner)
        if not isinstance(reentrant, bool):
            raise LockConfigError(
                f"reentrant must be True or False, got {reentrant!r}", name=self.name
            )
        if job is not None and (not isinstance(job, str) or not job or " " in job):
            raise LockConfigError(
                f"job must be None or a non-empty string without spaces, got {job!r}",
                name=self.name,
            )
        request = AcquireArgs(
            token=os.urandom(16).hex(),
            spec=self._spec,
            wait=blocking and timeout != 0,
            once=not reentrant,
            owner=owner,
            info=_info_json(info),
            job=job,
        )
        try:
            return self._acquire(request, timeout)
        except LockBackendError:
            self._abandon(request.token)
            raise

    def _acquire(self, request: AcquireArgs, timeout: float | None) -> Lease:
        owner, job = request.owner, request.job
        deadline = None if timeout is None else time.monotonic() + timeout
        args = request.encode()
        while True:
            sent = time.monotonic()
            try:
                reply = self._run_acquire(args)
                self._notify(reply.granted)
            except redis.RedisError as exc:
                raise _backend_error(self.name, exc) from exc
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
            if not request.wait or own is not None:
                raise LockNotAcquired(
                    f"lock {self.name!r} is held"
                    + (f" by owner {owner!r} already" if own is not None else "")
                    + (f" (gave up after {timeout}s)" if timeout and own is None else ""),
                    name=self.name,
                    timeout=timeout,
                    owner_expires_in=own,
                )
            remaining = float("inf") if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                # One last try that also leaves the line, still passing on a wake-up it may
                # not use.
                request = request._replace(wait=False)
                args = request.encode()
                continue
            until_expiry = reply.ms_left / 1000 + 0.001 if reply.ms_left > 0 else _WAIT_SLICE_S
            block = max(_MIN_BLOCK_S, min(remaining, self._max_block, until_expiry))
            if not self.fair:
                woke = self._await_wake(block)
                if woke != request.woke:
                    request = request._replace(woke=woke)
                    args = request.encode()
                continue
            lease = self._await_grant(block, request.token, owner)
            if lease is not None:
                return lease

    def _run_acquire(self, args: list[str]) -> AcquireReply:
        if self.replicas is None:
            return AcquireReply.decode(run("acquire", self.client, self.encoded_keys, args))
        raw, acks = acknowledged(
            self.client,
            "acquire",
            self.encoded_keys,
            args,
            self.replicas,
            slot_key=self.keys.leases,
        )
        reply = AcquireReply.decode(raw)
        if reply.status is AcquireStatus.HELD and acks < self.replicas.count:
            # Fails closed: acquire() drops a new lease (args[0] is its token) before the error
            # reaches the caller; an owner's re-entry into its lease is undone here, one level.
            if reply.token != args[0]:
                undo = ReleaseArgs(
                    token=reply.token, spec=self._spec, whole=False, request=os.urandom(8).hex()
                )
                run("release", self.client, self.encoded_keys, undo.encode())
            self.replicas.check(acks, self.name, "acquire")
        return reply

    def _abandon(self, token: str) -> None:
        """After a failed call that may have run: drop the lease it may have made for ``token``
        (best effort; if Redis is still unreachable the lease lapses within its ttl)."""
        try:
            abandon = ReleaseArgs(token=token, spec=self._spec, whole=True, request=token)
            run("release", self.client, self.encoded_keys, abandon.encode())
        except redis.RedisError as exc:
            log.warning(
                "lock %r: could not drop the lease a failed acquire may have made (it lapses "
                "within %ss): %s",
                self.name,
                self.ttl,
                exc,
            )

    def _check_acquire_args(self, blocking: bool, timeout: float | None, owner: str | None) -> None:
        if timeout is not None:
            from .durations import TIMEOUT, seconds_or_none

            seconds_or_none(timeout, TIMEOUT, "timeout", name=self.name)  # no inf, NaN, > 1 day
            if not blocking:
                raise LockConfigError("timeout makes no sense with blocking=False", name=self.name)
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise LockConfigError(
                f"owner must be a non-empty string, got {owner!r}", name=self.name
            )

    def _await_wake(self, seconds: float) -> bool:
        """Non-fair: waits up to ``seconds`` for a wake-up; whether one came (the next try
        passes it on if it cannot use it)."""
        with backend_errors(self.name):
            return bool(self.client.blpop([self.keys.all[4]], timeout=seconds))

    def _await_grant(self, seconds: float, token: str, owner: str | None) -> Lease | None:
        """Fair: waits up to ``seconds`` to be handed the lock; the lease if it was."""
        with backend_errors(self.name):
            popped = self.client.blpop([self.keys.waiter(token)], timeout=seconds)
            if not popped:
                return None
            # Handed over with a short lease (as long as a place in line lasts): claim the full
            # ttl. Too late (paused for seconds): the next try queues again.
            sent = time.monotonic()
            wake = Wake.decode(popped[1])
            if wake.fence == 0:
                # Woken with no lease: its owner holds one already (another call of the same
                # owner was served first); the next try re-enters it, or is refused.
                return None
            renew = RenewArgs(ttl_ms=self._ttl_ms, tokens=[token]).encode()
            if self.replicas is None:
                raw = run("renew", self.client, self.encoded_keys[:2], renew)
            else:
                raw, acks = acknowledged(
                    self.client,
                    "renew",
                    self.encoded_keys[:2],
                    renew,
                    self.replicas,
                    slot_key=self.keys.leases,
                )
                self.replicas.check(acks, self.name, "acquire")
            reply = RenewReply.decode(raw)
        claimed = reply.expiries[0]
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
            valid_until=sent + self.ttl,
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
        """Releases ``lease`` (one re-entry level). Raises :class:`LockNotOwned` if not held.
        ``finish_job``/``keep``: see :meth:`Lease.release`."""
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
            spec=self._spec,
            whole=False,
            request=os.urandom(8).hex(),
            finish=None if finish_job is None else self._finish_args(finish_job, keep),
        )
        try:
            reply = ReleaseReply.decode(
                run("release", self.client, self.encoded_keys, request.encode())
            )
            self._notify(reply.granted)
        except redis.RedisError as exc:
            raise _backend_error(self.name, exc) from exc
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
        return self._release_where(
            ReleaseWhereArgs(
                spec=self._spec,
                match=json.dumps({k: str(v) for k, v in match.items()}),
                request=os.urandom(8).hex(),
            )
        )

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
        request = ReleaseWhereArgs(
            spec=self._spec, match="{}", request=os.urandom(8).hex(), tokens=tokens
        )
        return self._release_where(request)

    def _release_where(self, request: ReleaseWhereArgs) -> list[str]:
        with backend_errors(self.name):
            reply = ReleaseWhereReply.decode(
                run("release_where", self.client, self.encoded_keys, request.encode())
            )
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
            run("finish", self.client, self.encoded_keys, self._finish_args(job, keep).encode())

    def _finish_args(self, job: str, keep: float | None) -> FinishArgs:
        if not isinstance(job, str) or not job or " " in job:
            raise LockConfigError(
                f"job must be a non-empty string without spaces, got {job!r}", name=self.name
            )
        keep_ms = round(_positive_seconds(keep, "keep", self.name) * 1000)
        return FinishArgs(job=job, keep_ms=keep_ms)

    # -- inspecting --------------------------------------------------------------------------

    def holders(self) -> list[Holder]:
        """The live leases of this lock's name, oldest fence first."""
        return read_holders(self.client, self.keys, self.name).holders

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
        if not lease.released:
            _release_on_exit(lease, exc)


_HOST = socket.gethostname()


_default_info: tuple[int, str] = (0, "")


def _info_json(info: Mapping[str, object] | None) -> str:
    global _default_info
    pid = os.getpid()
    if not info and _default_info[0] == pid:
        return _default_info[1]
    record = {"host": _HOST, "pid": str(pid)}
    if info:
        record.update({str(k): str(v) for k, v in info.items()})
        return json.dumps(record)
    _default_info = (pid, json.dumps(record))
    return _default_info[1]
