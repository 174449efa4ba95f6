"""Model-based test of the rate limit: random reservations (new and repeated requests, with and
without ``max_delay`` and ``max_late``), usage reads and pauses, against a plain-Python model,
on a real Redis with its real clock.

The server's time cannot be set, but each answer tells it: a slot is never before the time
the script read (``slot = max(now, ...)``), and the delay is ``slot - now``, so ``now`` is
``slot - delay`` whenever the script chose a new slot or the slot lies ahead. With that ``now``
the model predicts every answer exactly: the slot, whether it is refused, whether a late
request gives its slot up. After every step the window in Redis must equal the model's, and
hold at most ``limit`` slots in any ``per`` ms; new slots never go back in time.
"""

from __future__ import annotations

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
from celery_redislock.core.rate import Rate, RateLimit, Reservation

SETTINGS = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    database=None,  # no example database in the working tree; failures print their steps
    phases=[Phase.explicit, Phase.generate],  # no shrinking: see test_model.py
    suppress_health_check=[HealthCheck.too_slow],
)

# Short windows, so that pauses of a few ms let slots leave them and requests go late.
RATES = (Rate(1, 0.02), Rate(2, 0.05), Rate(3, 0.03), Rate(4, 0.1))
DELAYS = (None, 0.0, 0.01, 0.05, 10.0)  # max_delay
LATES = (None, 0.0, 0.005, 0.03, 10.0)  # max_late


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


class RateModel(RuleBasedStateMachine):
    """One fresh rate limit per example; the subclass made per test sets ``client``."""

    client: ClassVar[redis.Redis]
    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[str, int] = {}  # request id -> its slot (the model's window)
        self.highest = 0  # the latest slot handed to a new request so far
        self.count = 0

    @initialize(rate=st.sampled_from(RATES))
    def start(self, rate: Rate) -> None:
        self.rate = rate
        self.per = rate.per_ms
        self.limit = RateLimit(self.client, f"rate-{uuid.uuid4().hex[:12]}", rate)

    def expected_slot(self, now: int) -> int:
        """The slot a new request gets at server time ``now``."""
        ordered = sorted(self.held.values(), reverse=True)
        slot = max(now, ordered[0]) if ordered else now
        if len(ordered) >= self.rate.limit:
            slot = max(slot, ordered[self.rate.limit - 1] + self.per)
        return slot

    def check_new(
        self, request: str, got: Reservation, max_delay: float | None, t0: int, t1: int
    ) -> None:
        """Checks an answer that chose a new slot (``request`` is not in the window now)."""
        delay_ms = round(got.delay * 1000)
        now = got.slot_ms - delay_ms
        assert t0 <= now <= t1, (t0, now, t1)
        assert got.slot_ms == self.expected_slot(now), (got, self.held, now)
        refuse = max_delay is not None and delay_ms > int(max_delay * 1000)
        assert got.granted is not refuse, (got, max_delay)
        event("refused" if refuse else "queued" if delay_ms else "started at once")
        if got.granted:
            assert got.slot_ms >= self.highest  # first come, first served
            self.highest = got.slot_ms
            self.held[request] = got.slot_ms

    @rule(target=requests, max_delay=st.sampled_from(DELAYS))
    def reserve_new(self, max_delay: float | None) -> str:
        self.count += 1
        request = f"r{self.count}"
        t0 = server_ms(self.client)
        got = self.limit.reserve(request, max_delay=max_delay)
        self.check_new(request, got, max_delay, t0, server_ms(self.client))
        return request

    @rule(request=requests, max_delay=st.sampled_from(DELAYS), max_late=st.sampled_from(LATES))
    def reserve_again(self, request: str, max_delay: float | None, max_late: float | None) -> None:
        self.again(request, max_delay, max_late)

    @rule(request=requests, max_delay=st.sampled_from(DELAYS), max_late=st.sampled_from(LATES[1:4]))
    def reserve_again_late(self, request: str, max_delay: float | None, max_late: float) -> None:
        """As a task published again with its delay that starts late: waits (if its slot is
        near) until the slot passed more than ``max_late`` ago, then asks again."""
        old = self.held.get(request)
        if old is not None and old - server_ms(self.client) <= 30:
            while server_ms(self.client) <= old + max_late * 1000:
                time.sleep(0.002)
        self.again(request, max_delay, max_late)

    def again(self, request: str, max_delay: float | None, max_late: float | None) -> None:
        t0 = server_ms(self.client)
        got = self.limit.reserve(request, max_delay=max_delay, max_late=max_late)
        t1 = server_ms(self.client)
        old = self.held.get(request)
        if old is None:  # refused before, or given up: a new request, as far as Redis knows
            self.check_new(request, got, max_delay, t0, t1)
            return
        if got.granted and got.slot_ms == old:  # kept (a new slot would be after now > old)
            assert max(old - t1, 0) <= round(got.delay * 1000) <= max(old - t0, 0)
            if max_late is not None:
                assert t0 - old <= max_late * 1000, "a late request kept its slot"
            event("repeat kept its slot")
            return
        # Given up: only a request whose slot passed more than max_late ago.
        assert max_late is not None, (got, old)
        del self.held[request]
        self.check_new(request, got, max_delay, t0, t1)
        now = got.slot_ms - round(got.delay * 1000)
        assert now - old > max_late * 1000, (now, old, max_late)
        event("late: slot given up")

    @rule(ms=st.sampled_from((1, 5, 25)))
    def pause(self, ms: int) -> None:
        time.sleep(ms / 1000)

    @rule()
    def usage(self) -> None:
        t0 = server_ms(self.client)
        usage = self.limit.usage()
        now = usage.next_slot_ms - round(usage.next_delay * 1000)
        assert t0 <= now <= server_ms(self.client)
        assert usage.next_slot_ms == self.expected_slot(now)
        slots = self.held.values()
        assert usage.started == sum(now - self.per < s <= now for s in slots)
        assert usage.ahead == sum(s > now for s in slots)

    @invariant()
    def the_window_is_the_models(self) -> None:
        if not hasattr(self, "limit"):
            return
        stored = self.client.zrange(self.limit.key, 0, -1, withscores=True)
        assert {m.decode(): int(s) for m, s in stored} == self.held  # type: ignore[union-attr,str-unpack]

    @invariant()
    def no_window_holds_more_than_limit(self) -> None:
        ordered = sorted(self.held.values())
        n = self.rate.limit if hasattr(self, "rate") else 0
        for i in range(n, len(ordered)):
            assert ordered[i] - ordered[i - n] >= self.per, (ordered, self.rate)


def test_rate_limit_matches_model(redis_server: RedisServer) -> None:
    """Random reservations, repeats, late starts and usage reads agree with the model."""
    client = redis.Redis.from_url(redis_server.url)
    machine = type("RateModelRun", (RateModel,), {"client": client})
    try:
        run_state_machine_as_test(machine, settings=SETTINGS)
    finally:
        client.close()
