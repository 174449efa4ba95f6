"""The keeper: a workflow's lease kept alive between two links, in the process that published
the next link, until that link starts (it releases the gap lease beside it), at most ``max_gap``.

One thread per process, started with the first lease to keep and ending with the last. Each
round renews the gap leases first, then only the workflow leases whose gap lease was still
there: a lease is never renewed here after its next link was seen to start, so once that link's
process dies the lease lapses within ``ttl`` (one round trip apart). Not the heartbeat: the
heartbeat renews every lease it holds, and cannot make one renewal depend on another's."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

from ...errors import LockBackendError
from ..lease import Lease
from ..lock import renew_leases

__all__ = ["Keeper", "keepers"]

log = logging.getLogger(__name__)

_RETRY_SOON = 0.5  # after Redis failed a round: try again this soon


@dataclass(eq=False)
class Keeper:
    """``lease``, kept while ``gap`` lives, at most until ``until`` (``time.monotonic()``)."""

    lease: Lease
    gap: Lease
    until: float
    due: float = 0.0
    done: bool = False
    guard: threading.Lock = field(default_factory=threading.Lock, repr=False)


class Keepers:
    """This process's keepers, by the workflow lease's token, and the thread renewing them."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.by_token: dict[str, Keeper] = {}
        self.cond = threading.Condition()
        self.running = False

    def keep(self, lease: Lease, gap: Lease, max_gap: float) -> Keeper:
        """Keeps ``lease`` while ``gap`` lives, at most ``max_gap`` seconds."""
        now = time.monotonic()
        keeper = Keeper(lease, gap, now + max_gap, due=now + lease.lock.ttl / 3)
        with self.cond:
            self.by_token[lease.token] = keeper
            if not self.running:
                self.running = True
                # A Thread, not a bare thread: it ends with its last lease, and leaves no
                # never-ending dummy in threading's list behind.
                threading.Thread(
                    target=self._run_thread, name="redislock-keeper", daemon=True
                ).start()
            self.cond.notify()
        return keeper

    def take(self, token: str) -> Keeper | None:
        """Ends the keeping of lease ``token`` (no renewal of it here after this returns); the
        keeper, if this process kept it."""
        with self.cond:
            keeper = self.by_token.pop(token, None)
        if keeper is not None:
            with keeper.guard:  # (a renewal of it under way ends first)
                keeper.done = True
        return keeper

    def all(self) -> list[Keeper]:
        with self.cond:
            return list(self.by_token.values())

    def _run_thread(self) -> None:
        try:
            self._run()
        except Exception:
            log.exception("the workflow lease keeper failed; its leases lapse within their ttl")
            with self.cond:
                self.running = False

    def _run(self) -> None:
        while True:
            with self.cond:
                while True:
                    if not self.by_token:
                        self.running = False
                        return
                    now = time.monotonic()
                    due = [k for k in self.by_token.values() if k.due <= now + 0.05]
                    if due:
                        break
                    wake = min(k.due for k in self.by_token.values())
                    self.cond.wait(max(0.0, wake - now))
            self._round(due, now)

    def _round(self, due: list[Keeper], now: float) -> None:
        over = [k for k in due if now >= k.until]
        for keeper in over:
            log.warning(
                "lock %r: a workflow's next link did not start within max_gap; its lease is no "
                "longer kept and lapses within its ttl",
                keeper.lease.name,
            )
            self._end(keeper)
        due = [k for k in due if now < k.until]
        if not due:
            return
        try:
            gaps = renew_leases([k.gap for k in due])
        except LockBackendError as exc:
            self._failed(due, now, exc)
            return
        started = {id(g) for g in gaps.lost}
        for keeper in due:
            if id(keeper.gap) in started:
                self._end(keeper)  # the next link started: the lease is its own now
        held: list[Keeper] = []
        for keeper in due:
            if id(keeper.gap) in started:
                continue
            keeper.guard.acquire()  # (released below: a take() waits for this round)
            if keeper.done:
                keeper.guard.release()  # taken by a link of this process meanwhile
            else:
                held.append(keeper)
        try:
            report = renew_leases([k.lease for k in held]) if held else None
        except LockBackendError as exc:
            self._failed(held, now, exc)
            return
        finally:
            for keeper in held:
                keeper.guard.release()
        lost = {id(lease) for lease in report.lost} if report is not None else set()
        for keeper in held:
            if id(keeper.lease) in lost:
                self._end(keeper)  # released by the workflow's last link, or lapsed
            else:
                keeper.due = time.monotonic() + keeper.lease.lock.ttl / 3

    def _failed(self, keepers: list[Keeper], now: float, exc: LockBackendError) -> None:
        log.warning("workflow leases: renewal failed, trying again: %s", exc)
        for keeper in keepers:
            if now >= keeper.lease.valid_until:
                self._end(keeper)  # may have lapsed: it is not revived
            else:
                keeper.due = now + _RETRY_SOON

    def _end(self, keeper: Keeper) -> None:
        with self.cond:
            if self.by_token.get(keeper.lease.token) is keeper:
                del self.by_token[keeper.lease.token]
        keeper.done = True


keepers = Keepers()
# A forked child keeps nothing of its parent's, and has no keeper thread.
os.register_at_fork(after_in_child=keepers.reset)
