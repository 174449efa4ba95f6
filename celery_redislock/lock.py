"""The lock: a set of leases in Redis, taken and given back by Lua scripts in one round trip."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

import redis
from redis.cluster import RedisCluster

from .errors import (
    JobFinished,
    LockBackendError,
    LockConfigError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    LockUpgradeError,
    RedisLockError,
)
from .keys import DEFAULT_NAMESPACE, LockKeys, check_name, check_namespace
from .scripts import explain_denial, run

__all__ = ["DEFAULT_FENCE_KEEP", "Holder", "Lease", "Lock", "Mode", "RedisClient"]

log = logging.getLogger("celery_redislock")

Mode = Literal["read", "write"]
RedisClient = redis.Redis | RedisCluster

# A blocked waiter looks again at least this often: its place in line is refreshed, and a holder
# that died without releasing is noticed even if its lease outlives the push it never sent.
_WAIT_SLICE_S = 1.0
# A waiter's place in line lapses this long after its last refresh (it crashed or went away).
_QUEUE_ENTRY_MS = int(_WAIT_SLICE_S * 1000) + 2000
# A fair-mode wake-up list lives this long if its waiter never pops it.
_WAKE_LIST_MS = _QUEUE_ENTRY_MS
DEFAULT_FENCE_KEEP = 86400.0
"""Seconds the fence mark outlives a lock's last use: fences stay strictly increasing through a
Redis server clock stepping back by less than this (an NTP step, a VM resume, a failover)."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _positive_seconds(value: object, what: str, name: str) -> float:
    """``value`` in seconds, in the range :mod:`celery_redislock.durations` gives ``what``."""
    from .durations import by_name, seconds

    return seconds(value, by_name(what), what, name=name)


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
        from .renewal import renew_leases

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


class Lock:
    """A named lock made of leases: a mutex, a cap of N holders, or a read/write lock.

    ``mode="write"`` (the default) holders exclude every reader and are at most ``limit`` at once
    (``limit=None`` means 1: a mutex). ``mode="read"`` holders share with each other (at most
    ``limit`` when given) and are excluded by any writer; a queued writer is not starved by new
    readers. ``fair=True`` serves waiters strictly in arrival order, handing the lock over
    directly on release.

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
        self.mode: Mode = mode
        self.limit = limit
        self.fair = fair
        self.namespace = check_namespace(namespace)
        self.keys = LockKeys.of(self.namespace, self.name)
        self._ttl_ms = max(1, round(self.ttl * 1000))
        # Readers are unbounded unless a limit is given; writers default to one at a time.
        limit_arg = limit if limit is not None else (0 if mode == "read" else 1)
        self._fair_arg = "1" if fair else "0"
        self.fence_keep = _positive_seconds(fence_keep, "fence_keep", self.name)
        keep_ms = max(1, round(self.fence_keep * 1000))
        self._spec = (
            f"{mode[0]} {limit_arg} {self._ttl_ms} {self._fair_arg} {_QUEUE_ENTRY_MS} {keep_ms}"
        )
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
        while it holds one, acquiring again is a conflict (as if the lock were held by another).
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
        token = os.urandom(16).hex()
        wait = blocking and timeout != 0
        flags = ("1" if wait else "0") + ("00" if reentrant else "01")
        args = [token, self._spec, flags, owner or "", _info_json(info), job or ""]
        try:
            return self._acquire(args, owner, wait, timeout, job)
        except LockBackendError:
            self._abandon(token)
            raise

    def _acquire(
        self, args: list[str], owner: str | None, wait: bool, timeout: float | None, job: str | None
    ) -> Lease:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            sent = time.monotonic()
            try:
                reply = run("acquire", self.client, self.encoded_keys, args).split()
                if len(reply) > 7:
                    self._notify(reply[7:])
            except redis.RedisError as exc:
                raise _backend_error(self.name, exc) from exc
            status = int(reply[0])
            if status == 2:
                raise JobFinished(
                    f"lock {self.name!r}: job {job!r} is recorded as finished",
                    name=self.name,
                    job=job or "",
                )
            if status == 1:
                mode: Mode = "read" if reply[6] in (b"r", "r") else "write"
                return self._lease(_text(reply[1]), int(reply[2]), int(reply[3]), mode, owner, sent)
            if status == -1:
                raise LockUpgradeError(
                    f"lock {self.name!r}: owner {owner!r} holds a read lease and asked for write; "
                    "release the read lease first",
                    name=self.name,
                )
            if not wait:
                own = int(reply[5]) / 1000 if status == 3 else None
                raise LockNotAcquired(
                    f"lock {self.name!r} is held"
                    + (f" by owner {owner!r} already" if own is not None else "")
                    + (f" (gave up after {timeout}s)" if timeout else ""),
                    name=self.name,
                    timeout=timeout,
                    owner_expires_in=own,
                )
            remaining = float("inf") if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                wait = False  # one last try that also leaves the line
                args[2] = "0" + args[2][1:]  # still passing on a wake-up it may not use
                continue
            until_expiry = int(reply[5]) / 1000 + 0.001 if int(reply[5]) > 0 else _WAIT_SLICE_S
            block = max(0.001, min(remaining, self._max_block, until_expiry))
            lease = self._block(block, args, owner)
            if lease is not None:
                return lease

    def _abandon(self, token: str) -> None:
        """After a failed call that may have run: drop the lease it may have made for ``token``
        (best effort; if Redis is still unreachable the lease lapses within its ttl)."""
        try:
            run("release", self.client, self.encoded_keys, [token, self._spec, "1", token])
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

    def _block(self, seconds: float, args: list[str], owner: str | None) -> Lease | None:
        """Waits up to ``seconds`` for a push. Non-fair: notes in ``args`` whether a wake-up
        came (the next try passes it on if it cannot use it). Fair: returns the lease if the
        lock was handed over."""
        token = args[0]
        with backend_errors(self.name):
            if not self.fair:
                popped = self.client.blpop([self.keys.all[4]], timeout=seconds)
                args[2] = ("11" if popped else "10") + args[2][2]
                return None
            popped = self.client.blpop([self.keys.waiter(token)], timeout=seconds)
            if not popped:
                return None
            # Handed over with a short lease (as long as a place in line lasts): claim the full
            # ttl. Too late (paused for seconds): the next try queues again.
            sent = time.monotonic()
            fence = int(_text(popped[1]).split(":")[0])
            claimed = int(
                run("renew", self.client, self.encoded_keys[:2], [str(self._ttl_ms), token])[0]
            )
        return self._lease(token, fence, claimed, self.mode, owner, sent) if claimed else None

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

    def _notify(self, granted: Sequence[Any]) -> None:
        """Wakes the fair-mode waiters a script just handed the lock to."""
        if not granted:
            return
        tokens = [_text(t) for t in granted[0::3]]
        payloads = [f"{int(f)}:{int(e)}" for f, e in zip(granted[1::3], granted[2::3], strict=True)]
        run(
            "notify",
            self.client,
            [self.keys.waiter(t) for t in tokens],
            [str(_WAKE_LIST_MS), *payloads],
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
        request = os.urandom(8).hex()
        args = [lease.token, self._spec, "0", request]
        if finish_job is not None:
            args += self._finish_args(finish_job, keep)
        try:
            reply = run("release", self.client, self.encoded_keys, args).split()
            if len(reply) > 2:
                self._notify(reply[2:])
        except redis.RedisError as exc:
            raise _backend_error(self.name, exc) from exc
        if int(reply[0]) == 0:
            lease.released = True
            raise LockNotOwned(
                f"lease {lease.token} of lock {self.name!r} is not held (expired or released)",
                name=self.name,
                token=lease.token,
            )
        if int(reply[1]) == 0:
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
        payload = json.dumps({k: str(v) for k, v in match.items()})
        with backend_errors(self.name):
            reply = run("release_where", self.client, self.encoded_keys, [self._spec, payload])
            count = int(reply[0])
            self._notify(reply[1 + count :])
        return [_text(t) for t in reply[1 : 1 + count]]

    def finish_job(self, job: str, keep: float) -> None:
        """Records that ``job`` finished under this lock, for ``keep`` seconds: meanwhile an
        ``acquire(job=job)`` raises :class:`JobFinished` instead of taking a lease. This is how
        a second delivery of a message whose first delivery ran (its ack was lost) is told
        apart from one that must still run.

        >>> lock.finish_job("task-id.0", keep=3600)   # doctest: +SKIP
        """
        with backend_errors(self.name):
            run("finish", self.client, self.encoded_keys, self._finish_args(job, keep))

    def _finish_args(self, job: str, keep: float | None) -> list[str]:
        if not isinstance(job, str) or not job or " " in job:
            raise LockConfigError(
                f"job must be a non-empty string without spaces, got {job!r}", name=self.name
            )
        keep_ms = round(_positive_seconds(keep, "keep", self.name) * 1000)
        return [job, str(keep_ms)]

    # -- inspecting --------------------------------------------------------------------------

    def holders(self) -> list[Holder]:
        """The live leases of this lock's name, oldest fence first."""
        with backend_errors(self.name):
            reply = run("holders", self.client, [self.keys.leases, self.keys.meta], [])
        now = int(reply[0])
        out = []
        fields = [iter(reply[1:])] * 4
        for token, expiry, record, info in zip(*fields, strict=True):
            mode, count, fence, _, owner = _text(record).split("|", 4)
            out.append(
                Holder(
                    token=_text(token),
                    mode="read" if mode == "r" else "write",
                    fence=int(fence),
                    owner=owner or None,
                    info={k: str(v) for k, v in json.loads(_text(info)).items()},
                    count=int(count),
                    expires_in=(int(expiry) - now) / 1000,
                )
            )
        return sorted(out, key=lambda h: h.fence)

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
