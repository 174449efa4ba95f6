"""The heartbeat: one thread per process keeps every lease it was given alive, each renewed by
its lock's store in batches, and says at once when one is lost."""

from __future__ import annotations

import _thread
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import LockBackendError
from .durations import MAX_HOLD, seconds
from .lock import Lease
from .redlock_masters import submit
from .repeated import RepeatedFailure
from .store import Renewals, Store

__all__ = ["Heartbeat"]

log = logging.getLogger(__name__)

OnLost = Callable[[Lease, BaseException | None], None]


@dataclass(eq=False)
class _Entry:
    lease: Lease
    on_lost: OnLost | None
    hold_until: float | None
    log_lost: bool = True  # False: on_lost logs the loss, the heartbeat's line would repeat it
    due: float = field(default=0.0)
    busy: bool = False  # in a renewal call that has not answered yet
    error: BaseException | None = None  # why the last renewal call failed, if it did


@dataclass(eq=False)
class _Call:
    """One batch renewal call, made on a helper thread; the heartbeat thread applies its answer."""

    store: Store  # the first lease's: it renews the leases of every store with its key
    entries: list[_Entry]
    results: Renewals | None = None
    error: BaseException | None = None


def _no_answer(lease: Lease) -> LockBackendError:
    return LockBackendError(
        f"lock {lease.name!r}: lease {lease.token} lapsed before Redis answered its renewal",
        name=lease.name,
    )


class Heartbeat:
    """The process's background heartbeat: one daemon thread renews every registered lease each
    ttl/3, batched, and calls ``on_lost(lease, error)`` for a lease it finds lost, or that
    lapses before it could be renewed (``error`` then says why).

    The calls to Redis run on helper threads, so a Redis that hangs delays no notice: a lease is
    reported lost the moment it may have lapsed, whatever the client's socket timeout. After
    ``fork`` the child starts with an empty heartbeat of its own: it never renews what its parent
    registered.

    >>> lease = lock.acquire()                                          # doctest: +SKIP
    >>> Heartbeat.current().register(lease, on_lost=lambda l, e: alarm())  # doctest: +SKIP
    """

    _instance: Heartbeat | None = None
    _instance_pid: int = 0
    _fork_hook = False
    _create = threading.Lock()

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._cond = threading.Condition()
        # Set once the thread is started, and when it has ended.
        self._started = False
        self._ended = threading.Event()
        self._stopped = False
        # When the thread next wakes by itself (monotonic). A lease registered as due later
        # needs no wake-up: each task start would otherwise cost the thread a wake-up.
        self._wake_at = 0.0
        # Calls answered (or failed) and not yet applied.
        self._answered: list[_Call] = []
        # Per Redis: its renewals failing, logged once then summed up (not every 0.5 s).
        self._failures: dict[object, RepeatedFailure] = {}

    @classmethod
    def current(cls) -> Heartbeat:
        """This process's heartbeat (created on first use)."""
        with cls._create:
            if cls._instance is None or cls._instance_pid != os.getpid():
                if not Heartbeat._fork_hook:  # registered on first use, not at import
                    os.register_at_fork(after_in_child=Heartbeat._forget_after_fork)
                    Heartbeat._fork_hook = True
                cls._instance = cls()
                cls._instance_pid = os.getpid()
            return cls._instance

    @classmethod
    def _forget_after_fork(cls) -> None:
        # The parent's threads do not exist here and its locks may be held mid-operation.
        cls._instance = None
        cls._instance_pid = 0
        cls._create = threading.Lock()

    def register(
        self,
        lease: Lease,
        *,
        on_lost: OnLost | None = None,
        max_hold: float | None = None,
        log_lost: bool = True,
    ) -> None:
        """Keeps ``lease`` alive until :meth:`unregister`, loss, or ``max_hold`` seconds. A
        loss is logged at ERROR, unless ``log_lost`` is false: ``on_lost`` then says it (the
        heartbeat logs it at DEBUG only)."""
        if max_hold is not None:
            max_hold = seconds(max_hold, MAX_HOLD, "max_hold", name=lease.name)
        hold_until = None if max_hold is None else time.monotonic() + max_hold
        due = time.monotonic() + lease.lock.ttl / 3
        entry = _Entry(lease, on_lost, hold_until, log_lost, due=due)
        with self._cond:
            self._entries[lease.token] = entry
            if not self._started:
                # A bare thread: threading.Thread.start() waits until the thread runs, half a
                # millisecond of the first registration in each forked process (an RQ work
                # horse, a pool child). It dies with the process, as a daemon thread does.
                _thread.start_new_thread(self._run_thread, ())
                self._started = True
            if entry.due < self._wake_at:
                self._cond.notify()  # due before the thread means to wake: it must look again

    def unregister(self, lease: Lease) -> None:
        """Stops renewing ``lease`` (call before or after releasing it). A lease that may have
        lapsed before the thread looked is reported lost now: its holder may have seen the lapse
        first (``check()``) and ended, and the report must still come."""
        with self._cond:
            entry = self._entries.pop(lease.token, None)
            lapsed = entry is not None and time.monotonic() >= lease.valid_until
            if lapsed:
                lease.lost = True
        if entry is not None and lapsed:
            self._report(entry, entry.error or _no_answer(lease))

    def leases(self) -> list[Lease]:
        """The leases being renewed now."""
        with self._cond:
            return [e.lease for e in self._entries.values()]

    def stop(self) -> None:
        """Stops the thread; registered leases are then left to expire."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._started:
            self._ended.wait(timeout=5)

    def _run_thread(self) -> None:
        # Named as a threading.Thread would be (log records, thread listings).
        threading.current_thread().name = "redislock-heartbeat"
        try:
            self._run()
        except Exception:
            log.exception("the lease heartbeat failed; its leases are no longer renewed")
        finally:
            self._ended.set()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    now = time.monotonic()
                    answered, self._answered = self._answered, []
                    # Answers first: a renewal that came back in time is no loss.
                    gone, late = self._apply(answered, now)
                    lost = gone + self._lapsed(now)
                    expired_hold, calls = self._take_due(now)
                    if answered or lost or expired_hold or calls:
                        break
                    self._wake_at = self._next_wake(now)
                    self._cond.wait(self._wake_at - now)
                    self._wake_at = 0.0
                if self._stopped:
                    return
            for call in answered:
                failures = self._failures_of(call)
                if call.error is not None:
                    failures.failed(call.error)
                else:
                    failures.worked()
            for e in late:
                # Its holder was told it is lost: it lapses in Redis within its ttl.
                log.warning(
                    "lock %r: lease %s was renewed after it had been reported lost; it stays lost",
                    e.lease.name,
                    e.lease.token,
                )
            for e in expired_hold:
                log.warning(
                    "lock %r: lease %s reached its maximum hold; no longer renewed",
                    e.lease.name,
                    e.lease.token,
                )
            for call in calls:
                self._start(call)
            for e, error in lost:
                if error is not None:  # it lapsed while failing: the loss says the rest
                    found = self._failures.get(e.lease.lock.store.key)
                    if found is not None:
                        found.forget()
                self._report(e, error)

    def _failures_of(self, call: _Call) -> RepeatedFailure:
        key = call.store.key
        found = self._failures.get(key)
        if found is None:
            place = call.store.where()
            found = self._failures[key] = RepeatedFailure(log, f"lease renewal on {place}")
        return found

    def _apply(
        self, answered: list[_Call], now: float
    ) -> tuple[list[tuple[_Entry, None]], list[_Entry]]:
        """Applies answered calls (holding the lock); returns the entries Redis said were lost,
        and those renewed too late: already reported lost, they stay lost."""
        lost: list[tuple[_Entry, None]] = []
        late: list[_Entry] = []
        for call in answered:
            for i, e in enumerate(call.entries):
                e.busy = False
                if self._entries.get(e.lease.token) is not e:  # unregistered or reported lost
                    if e.lease.lost and call.results is not None and call.results.expiries[i] > 0:
                        late.append(e)
                    continue
                interval = e.lease.lock.ttl / 3
                if call.results is None:  # Redis unreachable: retry soon, report it if it lapses
                    e.error, e.due = call.error, now + min(interval, 0.5)
                elif call.results.expiries[i] < 0:  # too few masters of a quorum answered
                    e.error = LockBackendError(
                        f"lock {e.lease.name!r}: {call.results.why and call.results.why[i]}",
                        name=e.lease.name,
                    )
                    e.due = now + min(interval, 0.5)
                elif call.results.expiries[i] > 0:
                    e.lease.expires_at_ms = call.results.expiries[i]
                    e.lease.valid_until = call.results.valid_until[i]
                    e.error, e.due = None, now + interval
                else:
                    del self._entries[e.lease.token]
                    e.lease.lost = True
                    lost.append((e, None))
        return lost, late

    def _lapsed(self, now: float) -> list[tuple[_Entry, BaseException | None]]:
        """Takes out (holding the lock) the leases that may have lapsed by now: not renewed in
        time, whether their call failed or has not answered yet."""
        lapsed = [e for e in self._entries.values() if now >= e.lease.valid_until]
        for e in lapsed:
            del self._entries[e.lease.token]
            e.lease.lost = True
        return [(e, e.error or _no_answer(e.lease)) for e in lapsed]

    def _take_due(self, now: float) -> tuple[list[_Entry], list[_Call]]:
        """The entries past their maximum hold (taken out), and one call per Redis client for
        the others due (holding the lock)."""
        # Renew everything due within the next little while together: fewer round trips. A
        # lease in a call still out waits for its answer: never two calls for one lease.
        due = [e for e in self._entries.values() if not e.busy and e.due <= now + 0.05]
        expired_hold = [e for e in due if e.hold_until is not None and now >= e.hold_until]
        for e in expired_hold:
            del self._entries[e.lease.token]
        calls: dict[object, _Call] = {}
        for e in due:
            if e.hold_until is None or now < e.hold_until:
                e.busy = True
                store = e.lease.lock.store
                call = calls.get(store.key)  # one call for the locks over the same Redis
                if call is None:
                    call = calls[store.key] = _Call(store, [])
                call.entries.append(e)
        return expired_hold, list(calls.values())

    def _next_wake(self, now: float) -> float:
        # Idle, it still wakes each second: most registrations then fall due after that and
        # need not wake it. A lease in a call still out is looked at again when it would lapse.
        wake = now + 1.0
        for e in self._entries.values():
            wake = min(wake, e.lease.valid_until if e.busy else min(e.due, e.lease.valid_until))
        return wake

    def _start(self, call: _Call) -> None:
        # On a helper thread of its own while it is out: a frozen Redis holds up no other call.
        submit(functools.partial(self._call, call))

    def _call(self, call: _Call) -> None:
        try:
            call.results = call.store.renew([e.lease for e in call.entries], None)
        except Exception as exc:
            call.error = exc
        finally:
            with self._cond:
                self._answered.append(call)
                self._cond.notify()

    def _report(self, e: _Entry, error: BaseException | None) -> None:
        log.log(
            logging.ERROR if e.log_lost else logging.DEBUG,
            "lock %r: lease %s lost%s",
            e.lease.name,
            e.lease.token,
            f" ({error})" if error else "",
        )
        if e.on_lost is not None:
            try:
                e.on_lost(e.lease, error)
            except Exception:
                log.exception("on_lost callback failed for lock %r", e.lease.name)
