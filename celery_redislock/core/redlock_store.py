"""The quorum store (RedLock): a lock's leases on several independent Redis masters (3 or 5),
held while a majority of them hold them. Each master runs the lock's own scripts with the same
ARGV, all at once, and the answers are counted. An acquire holds when a majority granted it
within the validity ``ttl - elapsed - drift``, else what it took is given back everywhere; the
highest fence the granting masters gave is raised on a majority (``redlock_fence.lua``), so
fences grow strictly. A renewal holds if a majority renewed the lease within its validity.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import redis

from ..errors import LockBackendError, LockConfigError
from .holders import holders_of
from .protocol import (
    AcquireReply,
    AcquireStatus,
    HoldersReply,
    ReleaseReply,
    ReleaseWhereReply,
)
from .redlock_masters import gather, on_each, quorum
from .replicas import ReplicaPolicy, pipelined
from .scripts import run
from .server_store import give_back, renew_calls, spread
from .store import Holder, LeaseView, LockView, Renewals

__all__ = ["QuorumStore", "drift"]

T = TypeVar("T")

# A blocking acquire that met the lock held tries again after a random pause drawn from the
# upper half of this, doubled per try up to the cap: contenders spread out, a free lock is
# noticed within the cap.
_RETRY_BASE_S = 0.01
_RETRY_CAP_S = 0.2


def drift(ttl: float) -> float:
    """The part of ``ttl`` a lease is not counted on for: ``1% of ttl`` (the masters' clocks
    may run that much faster than this process's: a lease must be known lost here before any
    master drops it) ``+ 2 ms`` (timer resolution).

    >>> from celery_redislock.core.redlock_store import drift
    >>> round(drift(10.0), 3)
    0.102
    """
    return ttl * 0.01 + 0.002


class QuorumStore:
    """A lock's leases on ``masters`` (checked clients, see
    :func:`~celery_redislock.core.redlock_masters.check_masters`), held on a majority."""

    queues = False
    replicas: ReplicaPolicy | None = None

    def __init__(self, masters: tuple[redis.Redis, ...]) -> None:
        self.masters = masters
        self.quorum = quorum(len(masters))
        self.client = masters[0]
        self.key: object = tuple(map(id, masters))

    def where(self) -> str:
        return "RedLock masters"

    def drift(self, ttl: float) -> float:
        return drift(ttl)

    def max_block(self) -> float:
        return float("inf")

    # -- acquiring ---------------------------------------------------------------------------

    def acquire(self, lock: LockView, args: list[str]) -> AcquireReply:
        # A new token for every try: a try's late answer gives back that try's lease only
        # (were it shared, it could take a master's vote from the next try).
        token = os.urandom(16).hex()
        args = [token, *args[1:]]
        started = time.monotonic()
        valid_until = started + lock.ttl - drift(lock.ttl)
        need, count = self.quorum, len(self.masters)

        def acquire(master: redis.Redis) -> AcquireReply:
            return AcquireReply.decode(run("acquire", master, lock.encoded_keys, args))

        futures = on_each(self.masters, acquire)

        def decided() -> bool:
            done = [f for f in futures if f.done()]
            held = Counter(r.token for r in _replies(done) if r.status is AcquireStatus.HELD)
            best = max(held.values(), default=0)
            return best >= need or best + count - len(done) < need

        gather(futures, decided, valid_until)
        replies = _replies(futures)
        held = Counter(r.token for r in replies if r.status is AcquireStatus.HELD)
        winner, votes = held.most_common(1)[0] if held else ("", 0)
        statuses = Counter(r.status for r in replies)
        agreed: AcquireReply | str | None = None
        if votes >= need and not statuses[AcquireStatus.JOB_FINISHED]:
            agreed = self._agree(lock, winner, futures, valid_until)
        kept = winner if isinstance(agreed, AcquireReply) else None
        undone = [
            self._undo_when_settled(lock, master, future, token, kept)
            for master, future in zip(self.masters, futures, strict=True)
        ]
        if isinstance(agreed, AcquireReply):
            return agreed
        # Failed: what it took is given back before the next try (or the error), except on a
        # master still out, which gives it back when it answers.
        gather([f for f in undone if f is not None], lambda: False, time.monotonic() + lock.ttl)
        mode = replies[0].mode if replies else "write"
        for status in (AcquireStatus.JOB_FINISHED, AcquireStatus.UPGRADE_REFUSED):
            if statuses[status]:
                return AcquireReply(status, "-", 0, 0, 0, 0, mode, ())
        errors = sum(1 for f in futures if f.done() and f.exception() is not None)
        # Requests still out are failures if the validity ran out; if the outcome was decided
        # before they answered, they may yet say the lock is free or held: not counted.
        late = count - len(replies) - errors if time.monotonic() >= valid_until else 0
        if errors + late > count - need:
            slow = f", {late} no answer within the validity" if late else ""
            raise LockBackendError(
                f"lock {lock.name!r}: {errors} of {count} RedLock masters failed{slow}; a "
                f"majority ({need}) must grant the lease ({_errors(futures)})",
                name=lock.name,
            )
        if statuses[AcquireStatus.OWNER_HOLDS]:
            left = max(r.ms_left for r in replies if r.status is AcquireStatus.OWNER_HOLDS)
            return AcquireReply(AcquireStatus.OWNER_HOLDS, "-", 0, 0, 0, left, mode, ())
        if agreed is not None:  # granted by a majority, but not agreed on in time
            raise LockBackendError(
                f"lock {lock.name!r}: a majority of the RedLock masters granted the lease, but "
                f"{agreed} (after {time.monotonic() - started:.3f}s, validity "
                f"{lock.ttl - drift(lock.ttl):.3f}s)",
                name=lock.name,
            )
        return AcquireReply(AcquireStatus.NOT_HELD, "-", 0, 0, 0, 0, mode, ())

    def _agree(
        self,
        lock: LockView,
        winner: str,
        futures: list[Future[AcquireReply]],
        valid_until: float,
    ) -> AcquireReply | str:
        """With a majority granted: raises the fence mark to the highest fence given on the
        granting masters whose fence is lower; the lease's reply if a majority then has it in
        time, else why not."""
        granted = [
            (master, future.result())
            for master, future in zip(self.masters, futures, strict=True)
            if future.done()
            and future.exception() is None
            and future.result().status is AcquireStatus.HELD
            and future.result().token == winner
        ]
        fence = max(reply.fence for _, reply in granted)
        agreed = sum(1 for _, reply in granted if reply.fence == fence)
        behind = [master for master, reply in granted if reply.fence < fence]
        raised: list[Future[int]] = []
        if behind:
            args = [winner, str(fence)]
            raised = on_each(
                behind, lambda master: int(run("redlock_fence", master, lock.encoded_keys, args))
            )
            gather(raised, lambda: False, valid_until)
            agreed += sum(1 for f in raised if f.done() and not f.exception() and f.result())
        if agreed < self.quorum:
            return f"only {agreed} of them took its fence ({_errors(raised)})"
        if time.monotonic() >= valid_until:
            return "the validity ran out first: the masters answer too slowly"
        expiries = sorted((reply.expires_at_ms for _, reply in granted), reverse=True)
        first = granted[0][1]
        return first._replace(
            fence=fence,
            expires_at_ms=expiries[self.quorum - 1],
            entered=max(reply.entered for _, reply in granted),
            granted=(),
        )

    def _undo_when_settled(
        self,
        lock: LockView,
        master: redis.Redis,
        future: Future[AcquireReply],
        token: str,
        kept: str | None,
    ) -> Future[None] | None:
        """Once ``future`` (an acquire on ``master``) has settled: gives back what it took
        unless it is part of the lease ``kept`` (``None``: the attempt failed). Settled
        already: the give-back, started (``None``: nothing to give back); else it is started
        by the thread that settles it."""

        def what(settled: Future[AcquireReply]) -> tuple[str, bool] | None:
            """The lease to give back there, and whether whole (else one re-entry level)."""
            if settled.exception() is not None:
                # It may have made a lease for the token (its answer lost): drop that.
                return None if kept == token else (token, True)
            reply = settled.result()
            if reply.status is not AcquireStatus.HELD or reply.token == kept:
                return None
            # A new lease of this call's token, or a re-entry of the owner's other lease there.
            return reply.token, reply.token == token

        def undo(settled: Future[AcquireReply]) -> None:
            found = what(settled)
            if found is not None:
                with contextlib.suppress(redis.RedisError):  # unreachable: it lapses in a ttl
                    give_back(lock, master, found[0], whole=found[1])

        if not future.done():
            future.add_done_callback(undo)
            return None
        return None if what(future) is None else on_each([master], lambda _: undo(future))[0]

    def abandon(self, lock: LockView, token: str) -> None:
        """Nothing to do: a failed try gave back what it took (the token was its own)."""

    def await_push(self, lock: LockView, key: str, seconds: float, tries: int) -> Any | None:
        pause = min(_RETRY_CAP_S, _RETRY_BASE_S * 2**tries)
        time.sleep(min(seconds, random.uniform(pause / 2, pause)))
        return None

    def claim(self, lock: LockView, token: str) -> int:
        raise LockConfigError("fair=True is not available in RedLock mode", name=lock.name)

    # -- releasing, finishing, reading ---------------------------------------------------------

    def release(self, lock: LockView, args: list[str]) -> ReleaseReply:
        """Released if a majority released it; :class:`LockBackendError` if too few masters
        answered to tell (what was not released lapses within the ttl)."""
        replies = self._majority(
            lock,
            lambda master: ReleaseReply.decode(run("release", master, lock.encoded_keys, args)),
            "release",
        )
        released = [r for r in replies if r.released]
        if len(released) >= self.quorum:
            return ReleaseReply(True, max(r.left for r in released), ())
        return ReleaseReply(False, 0, ())

    def release_where(self, lock: LockView, args: list[str]) -> ReleaseWhereReply:
        replies = self._majority(
            lock,
            lambda master: ReleaseWhereReply.decode(
                run("release_where", master, lock.encoded_keys, args)
            ),
            "release_where",
        )
        return ReleaseWhereReply(
            tuple(dict.fromkeys(token for reply in replies for token in reply.released)), ()
        )

    def finish(self, lock: LockView, args: list[str]) -> None:
        self._majority(
            lock, lambda master: run("finish", master, lock.encoded_keys, args), "finish"
        )

    def holders(self, lock: LockView) -> list[Holder]:
        keys = lock.encoded_keys[:2]
        replies = self._majority(
            lock, lambda master: HoldersReply.decode(run("holders", master, keys, [])), "holders"
        )
        seen: dict[str, list[Holder]] = {}
        for reply in replies:
            for holder in holders_of(reply):
                seen.setdefault(holder.token, []).append(holder)
        out = []
        nth = self.quorum - 1  # what a majority agreed on (a late master may say more)
        for copies in seen.values():
            if len(copies) < self.quorum:
                continue  # a stray lease on a minority holds nothing
            out.append(
                dataclasses.replace(
                    copies[0],
                    fence=sorted((h.fence for h in copies), reverse=True)[nth],
                    count=max(h.count for h in copies),
                    expires_in=sorted((h.expires_in for h in copies), reverse=True)[nth],
                )
            )
        return sorted(out, key=lambda h: h.fence)

    def renew(self, leases: Sequence[LeaseView], ttl: float | None) -> Renewals:
        """Every master renews the whole batch in one call, all at once: a lease is renewed if
        a majority renewed it before its validity ran out (its expiry then the server time
        until which a majority has it), lost if a majority no longer has it or the answer came
        after its validity, else not known (-1)."""
        need, count = self.quorum, len(self.masters)
        calls = renew_calls(leases, ttl)  # one per distinct ttl: usually one
        batch = [(keys, args) for _, keys, args in calls]

        def renew(master: redis.Redis) -> list[int]:
            return spread(calls, pipelined(master, "renew", batch, None)[0], [0] * len(leases))

        sent = time.monotonic()
        futures = on_each(self.masters, renew)
        # Past the last validity nothing can be renewed in time: stop waiting there.
        gather(futures, lambda: False, max(lease.valid_until for lease in leases))
        answered = time.monotonic()
        per_master = _replies(futures)
        expiries: list[int] = []
        valid: list[float] = []
        whys: list[str | None] = []
        for i, lease in enumerate(leases):
            renewed = sorted((e[i] for e in per_master if e[i] > 0), reverse=True)
            gone = sum(1 for e in per_master if e[i] == 0)
            held_for = ttl if ttl is not None else lease.lock.ttl
            expiry, valid_until, why = -1, lease.valid_until, None
            if answered >= lease.valid_until:
                expiry, why = 0, "the renewal answered after its validity"
            elif len(renewed) >= need:
                expiry, valid_until = renewed[need - 1], sent + held_for - drift(held_for)
            elif gone > count - need:
                expiry, why = 0, f"{gone} of {count} masters no longer hold it"
            else:
                why = (
                    f"renewed on {len(renewed)} of {count} masters, a majority ({need}) is "
                    f"needed ({_errors(futures) or 'no answer'})"
                )
            expiries.append(expiry)
            valid.append(valid_until)
            whys.append(why)
        return Renewals(expiries, valid, whys)

    # -- every master ------------------------------------------------------------------------

    def _majority(self, lock: LockView, call: Callable[[redis.Redis], T], what: str) -> list[T]:
        """``call`` on every master at once: the answers, if a majority answered within a ttl
        (after that, whatever the call would change has lapsed anyway); else
        :class:`LockBackendError`."""
        futures = on_each(self.masters, call)
        gather(futures, lambda: False, time.monotonic() + lock.ttl)
        good = _replies(futures)
        if len(good) < self.quorum:
            raise LockBackendError(
                f"lock {lock.name!r}: {what} answered by {len(good)} of {len(self.masters)} "
                f"RedLock masters, a majority ({self.quorum}) is needed ({_errors(futures)})",
                name=lock.name,
            )
        return good


def _replies(futures: Sequence[Future[T]]) -> list[T]:
    return [f.result() for f in futures if f.done() and f.exception() is None]


def _errors(futures: Sequence[Future[Any]]) -> str:
    out = []
    for future in futures:
        if not future.done():
            out.append("no answer yet")
        elif (error := future.exception()) is not None:
            out.append(f"{type(error).__name__}: {error}")
    return "; ".join(out)
