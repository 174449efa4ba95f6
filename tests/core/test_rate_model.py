"""Model-based test of the rate limit's GCRA bucket: random reservations (new, repeated, late,
with costs and ``max_delay``), settles (of known and forgotten requests), pauses, resumes, usage
reads and short sleeps, on a few rates and bursts, against a plain-Python model, on a real
Redis with its real clock.

The test is the only client, so the model knows the bucket (``tat``, ``last``, ``paused``, in
server microseconds) and every request record before each call. The server's time ``now`` is
read before (``t0``) and after (``t1``) each call. A new slot is ``max(now, B)`` where
``B = max(tat + min(need, size) - size, last, paused)`` depends only on the bucket (a cost
above the burst starts on a full bucket, and the calls after it pay it back): when the slot
lies beyond ``B`` it tells ``now`` exactly, and the
state after the call follows exactly; where an answer depends on ``now`` alone (a pause that
ends within ``[t0, t1]``, a request on the edge of ``max_late``), the model accepts either
outcome and checks it is one of the two.

With ``max_late``, starts are counted too (``started``, ``last_start`` in the bucket, the
start as the record's third field): a request whose slot is due keeps it however late it comes,
and starts at ``max(slot, now, started + min(need, size) - size, last_start)``, noted now;
within ``max(late, 1 s)`` of ``now`` it starts then (the model checks it within the range
``[t0, t1]`` allows), else the start is kept for it to come back to (``w``), which it uses if it
comes back within ``late`` after it. A request asked again more than ``max_late`` after its
start gets a new slot.

After every step: the bucket and the records in Redis are the model's; new slots never go back;
and the GCRA invariant holds: for any two grants ``i`` before ``j``, everything charged from
``i`` up to ``j`` (the grants and settles between, and ``j``'s need up to a full bucket) is at
most ``size + slot_j - slot_i`` (in us) -- so no window of ``w`` holds more than
``burst + w * limit / per`` units. The same holds for the starts noted, with ``late_j`` more
room: at most ``size + start_j - start_i`` (``late_j`` is 0: no more room for starts).
"""

from __future__ import annotations

import math
import time
import uuid
from typing import ClassVar

import redis
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.admin import clear_limits, set_limits
from celery_redislock.core.keys import LockKeys
from celery_redislock.core.rate import Rate, RateLimit, Reservation

SETTINGS = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    database=None,  # no example database in the working tree; failures print their steps
    phases=[Phase.explicit, Phase.generate],  # no shrinking: see test_model.py
    suppress_health_check=[HealthCheck.too_slow],
)

# Intervals of 10 to 20 ms, so that sleeps and pauses of a few ms let the bucket refill and
# requests go late; one not a whole number of ms (16,667 us), where rounding shows.
RATES = (Rate(1, 0.02), Rate(3, 0.03), Rate(10, 0.1), Rate(3, 0.05))
BURSTS = (1, 2, 4)
COSTS = (0.3, 0.5, 1.0, 2.0, 3.0)  # 3 is above some bursts: it starts on a full one
DELAYS = (None, 0.0, 0.01, 0.05, 10.0)  # max_delay
LATES = (None, 0.0, 0.005, 0.03, 10.0)  # max_late


def server_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1_000_000 + micros


def _ms(seconds: float | None) -> int | None:
    """As rate.py sends it: whole ms."""
    return None if seconds is None else int(seconds * 1000)


def _delay_ms(got: Reservation) -> int:
    return round(got.delay * 1000)


def _delay_range(slot: int, now_lo: int, now_hi: int) -> tuple[int, int]:
    """The delay (ms) the script answers for ``slot`` at a time from ``now_lo`` to ``now_hi``."""
    return math.ceil(max(slot - now_hi, 0) / 1000), math.ceil(max(slot - now_lo, 0) / 1000)


class RateModel(RuleBasedStateMachine):
    """One fresh rate limit per example; the subclass made per test sets ``client``."""

    client: ClassVar[redis.Redis]
    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        self.bucket: dict[str, int] = {}  # the bucket hash as Redis should hold it
        self.records: dict[str, tuple[int, float]] = {}  # request -> (slot us, cost)
        self.starts: dict[str, int] = {}  # request -> its start noted (us)
        self.waiting: set[str] = set()  # requests whose start is kept for them to come back
        self.counted: dict[str, int] = {}  # started, last_start as Redis should hold them
        # (start us or None for a settle, us charged, late us) of the starts noted, in order
        self.start_charges: list[tuple[int | None, int, int]] = []
        self.charges: list[tuple[int | None, int]] = []  # (slot of a grant or None, us charged)
        self.highest = 0  # the latest slot handed to a new request so far
        self.count = 0

    @initialize(rate=st.sampled_from(RATES), burst=st.sampled_from(BURSTS))
    def start(self, rate: Rate, burst: int) -> None:
        self.code = (rate, burst)  # the caller's limits
        self.runtime: tuple[Rate | None, int | None] = (None, None)  # set in Redis
        self.limit = RateLimit(self.client, f"rate-{uuid.uuid4().hex[:12]}", rate, burst=burst)
        self.keys = LockKeys.of(self.limit.namespace, self.limit.name)
        self.apply()

    def apply(self) -> None:
        """The limits in effect: the runtime ones where set, else the caller's."""
        self.rate = self.runtime[0] or self.code[0]
        self.burst = self.runtime[1] or self.code[1]
        self.interval = -(-self.rate.per_ms * 1000 // self.rate.limit)
        self.size = self.burst * self.interval
        # The window invariant holds for one set of limits: start counting again. (Slots still
        # never go back: not before the last slot handed out.)
        self.charges = []
        self.start_charges = []

    # -- reading Redis -------------------------------------------------------------------------

    def now(self) -> int:
        return server_us(self.client)

    def stored_all(self) -> dict[str, int]:
        raw = self.client.hgetall(self.limit.key)
        return {k.decode(): int(v) for k, v in raw.items()}  # type: ignore[union-attr]

    def stored(self) -> dict[str, int]:
        """The bucket's fields for slots."""
        return {k: v for k, v in self.stored_all().items() if k not in ("started", "last_start")}

    def stored_counted(self) -> dict[str, int]:
        """The bucket's fields for the starts noted."""
        return {k: v for k, v in self.stored_all().items() if k in ("started", "last_start")}

    def stored_record(self, request: str) -> tuple[int, float] | None:
        full = self.stored_full(request)
        return None if full is None else (full[0], full[1])

    def stored_full(self, request: str) -> tuple[int, float, int | None, bool] | None:
        """A request's record: slot, cost, start noted (or None), and whether it waits."""
        raw = self.client.get(self.keys.rate_request(request))
        if raw is None:
            return None
        slot, cost, *start = raw.decode().split()  # type: ignore[union-attr]
        return int(slot), float(cost), int(start[0]) if start else None, start[1:] == ["w"]

    def field(self, name: str) -> int:
        return self.bucket.get(name, 0)

    def stale(self, t: int) -> bool:
        """Whether the bucket says nothing any more at ``t`` (Redis may have let it expire)."""
        return max(self.bucket.values(), default=0) <= t and not self.counting(t)

    def counting(self, t: int) -> bool:
        """Whether the starts noted still say something at ``t`` (they keep the bucket)."""
        return self.counted.get("started", 0) > t

    def saved(self, t0: int, t1: int, after: dict[str, int]) -> dict[str, tuple[int, int]]:
        """The bucket a call saved without changing it: tat read at now, ``last`` and a pause
        still on."""
        tat, last, paused = self.field("tat"), self.field("last"), self.field("paused")
        if not after and max(tat, last, paused) <= t1 and not self.counting(t0):
            return {}  # (nothing said any more: dropped)
        expect = {"tat": (max(tat, t0), max(tat, t1)), "last": (last, last)}
        if paused > t0 and (paused > t1 or "paused" in after):
            expect["paused"] = (paused, paused)
        return expect

    def adopt_counted(self, t0: int, t1: int) -> None:
        """The starts noted after a call that noted none: the same, or dropped once they say
        nothing (a call that saved the bucket)."""
        after = self.stored_counted()
        if after != self.counted:
            assert not after and not self.counting(t1), (after, self.counted)
        self.counted = after

    def adopt(self, after: dict[str, int], expect: dict[str, tuple[int, int]], t0: int) -> None:
        """Checks the bucket Redis holds after a call against ``expect`` (field -> the range
        it may take; a missing field: absent), and makes it the model's. ``last`` is kept by
        pause, resume and settle: it is the model's, or 0 if the bucket had expired."""
        assert set(after) == set(expect), (after, expect)
        for name, (lo, hi) in expect.items():
            value = after[name]
            if name == "last" and value == 0 and self.stale(t0):
                continue
            assert lo <= value <= hi, (name, value, lo, hi, after, self.bucket)
        self.bucket = after

    # -- reservations --------------------------------------------------------------------------

    def reserve(
        self, request: str, cost: float, max_delay: float | None, max_late: float | None
    ) -> None:
        old = self.records.get(request)
        old_start = self.starts.get(request)
        before = dict(self.bucket)
        counted = dict(self.counted)
        paused = self.field("paused")
        t0 = self.now()
        got = self.limit.reserve(request, cost=cost, max_delay=max_delay, max_late=max_late)
        t1 = self.now()
        after, full = self.stored(), self.stored_full(request)
        record = None if full is None else (full[0], full[1])
        late_ms = _ms(max_late)
        if old is not None:
            slot = old[0]
            # Counting starts, a request runs again once its start is older than max late.
            since = old_start if request not in self.waiting else None
            late_sure = late_ms is not None and since is not None and t0 - since > late_ms * 1000
            late_maybe = late_ms is not None and since is not None and t1 - since > late_ms * 1000
            over_sure = paused > t1 and slot < paused
            over_maybe = paused > t0 and slot < paused
            if record == old and got.granted:
                assert not late_sure, "a request asked again after its start kept its slot"
                assert not over_sure, "a request a pause overtook kept its slot"
                assert got.cost == cost and got.rate == self.rate and got.burst == self.burst
                if late_ms is None or (old_start is None and slot > t1):
                    # Its slot, as it was (not counting, or not due yet): nothing written.
                    assert got.slot_ms == slot // 1000 and not got.started
                    lo, hi = _delay_range(slot, t0, t1)
                    assert lo <= _delay_ms(got) <= hi, (got, slot, t0, t1)
                    if after:  # a repeat writes nothing
                        assert after == before, (after, before)
                    self.adopt_counted(t0, t1)
                    event("repeat kept its slot")
                    return
                if old_start is not None and request not in self.waiting:  # asked again
                    assert full is not None and full[2] == old_start, (full, old_start)
                    assert got.started and got.slot_ms == old_start // 1000, got
                    if after:
                        assert after == before, (after, before)
                    self.adopt_counted(t0, t1)
                    event("repeat: the start noted")
                    return
                noted = len(self.start_charges)
                self.check_start(request, old, got, t0, t1, late_ms, counted, full)
                if len(self.start_charges) > noted:  # the slot kept, a start noted: saved
                    self.adopt(after, self.saved(t0, t1, after), t0)
                elif after:
                    assert after == before, (after, before)
                return
            assert late_maybe or over_maybe, ("a request lost its slot", old, got, record)
            event("late: a new slot" if late_maybe else "overtaken by a pause: a new slot")
            del self.records[request]
            self.starts.pop(request, None)
            self.waiting.discard(request)
        self.new_slot(request, cost, max_delay, got, t0, t1, after, record, late_ms is not None)
        if late_ms is not None and request in self.records:
            self.check_start(request, self.records[request], got, t0, t1, late_ms, counted, full)
        else:
            self.adopt_counted(t0, t1)

    def check_start(
        self,
        request: str,
        booked: tuple[int, float],
        got: Reservation,
        t0: int,
        t1: int,
        late_ms: int,
        counted: dict[str, int],
        full: tuple[int, float, int | None, bool] | None,
    ) -> None:
        """Counting starts: a request whose slot is due starts at the earliest time the starts
        noted leave room for it (noted now); within max late of now it starts then, else it
        comes back for it (' w'), and uses it if it comes back within max late after it."""
        slot, units = booked
        late = late_ms * 1000
        soon = max(late, 1_000_000)  # (it waits in place up to max late, at least 1 s)
        need = math.ceil(units * self.interval)
        started, last_start = counted.get("started", 0), counted.get("last_start", 0)
        kept = self.starts.get(request) if request in self.waiting else None
        assert full is not None
        start, waits = full[2], full[3]
        stored = self.stored_counted()
        if start is None:  # not due: answered its slot, nothing noted
            assert not got.started and got.slot_ms == slot // 1000, (got, full)
            assert slot > t0, (slot, t0)
            assert stored == counted or not stored
            self.counted = stored
            event("not due")
            return
        assert got.slot_ms == start // 1000 and got.started == (not waits), (got, full)
        if kept is not None and start == kept:  # the start kept for it
            assert t0 - kept <= late, (kept, t0, late)
            if waits:  # back early
                assert kept - t0 > soon, (kept, t0, soon)
            else:
                assert kept - t1 <= soon, (kept, t1, soon)
                self.waiting.discard(request)
            assert stored == counted or not stored, (stored, counted)
            self.counted = stored
            event("came back for its start" if not waits else "back early for its start")
            return
        if kept is not None:  # came back more than max late after it: a new one
            assert t1 - kept > late, (kept, t1, late)
        # (a slot kept lies after any pause: one it overtook gets a new slot)
        floor = max(slot, started + min(need, self.size) - self.size, last_start)
        assert max(floor, t0) <= start <= max(floor, t1), (start, floor, t0, t1)
        if waits:
            assert start - t0 > soon, (start, t0, soon)
            self.waiting.add(request)
        else:
            assert start - t1 <= soon, (start, t1, soon)
            self.waiting.discard(request)
        expect = {"started": max(started, start) + need, "last_start": start}
        if not stored:  # (a start costing 0 noted now says nothing more)
            assert expect["started"] <= t1, (stored, expect)
            expect = {}
        assert stored == expect, (stored, expect)
        self.counted = expect
        self.starts[request] = start
        self.start_charges.append((start, need, 0))
        if waits:
            event("start kept for it to come back")
        else:
            event("late start noted" if start - slot > late else "start noted")

    def new_slot(
        self,
        request: str,
        cost: float,
        max_delay: float | None,
        got: Reservation,
        t0: int,
        t1: int,
        after: dict[str, int],
        record: tuple[int, float] | None,
        counting: bool = False,
    ) -> None:
        need = math.ceil(cost * self.interval)
        beyond = 0  # (a cost above the burst starts on a full bucket: no wait beyond it)
        tat, last, paused = self.field("tat"), self.field("last"), self.field("paused")
        floor = max(tat + min(need, self.size) - self.size, last, paused)
        lo, hi = max(t0 + beyond, floor), max(t1 + beyond, floor)
        delay_ms = _delay_ms(got)
        if not got.granted:
            limit_ms = _ms(max_delay)
            assert limit_ms is not None and delay_ms > limit_ms, (got, max_delay)
            assert lo // 1000 <= got.slot_ms <= hi // 1000, (got, lo, hi)
            assert record is None, record
            if after:  # a refusal writes nothing
                assert after == self.bucket, (after, self.bucket)
            event("refused")
            return
        assert record is not None and record[1] == cost, (record, cost)
        slot = record[0]
        assert lo <= slot <= hi, (slot, lo, hi, self.bucket, t0, t1, need)
        assert got.cost == cost and (got.rate, got.burst) == (self.rate, self.burst)
        # The slot tells the time the script read, or bounds it.
        now_lo, now_hi = (slot - beyond, slot - beyond) if slot > floor else (t0, slot - beyond)
        now_hi = min(now_hi, t1)
        assert t0 <= now_lo <= now_hi <= t1, (now_lo, now_hi, t0, t1)
        if counting and (got.started or slot <= t1):  # due: its start is check_start's
            assert got.slot_ms >= slot // 1000, (got, slot)
        else:
            assert got.slot_ms == slot // 1000, (got, slot)
            d_lo, d_hi = _delay_range(slot, now_lo, now_hi)
            assert d_lo <= delay_ms <= d_hi, (got, d_lo, d_hi)
            if max_delay is not None:
                assert delay_ms <= _ms(max_delay)  # type: ignore[operator]
        assert slot >= self.highest and slot >= last  # first come, first served
        if slot == last > max(tat + min(need, self.size) - self.size, paused, now_hi + beyond):
            event("not before the last slot (limits changed)")
        self.highest = slot
        expect = {"tat": (max(tat, slot) + need,) * 2, "last": (slot, slot)}
        if paused > now_lo and (paused > now_hi or "paused" in after):
            expect["paused"] = (paused, paused)  # still on (else dropped)
        self.adopt(after, expect, t0)
        self.records[request] = (slot, cost)
        self.charges.append((slot, need))
        event("queued" if delay_ms else "started at once")

    @rule(target=requests, cost=st.sampled_from(COSTS), max_delay=st.sampled_from(DELAYS))
    def reserve_new(self, cost: float, max_delay: float | None) -> str:
        self.count += 1
        request = f"r{self.count}"
        self.reserve(request, cost, max_delay, None)
        return request

    @rule(
        request=requests,
        cost=st.sampled_from(COSTS),
        max_delay=st.sampled_from(DELAYS),
        max_late=st.sampled_from(LATES),
    )
    def reserve_again(
        self, request: str, cost: float, max_delay: float | None, max_late: float | None
    ) -> None:
        self.reserve(request, cost, max_delay, max_late)

    @rule(request=requests, max_delay=st.sampled_from(DELAYS), max_late=st.sampled_from(LATES[1:4]))
    def reserve_again_late(self, request: str, max_delay: float | None, max_late: float) -> None:
        """As a task published again with its delay that starts late: waits (if its slot is
        near) until the slot passed more than ``max_late`` ago, then asks again."""
        old = self.records.get(request)
        if old is not None and old[0] - self.now() <= 30_000:
            while self.now() <= old[0] + max_late * 1_000_000:
                time.sleep(0.002)
        self.reserve(request, 1.0, max_delay, max_late)

    # -- settle, pause, resume -----------------------------------------------------------------

    @rule(
        request=st.one_of(requests, st.just("ghost")),
        actual=st.sampled_from((0.0, *COSTS)),
        estimate=st.sampled_from(COSTS),
    )
    def settle(self, request: str, actual: float, estimate: float) -> None:
        if request == "ghost":  # a request no longer remembered
            self.count += 1
            request = f"ghost{self.count}"
        old = self.records.get(request)
        reserved = old[1] if old else estimate
        tat, last, paused = self.field("tat"), self.field("last"), self.field("paused")
        t0 = self.now()
        self.limit.settle(request, actual, estimate=estimate)
        t1 = self.now()
        after, record = self.stored(), self.stored_record(request)
        assert record is not None and record[1] == actual, (record, actual)
        if old is not None:
            assert record[0] == old[0]
            now_lo, now_hi = t0, t1
        else:
            assert t0 <= record[0] <= t1  # written at the time the script read
            now_lo = now_hi = record[0]
        if actual > reserved:
            charged = math.ceil((actual - reserved) * self.interval)
        elif actual < reserved:
            charged = -math.floor((reserved - actual) * self.interval)
        else:
            charged = 0

        def new_tat(now: int) -> int:
            full = max(tat, now)
            return full + charged if charged >= 0 else max(full + charged, now)

        expect: dict[str, tuple[int, int]] = {}
        alive_lo = max(new_tat(now_lo), last, paused if paused > now_lo else 0) > now_lo
        alive_hi = max(new_tat(now_hi), last, paused if paused > now_hi else 0) > now_hi
        # The starts noted owe or get back the same, while they say anything.
        started = self.counted.get("started", 0)
        counted = self.stored_counted()
        if counted:  # (they keep the bucket while they say anything)
            alive_lo = alive_hi = True
        if started > now_hi:
            lo = started + charged if charged >= 0 else max(started + charged, now_lo)
            hi = started + charged if charged >= 0 else max(started + charged, now_hi)
            if not counted:  # given back down to now: they say nothing more
                assert charged < 0 and started + charged <= now_hi, (counted, started, charged)
            else:
                assert counted["last_start"] == self.counted["last_start"], counted
                assert lo <= counted["started"] <= hi, (counted, lo, hi)
        elif not counted or started <= now_lo:
            assert not counted or counted == self.counted, (counted, self.counted)
        # Owed or given back by the starts noted: as for the slots, the charge unclamped.
        if charged and (counted or (started > now_lo and charged < 0)):
            self.start_charges.append((None, charged, 0))
        self.counted = counted
        if alive_hi or (alive_lo and after):
            expect = {"tat": (new_tat(now_lo), new_tat(now_hi)), "last": (last, last)}
            if paused > now_lo and (paused > now_hi or "paused" in after):
                expect["paused"] = (paused, paused)
        self.adopt(after, expect, t0)
        self.records[request] = (record[0], actual)
        self.charges.append((None, charged))
        event("settled: more" if charged > 0 else "settled: less" if charged < 0 else "settled")

    @rule(ms=st.sampled_from((5, 20, 50)))
    def pause(self, ms: int) -> None:
        tat, last, paused = self.field("tat"), self.field("last"), self.field("paused")
        t0 = self.now()
        usage = self.limit.pause(ms / 1000)
        t1 = self.now()
        self.adopt_counted(t0, t1)
        span = ms * 1000
        self.adopt(
            self.stored(),
            {
                "tat": (max(tat, t0), max(tat, t1)),
                "last": (last, last),
                "paused": (max(paused, t0 + span), max(paused, t1 + span)),
            },
            t0,
        )
        assert usage.paused_for > 0
        event("pause kept a longer one" if self.field("paused") == paused else "paused")

    @rule()
    def resume(self) -> None:
        tat, last = self.field("tat"), self.field("last")
        t0 = self.now()
        usage = self.limit.resume()
        t1 = self.now()
        after = self.stored()
        expect: dict[str, tuple[int, int]] = {}
        alive_hi, alive_lo = self.counting(t1), self.counting(t0)
        self.adopt_counted(t0, t1)
        if max(tat, last) > t1 or alive_hi or ((max(tat, last) > t0 or alive_lo) and after):
            expect = {"tat": (max(tat, t0), max(tat, t1)), "last": (last, last)}
        self.adopt(after, expect, t0)
        assert usage.paused_for == 0.0

    # -- limits set at runtime -----------------------------------------------------------------

    @rule(rate=st.sampled_from((None, *RATES)), burst=st.sampled_from((None, *BURSTS)))
    def change_runtime_limits(self, rate: Rate | None, burst: int | None) -> None:
        """Sets a rate and/or a burst at runtime; neither: clears them (the code's apply)."""
        if rate is None and burst is None:
            state = clear_limits(self.client, self.limit.name)
            self.runtime = (None, None)
            event("limits cleared")
        else:
            state = set_limits(self.client, self.limit.name, rate=rate, burst=burst)
            self.runtime = (rate or self.runtime[0], burst or self.runtime[1])
            event("limits set at runtime")
        assert (state.rate, state.burst) == self.runtime
        self.apply()

    @rule(ms=st.sampled_from((1, 5, 25)))
    def sleep(self, ms: int) -> None:
        time.sleep(ms / 1000)  # (a step of the model: time passing, which the bucket refills by)

    @rule()
    def usage(self) -> None:
        tat, last, paused = self.field("tat"), self.field("last"), self.field("paused")
        t0 = self.now()
        usage = self.limit.usage()
        t1 = self.now()
        beyond = max(0, self.interval - self.size)
        floor = max(tat + self.interval - self.size, last, paused)
        lo, hi = max(t0 + beyond, floor), max(t1 + beyond, floor)
        assert lo // 1000 <= usage.next_slot_ms <= hi // 1000, (usage, lo, hi)
        assert (usage.rate, usage.burst) == (self.rate, self.burst)
        if paused > t1:
            assert (paused - t1) / 1e6 - 0.002 <= usage.paused_for <= (paused - t0) / 1e6 + 0.002
        elif paused <= t0:
            assert usage.paused_for == 0.0
        owed_lo, owed_hi = max(tat - t1, 0) / self.interval, max(tat - t0, 0) / self.interval
        slack = 1000 / self.interval + 0.01  # read in whole ms
        assert self.burst - owed_hi - slack <= usage.available <= self.burst - owed_lo + slack

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def the_bucket_and_records_are_the_models(self) -> None:
        if not hasattr(self, "limit"):
            return
        stored = self.stored()
        if not stored:  # expired: only once it said nothing
            assert self.stale(self.now()), self.bucket
            self.bucket = {}
        else:
            assert stored == self.bucket, (stored, self.bucket)
        counted = self.stored_counted()
        if counted != self.counted:  # (expired with the bucket, once they said nothing)
            assert not counted and not self.counting(self.now()), (counted, self.counted)
            self.counted = {}
        prefix = self.keys.rate_request("")
        found = {
            key.decode()[len(prefix) :]: self.stored_record(key.decode()[len(prefix) :])
            for key in self.client.scan_iter(match=f"{prefix}*")
        }
        assert found == self.records, (found, self.records)

    @invariant()
    def no_window_holds_more_than_the_bucket_and_the_rate(self) -> None:
        """For grants i before j: everything charged from i up to j, and j's need up to a full
        bucket, <= size + slot_j - slot_i. (A grant costing more than the burst starts on a
        full bucket: the grants after it pay the rest back.)"""
        charges = getattr(self, "charges", [])
        size = getattr(self, "size", 0)
        for i, (first, need) in enumerate(charges):
            if first is None:
                continue
            total = need
            for later, charged in charges[i + 1 :]:
                if later is not None:
                    within = total + min(charged, size)
                    assert within <= size + later - first, (first, later, within, charges)
                total += charged

    @invariant()
    def no_window_holds_more_starts_than_the_bucket_the_rate_and_late(self) -> None:
        """As above, for the starts noted."""
        charges = getattr(self, "start_charges", [])
        size = getattr(self, "size", 0)
        for i, (first, need, _) in enumerate(charges):
            if first is None:
                continue
            total = need
            for later, charged, late in charges[i + 1 :]:
                if later is not None:
                    within = total + min(charged, size)
                    assert within <= size + late + later - first, (first, later, within, charges)
                total += charged

    @invariant()
    def new_slots_never_go_back(self) -> None:
        slots = [slot for slot, _ in getattr(self, "charges", []) if slot is not None]
        assert slots == sorted(slots), slots


def test_rate_limit_matches_model(redis_server: RedisServer) -> None:
    """Random reservations, repeats, late starts, settles, pauses and usage reads agree with
    the model."""
    client = redis.Redis.from_url(redis_server.url)
    machine = type("RateModelRun", (RateModel,), {"client": client})
    try:
        run_state_machine_as_test(machine, settings=SETTINGS)
    finally:
        client.close()
