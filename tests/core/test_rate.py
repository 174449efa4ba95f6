"""Fleet-wide rate limits (celery_redislock.core.rate): the GCRA bucket on a real Redis, with
costs, a burst, settling, pauses and limits set at runtime; under threads and processes,
through lost replies and with Redis down; and the parsing of rates, bursts and costs.

Exact checks read the bucket (``tat``, ``last``, ``paused``, in server microseconds) and the
request records (``slot_us cost``) that ``lua/rate.lua`` writes: when a slot lies ahead of the
server's time it is fixed by the bucket alone, so it can be predicted to the microsecond.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import random
import threading
from collections.abc import Iterator
from fractions import Fraction
from multiprocessing.synchronize import Event

import pytest
import redis
from faultproxy import FaultProxy
from helpers import wait_for
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from celery_redislock import LockBackendError, LockConfigError
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.admin import clear_limits, set_limits
from celery_redislock.core.keys import LockKeys
from celery_redislock.core.rate import Rate, RateLimit, parse_rate, reserve_all
from celery_redislock.core.rate_options import check_burst, check_cost
from celery_redislock.core.scripts import script

KEEP_MS = 30_000  # _bucket.lua: how long a request is remembered after its slot
GRACE_MS = 1000  # _time.lua


def server_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1_000_000 + micros


def server_ms(client: redis.Redis) -> int:
    return server_us(client) // 1000


def interval_us(rate: Rate) -> int:
    """rate.lua's interval: whole microseconds per unit, rounded up."""
    return -(-rate.per_ms * 1000 // rate.limit)


def bucket(client: redis.Redis, limit: RateLimit) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(limit.key).items()}  # type: ignore[union-attr]


def record(client: redis.Redis, limit: RateLimit, request: str) -> tuple[int, float] | None:
    """A request's record: its slot (us) and cost; None if it is not remembered."""
    raw = client.get(LockKeys.of(limit.namespace, limit.name).rate_request(request))
    if raw is None:
        return None
    slot, cost, *_ = raw.decode().split()  # type: ignore[union-attr]
    return int(slot), float(cost)


def started_us(client: redis.Redis, limit: RateLimit, request: str) -> int | None:
    """The start a request's record notes (``slot_us cost start_us``), if it started."""
    raw = client.get(LockKeys.of(limit.namespace, limit.name).rate_request(request))
    assert raw is not None, f"request {request!r} has no record"
    fields = raw.decode().split()  # type: ignore[union-attr]
    return int(fields[2]) if len(fields) > 2 else None


def waits(client: redis.Redis, limit: RateLimit, request: str) -> bool:
    """Whether a request's start is kept for it to come back to (``slot_us cost start_us w``)."""
    raw = client.get(LockKeys.of(limit.namespace, limit.name).rate_request(request))
    return raw is not None and raw.decode().endswith(" w")  # type: ignore[union-attr]


def slot_us(client: redis.Redis, limit: RateLimit, request: str) -> int:
    got = record(client, limit, request)
    assert got is not None, f"request {request!r} has no record"
    return got[0]


def overfull(
    grants: list[tuple[int, float]], burst: int, limit: int, per_ms: int
) -> list[tuple[int, int]]:
    """Windows that hold more than the limit allows: pairs of slots ``(a, b)`` (us, ``a < b``
    in slot order, at least two grants) such that the costs of the grants with slots from ``a``
    to ``b`` add up to more than ``burst + (b - a) * limit / per``. Empty when the invariant
    holds. (A single call costing more than the burst is alone in its window: it waited for
    the units beyond a full bucket before its slot, so it is not counted on its own.)"""
    ordered = sorted(grants)
    per_us = per_ms * 1000
    bad = []
    for i, (first, cost) in enumerate(ordered):
        total = Fraction(cost)
        for later, more in ordered[i + 1 :]:
            total += Fraction(more)
            if total * per_us > burst * per_us + (later - first) * limit:
                bad.append((first, later))
    return bad


def loose(
    grants: list[tuple[int, float]], burst: int, rate: Rate, end_us: int
) -> list[tuple[int, int]]:
    """Slots reserved ahead (after ``end_us``, the server's time after every call: not free
    when asked) that are not exactly where the bucket allowed, replaying it in slot order:
    ``max(tat + need - size, last slot)``. Pairs (slot, expected). Empty when the slots are as
    tight as the rate allows. (For burst 1 and costs of at least 1 unit, where slots never
    tie.)"""
    interval = interval_us(rate)
    size = burst * interval
    tat = last = 0
    bad = []
    for slot, cost in sorted(grants):
        need = math.ceil(cost * interval)
        expected = max(tat + need - size, last)
        if slot > end_us and slot != expected:
            bad.append((slot, expected))
        tat, last = max(tat, slot) + need, slot
    return bad


# -- parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "limit", "per"),
    [
        ("100/m", 100, 60.0),
        ("100/min", 100, 60.0),
        ("100/minute", 100, 60.0),
        ("10/s", 10, 1.0),
        ("5/2s", 5, 2.0),
        ("1000/h", 1000, 3600.0),
        ("50/d", 50, 86400.0),
        ("100/60", 100, 60.0),
        ("3/0.5", 3, 0.5),
        ("3/1.5h", 3, 5400.0),
        (" 7 / 10 s ", 7, 10.0),
        ("1/S", 1, 1.0),
        ("100000/h", 100_000, 3600.0),
        ("1000000/s", 1_000_000, 1.0),  # the fastest rate
        ("1000000000/d", 1_000_000_000, 86400.0),  # the largest limit
    ],
)
def test_parse_rate_reads_every_documented_form(text: str, limit: int, per: float) -> None:
    assert parse_rate(text) == Rate(limit, per)


def test_parse_rate_passes_a_rate_through() -> None:
    rate = Rate(3, 2)
    assert parse_rate(rate) is rate
    assert str(rate) == "3/2s" and rate.per == 2.0 and isinstance(rate.per, float)


@pytest.mark.parametrize(
    "value",
    [
        "100",
        "100/",
        "/m",
        "100/x",
        "100/60 fortnights",
        "1.5/m",
        "-1/m",
        "100/m/s",
        "",
        100,
        None,
        (100, 60),
        1.5,
        True,
    ],
)
def test_parse_rate_refuses_what_is_not_a_rate_naming_the_forms(value: object) -> None:
    with pytest.raises(LockConfigError) as info:
        parse_rate(value, what="task 'x': option 'rate'")
    message = str(info.value)
    assert message.startswith("task 'x': option 'rate' must be '<limit>/<period>'"), message
    assert "'100/m'" in message and "'5/2s'" in message and "Rate(limit, per)" in message
    assert message.endswith(f"got {value!r}"), message


@pytest.mark.parametrize("value", ["0/m", "1000000001/d", "2000000000/7d"])
def test_a_limit_out_of_range_is_refused_saying_why(value: str) -> None:
    with pytest.raises(LockConfigError) as info:
        parse_rate(value, name="api")
    message = str(info.value)
    assert "the limit must be an integer from 1 to 1,000,000,000" in message, message
    assert repr(value) in message, message
    assert info.value.name == "api"


@pytest.mark.parametrize("value", ["1000001/s", "2000/0.001", "100000000/60"])
def test_a_rate_faster_than_a_million_units_a_second_is_refused(value: str) -> None:
    with pytest.raises(LockConfigError) as info:
        parse_rate(value, name="api")
    message = str(info.value)
    assert "at most 1,000,000 units a second" in message and "count in larger units" in message
    assert repr(value) in message and info.value.name == "api"


@pytest.mark.parametrize("value", ["1/0", "1/0s", "1/0.0004", "1/8d", "1/700000"])
def test_a_period_out_of_range_is_refused(value: str) -> None:
    with pytest.raises(LockConfigError, match=r"period must be a number of seconds from 0\.001"):
        parse_rate(value)


@pytest.mark.parametrize(
    ("limit", "per"),
    [(0, 1), (True, 1), (1.0, 1), (1, 0), (1, -1), (1, math.nan), (1, math.inf), (1, "1")],
)
def test_rate_checks_its_fields(limit: object, per: object) -> None:
    with pytest.raises(LockConfigError, match=r"^rate: the (limit|period) must be"):
        Rate(limit, per)  # type: ignore[arg-type]


def test_the_window_in_ms_is_rounded_up() -> None:
    assert Rate(1, 0.0015).per_ms == 2  # a longer window never lets more in
    assert Rate(1, 0.3).per_ms == 300  # 0.3 * 1000 is 300.00000000000006 as a float
    assert Rate(1, 60).per_ms == 60_000


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2", None, 1_000_000_001])
def test_a_burst_out_of_range_is_refused(value: object) -> None:
    with pytest.raises(LockConfigError, match=r"^burst must be an integer from 1 to 1,000,000,000"):
        check_burst(value)


@pytest.mark.parametrize("value", [-0.5, math.nan, math.inf, "1", True, None, 1e9 + 1])
def test_a_cost_out_of_range_is_refused(value: object) -> None:
    with pytest.raises(LockConfigError, match=r"^cost must be a number from 0 to 1,000,000,000"):
        check_cost(value)
    assert check_cost(0) == 0.0 and check_cost(2.5) == 2.5 and check_cost(10**9) == 1e9


# -- arguments ---------------------------------------------------------------------------------


def test_bad_arguments_are_refused_early_and_send_nothing(client: redis.Redis) -> None:
    with pytest.raises(LockConfigError, match=r"client must be a redis\.Redis"):
        RateLimit("redis://", "api", "1/s")  # type: ignore[arg-type]
    with pytest.raises(LockConfigError, match="name must be a non-empty string"):
        RateLimit(client, "", "1/s")
    with pytest.raises(LockConfigError, match="must not start with '}'"):
        RateLimit(client, "}x", "1/s")
    with pytest.raises(LockConfigError, match="namespace must be"):
        RateLimit(client, "api", "1/s", namespace="a{b")
    with pytest.raises(LockConfigError, match="rate must be") as info:
        RateLimit(client, "api", "fast")
    assert info.value.name == "api"
    for burst in (0, True, 2.0, 10**9 + 1):
        with pytest.raises(LockConfigError, match="burst must be an integer") as info:
            RateLimit(client, "api", "1/s", burst=burst)  # type: ignore[arg-type]
        assert info.value.name == "api"
    limit = RateLimit(client, "api", "1/s")
    for bad in ("", None, 42):
        with pytest.raises(LockConfigError, match="request_id must be a non-empty string"):
            limit.reserve(bad)  # type: ignore[arg-type]
        with pytest.raises(LockConfigError, match="request_id must be a non-empty string"):
            limit.settle(bad, 1)  # type: ignore[arg-type]
    wrong: object
    for wrong in (-1, math.nan, "1", True, 31 * 86400):
        with pytest.raises(LockConfigError, match="max_delay must be a number of seconds"):
            limit.reserve("r", max_delay=wrong)  # type: ignore[arg-type]
    for wrong in (-1, math.nan, "1", True, 86401):
        with pytest.raises(LockConfigError, match="max_late must be a number of seconds"):
            limit.reserve("r", max_late=wrong)  # type: ignore[arg-type]
    for wrong in (-1, math.nan, math.inf, "1", True, 1e9 + 1):
        with pytest.raises(LockConfigError, match="cost must be a number from 0") as info:
            limit.reserve("r", cost=wrong)  # type: ignore[arg-type]
        assert info.value.name == "api"
        with pytest.raises(LockConfigError, match="cost must be a number from 0"):
            limit.settle("r", wrong)  # type: ignore[arg-type]
        with pytest.raises(LockConfigError, match="estimate must be a number from 0"):
            limit.settle("r", 1, estimate=wrong)  # type: ignore[arg-type]
    for wrong in (0, -1, math.nan, math.inf, "1", True, 30 * 86400 + 1):
        with pytest.raises(LockConfigError, match="pause must be a number of seconds") as info:
            limit.pause(wrong)  # type: ignore[arg-type]
        assert info.value.name == "api"
    assert client.keys("*") == []  # nothing was sent


def test_names_keys_and_hash_tag(client: redis.Redis) -> None:
    limit = RateLimit(client, "sync:{42}", "5/2s", namespace="ns")
    assert limit.name == "sync:{42}" and limit.rate == Rate(5, 2.0) and limit.burst == 1
    keys = LockKeys.of("ns", "sync:{42}")
    assert limit.key == keys.bucket == "ns:{sync:{42}}:bucket"
    assert keys.limits == "ns:{sync:{42}}:limits"
    assert keys.rate_request("job-1") == "ns:{sync:{42}}:r:job-1"
    # One slot with the lock of the same name: a script may touch them all on a Redis Cluster.
    slot = key_slot(keys.leases.encode())
    for key in (limit.key, keys.limits, keys.rate_request("job-1"), keys.rate_request("")):
        assert key_slot(key.encode()) == slot, key
    assert repr(limit) == "RateLimit('sync:{42}', '5/2s', namespace='ns')"
    wide = RateLimit(client, "api", "5/2s", burst=3)
    assert repr(wide) == "RateLimit('api', '5/2s', burst=3, namespace='redislock')"
    # What one reservation writes: the bucket and the request's record, nothing else.
    limit.reserve("job-1")
    assert sorted(client.keys("*")) == sorted(
        [limit.key.encode(), keys.rate_request("job-1").encode()]
    )
    assert set(bucket(client, limit)) == {"tat", "last"}


# -- slots -------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3])
def test_slots_are_handed_out_in_order_and_as_tight_as_the_rate(
    client: redis.Redis, n: int
) -> None:
    rate = Rate(n, 10)
    limit = RateLimit(client, "api", rate)
    interval = interval_us(rate)
    calls = 3 * n + 1
    before = server_us(client)
    got = [limit.reserve(f"r{i}") for i in range(calls)]
    after = server_us(client)
    slots = [slot_us(client, limit, f"r{i}") for i in range(calls)]
    assert all(g.granted and g.cost == 1.0 and g.burst == 1 and g.rate == rate for g in got)
    assert [g.slot_ms for g in got] == [s // 1000 for s in slots]
    # The first starts now; each next one an interval later: exactly, not later.
    assert before <= slots[0] <= after and got[0].delay == 0.0
    assert [b - a for a, b in itertools.pairwise(slots)] == [interval] * (calls - 1)
    for g, s in zip(got[1:], slots[1:], strict=True):
        assert math.ceil((s - after) / 1000) <= g.delay * 1000 <= math.ceil((s - before) / 1000)
    state = bucket(client, limit)
    assert state == {"tat": slots[-1] + interval, "last": slots[-1]}


def test_a_burst_starts_at_once_then_slots_are_spaced(client: redis.Redis) -> None:
    rate = Rate(1, 10)
    limit = RateLimit(client, "api", rate, burst=3)
    interval = interval_us(rate)
    before = server_us(client)
    got = [limit.reserve(f"r{i}") for i in range(6)]
    after = server_us(client)
    slots = [slot_us(client, limit, f"r{i}") for i in range(6)]
    assert all(g.granted and g.burst == 3 for g in got)
    assert [g.delay for g in got[:3]] == [0.0] * 3
    assert all(before <= s <= after for s in slots[:3])
    assert slots == sorted(slots)
    # The bucket emptied: one unit comes back an interval after the first start.
    assert slots[3:] == [slots[0] + interval, slots[0] + 2 * interval, slots[0] + 3 * interval]
    assert overfull(list(zip(slots, [1.0] * 6, strict=True)), 3, 1, rate.per_ms) == []


def test_a_free_bucket_starts_at_once(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "1/0.5s")
    limit.reserve("a")
    second = limit.reserve("b")
    assert second.delay > 0
    wait_for(lambda: server_ms(client) > second.slot_ms + 500, "the bucket refilled")
    now = server_us(client)
    later = limit.reserve("c")
    assert later.delay == 0.0 and slot_us(client, limit, "c") >= now


def test_a_call_costing_3_takes_3_units_of_the_bucket(client: redis.Redis) -> None:
    # 10 per 100 s: as 10/s, with time 100 times slower, so that a loaded machine cannot let
    # the server's clock overtake the slots (the figures below, in s, are 0.3 s at 10/s).
    rate = Rate(10, 100)  # an interval of 10 s
    limit = RateLimit(client, "api", rate)
    first = limit.reserve("first")
    heavy = limit.reserve("heavy", cost=3)
    limit.reserve("after")
    assert heavy.granted and heavy.cost == 3.0 and first.cost == 1.0
    a, h, n = (slot_us(client, limit, r) for r in ("first", "heavy", "after"))
    assert record(client, limit, "heavy") == (h, 3.0)
    # Burst 1: a call costing more than the bucket holds starts once the bucket is full again
    # (one interval after the first) ...
    assert h - a == 10_000_000
    # ... and the call after it waits until its 3 units are paid back.
    assert n - h == 30_000_000
    assert bucket(client, limit)["tat"] == n + 10_000_000


def test_a_cost_above_the_burst_starts_on_a_full_bucket_and_is_paid_back(
    client: redis.Redis,
) -> None:
    limit = RateLimit(client, "api", "10/100s", burst=2)  # a unit every 10 s
    t0 = server_us(client)
    big = limit.reserve("big", cost=5)
    t1 = server_us(client)
    slot = slot_us(client, limit, "big")
    # A full bucket holds 2 units: a call of 5 starts on it (it could never hold 5) ...
    assert t0 <= slot <= t1 and big.granted and big.delay == 0.0
    # ... and owes the bucket 5 units: the calls after it wait until they are paid back, so
    # the average stays the rate (a call of 5 every 50 s).
    assert bucket(client, limit) == {"tat": slot + 50_000_000, "last": slot}
    refused = limit.reserve("too-big", cost=5, max_delay=40)
    assert not refused.granted and 45 < refused.delay <= 50
    assert record(client, limit, "too-big") is None
    second = limit.reserve("second", cost=5)
    assert slot_us(client, limit, "second") == slot + 50_000_000 and second.delay > 45


def test_a_call_costing_nothing_takes_no_unit_but_keeps_the_order(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "1/60s")
    limit.reserve("a")
    queued = limit.reserve("b")
    state = bucket(client, limit)
    free = limit.reserve("free", cost=0)
    # Not before the last slot handed out, and nothing taken from the bucket.
    assert free.granted and free.slot_ms == queued.slot_ms and free.cost == 0.0
    assert bucket(client, limit) == state
    assert record(client, limit, "free") == (slot_us(client, limit, "b"), 0.0)
    # On an idle bucket it starts now and leaves no bucket behind (it says nothing).
    idle = RateLimit(client, "idle", "1/60s")
    assert idle.reserve("z", cost=0).delay == 0.0
    assert not client.exists(idle.key) and record(client, idle, "z") is not None


def test_a_fractional_cost_takes_its_share_of_an_interval(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "1/10s")
    limit.reserve("a")
    limit.reserve("half", cost=0.5)
    limit.reserve("next")
    a, half, n = (slot_us(client, limit, r) for r in ("a", "half", "next"))
    assert (half - a, n - half) == (5_000_000, 10_000_000)


def test_a_request_asked_twice_takes_one_slot(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "1/60s")
    first = limit.reserve("job-1")
    queued = limit.reserve("job-2")
    assert queued.delay > 50
    state = bucket(client, limit)
    assert limit.reserve("job-1").slot_ms == first.slot_ms
    again = limit.reserve("job-2", cost=7)  # its cost was reserved once: a repeat takes nothing
    assert again.slot_ms == queued.slot_ms and again.granted
    assert 0 < again.delay <= queued.delay
    assert bucket(client, limit) == state
    assert record(client, limit, "job-2") == (slot_us(client, limit, "job-2"), 1.0)
    # The next new request comes after both: neither repeat took a slot.
    assert slot_us(client, limit, "job-2") - slot_us(client, limit, "job-1") == 60_000_000
    limit.reserve("job-3")
    assert slot_us(client, limit, "job-3") - slot_us(client, limit, "job-2") == 60_000_000


# The next two fail with rate.lua as changed at 07:08 (reserve in several limits at once): it
# starts from `slot = now` and refuses past max_delay after finding a kept record, so a repeat
# whose slot passed answers now, not its slot, and a request holding a slot further than
# max_delay is told "refused" while its slot stays taken (reported to the lead).


def test_a_repeat_after_its_slot_passed_answers_its_own_slot(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "1/60s")
    first = limit.reserve("job-1")
    wait_for(lambda: server_ms(client) > first.slot_ms + 5, "job-1's slot passed")
    again = limit.reserve("job-1")
    assert again.granted and again.delay == 0.0
    assert again.slot_ms == first.slot_ms  # its slot, not now


def test_a_request_holding_a_slot_keeps_it_whatever_max_delay(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "1/60s")
    limit.reserve("a")
    queued = limit.reserve("b")
    state = bucket(client, limit)
    again = limit.reserve("b", max_delay=1)
    # Refusing it would say "nothing reserved" while its slot stays taken in the bucket.
    assert again.granted and again.slot_ms == queued.slot_ms
    assert bucket(client, limit) == state and record(client, limit, "b") is not None


def test_max_delay_refuses_and_reserves_nothing(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "1/60s")
    assert limit.reserve("a", max_delay=0).granted  # a full bucket is now: within any max_delay
    state = bucket(client, limit)
    refused = limit.reserve("b", max_delay=5, cost=1)
    assert (refused.granted, refused.rate, refused.burst, refused.cost) == (
        False,
        Rate(1, 60),
        1,
        1.0,
    )
    assert 50 < refused.delay <= 60
    assert bucket(client, limit) == state and record(client, limit, "b") is None
    # The slot b was refused is still free: the next request gets it.
    taken = limit.reserve("c", max_delay=60)
    assert taken.granted and taken.slot_ms == refused.slot_ms
    assert slot_us(client, limit, "c") == slot_us(client, limit, "a") + 60_000_000
    # A request that holds a slot keeps it, whatever max_delay it asks with now.
    again = limit.reserve("c", max_delay=0)
    assert again.granted and again.slot_ms == taken.slot_ms


@pytest.mark.slow  # about 7 s on 2 quiet cores
def test_a_late_start_keeps_its_slot_when_the_starts_allow_it(client: redis.Redis) -> None:
    rate = Rate(1, 2)
    limit = RateLimit(client, "api", rate)
    interval = interval_us(rate)
    a = limit.reserve("a")
    limit.reserve("x")
    a_us, x_us = slot_us(client, limit, "a"), slot_us(client, limit, "x")
    assert x_us == a_us + interval
    booked = bucket(client, limit)
    # On time (within max_late): the same slot, nothing booked; the start is noted (now).
    on_time = limit.reserve("a", max_late=60)
    assert on_time.started and on_time.delay == 0 and on_time.slot_ms >= a.slot_ms
    assert slot_us(client, limit, "a") == a_us and bucket(client, limit)["tat"] == booked["tat"]
    assert started_us(client, limit, "a") is not None
    wait_for(lambda: server_us(client) > x_us + 1_200_000, "x's slot is 1.2 s past")
    # x starts late, far past max_late: no start since a's, so it keeps its slot and starts
    # now (nothing new is booked), rather than giving its slot up for one at the back.
    before = server_us(client)
    late = limit.reserve("x", max_late=0.05)
    x_start = started_us(client, limit, "x")
    assert late.granted and late.started and late.delay == 0 and x_start is not None
    assert before <= x_start <= server_us(client) and late.slot_ms == x_start // 1000
    assert slot_us(client, limit, "x") == x_us
    assert {k: booked[k] for k in ("tat", "last")} == {"tat": x_us + interval, "last": x_us}
    assert bucket(client, limit)["started"] == x_start + interval
    # Asked again (a lost reply): the same start, nothing more counted.
    state = bucket(client, limit)
    assert limit.reserve("x", max_late=0.05).slot_ms == late.slot_ms
    assert bucket(client, limit) == state
    # The next request, due at its slot, starts an interval after x's start, 1.2 s from now:
    # further than it waits in place (1 s), so that start is kept for it (' w') and it comes
    # back for it.
    y = limit.reserve("y", max_late=0.05)
    y_us = slot_us(client, limit, "y")
    assert y.granted and y_us == x_us + interval  # booked behind x
    assert started_us(client, limit, "y") is None  # not due: it comes back
    wait_for(lambda: server_us(client) > y_us, "y's slot is past")
    pushed = limit.reserve("y", max_late=0.05)
    assert pushed.slot_ms == (x_start + interval) // 1000 and pushed.delay > 1.05
    assert not pushed.started and waits(client, limit, "y")
    assert started_us(client, limit, "y") == x_start + interval
    assert slot_us(client, limit, "y") == y_us  # its one booking
    assert bucket(client, limit)["started"] == x_start + 2 * interval
    state = bucket(client, limit)
    again = limit.reserve("y", max_late=0.05)  # asked again: the same
    assert (again.slot_ms, again.started) == (pushed.slot_ms, False)
    wait_for(lambda: server_us(client) > x_start + interval, "y's start")
    came = limit.reserve("y", max_late=0.05)
    assert came.started and came.slot_ms == pushed.slot_ms and not waits(client, limit, "y")
    assert bucket(client, limit) == state  # nothing more noted
    # Due at its slot, z's start is 0.7 s ahead: within 1 s, it waits for it in place.
    limit.reserve("z", max_late=0.05)
    z_us = slot_us(client, limit, "z")
    assert z_us == y_us + interval
    wait_for(lambda: server_us(client) > z_us + 500_000, "z's slot is 0.5 s past")
    z = limit.reserve("z", max_late=0.05)
    assert z.started and z.slot_ms == (x_start + 2 * interval) // 1000 and 0.5 < z.delay < 1
    # A request refused by max_delay books nothing and drops nothing.
    state = bucket(client, limit)
    refused = limit.reserve("r", max_late=0.05, max_delay=0.1)
    assert not refused.granted and record(client, limit, "r") is None
    assert bucket(client, limit) == state


def test_a_start_asked_again_after_max_late_is_a_new_start(client: redis.Redis) -> None:
    rate = Rate(1, 1)
    limit = RateLimit(client, "api", rate)
    interval = interval_us(rate)
    first = limit.reserve("a", max_late=0.05)
    start = started_us(client, limit, "a")
    assert first.delay == 0 and start is not None
    wait_for(lambda: server_us(client) > start + 60_000, "a's start is past max_late")
    # A second run of the same request (a redelivered message): booked again, at the back.
    again = limit.reserve("a", max_late=0.05)
    assert slot_us(client, limit, "a") == start + interval and again.delay > 0.8


def test_late_starts_keep_the_rate_at_the_starts_and_book_once(client: redis.Redis) -> None:
    """Twelve requests booked at once start late, each by its own random lag (most beyond
    max_late): each keeps its one booking, and the starts keep the rate."""
    rate, late = Rate(5, 0.5), 0.05
    limit = RateLimit(client, "api", rate, slack=late)
    names = [f"r{i}" for i in range(12)]
    for name in names:
        limit.reserve(name)
    booked = {name: slot_us(client, limit, name) for name in names}
    last = bucket(client, limit)["last"]
    lags = random.Random(7).choices([0.0, 0.02, 0.08, 0.15, 0.3], k=len(names))
    starts: list[int] = []
    for name, lag in zip(names, lags, strict=True):
        due = booked[name] + int(lag * 1_000_000)
        while True:
            wait_for(lambda due=due: server_us(client) >= due, "the request's start", 30)
            got = reserve_all([(limit, 1.0)], name, max_late=late, near=0.02)
            if got.started:  # its start is counted: it starts at got.slot_ms
                break
            assert got.delay > 0.02
            due = got.slot_ms * 1000
        assert slot_us(client, limit, name) == booked[name]  # its one booking
        starts.append(got.slot_ms)
    assert bucket(client, limit).get("last", last) == last  # nothing booked beyond the twelve
    assert sum(lag > late for lag in lags) >= 4
    assert starts == sorted(starts)
    # At most 5 starts in any 0.5 s (half-open windows), however late they came.
    for i, first in enumerate(starts):
        assert sum(first <= s < first + 500 for s in starts[i:]) <= 5, starts


def test_usage_reads_the_bucket_and_writes_nothing(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "2/60s", burst=2)
    fresh = limit.usage()
    assert (fresh.available, fresh.next_delay, fresh.paused_for) == (2.0, 0.0, 0.0)
    assert (fresh.rate, fresh.burst) == (Rate(2, 60), 2)
    assert client.keys("*") == []
    for i in range(3):
        limit.reserve(f"r{i}")
    state = bucket(client, limit)
    usage = limit.usage()
    # Two started at once, the third waits 30 s for its unit: a unit owed (below 0).
    assert -1.0 <= usage.available <= -0.99
    # The next unit: a full bucket's worth (2 intervals) before tat, an interval after r2.
    assert usage.next_slot_ms == (state["tat"] - 30_000_000) // 1000
    assert usage.next_slot_ms == (slot_us(client, limit, "r2") + 30_000_000) // 1000
    assert 59 < usage.next_delay <= 60 and usage.paused_for == 0.0
    assert bucket(client, limit) == state and len(client.keys("*")) == 4  # nothing written


def test_reset_forgets_the_bucket_and_a_pause(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "1/60s")
    limit.reserve("a")
    assert limit.reserve("b").delay > 50
    limit.pause(60)
    set_limits(client, "api", burst=2)
    limit.reset()
    assert client.exists(limit.key) == 0
    fresh = limit.reserve("c")
    assert fresh.delay == 0.0 and fresh.burst == 2  # runtime limits stay
    assert limit.usage().paused_for == 0.0


def test_an_idle_limit_expires(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "1/1s")
    limit.reserve("a")
    request = LockKeys.of(limit.namespace, "api").rate_request
    # The bucket lives until it is full again (1 s) and a grace; the record 2 min past its slot.
    assert 0 < client.pttl(limit.key) <= 1000 + GRACE_MS
    assert KEEP_MS - 10_000 < client.pttl(request("a")) <= KEEP_MS
    future = limit.reserve("b")  # a slot ahead: both live until after it
    delay_ms = future.delay * 1000
    # (Bounds below allow for 10 s between the call and the reading: a loaded machine.)
    most = delay_ms + 1000 + GRACE_MS
    assert most - 10_000 < client.pttl(limit.key) <= most
    most = delay_ms + KEEP_MS
    assert most - 10_000 < client.pttl(request("b")) <= most
    long = RateLimit(client, "daily", "1/d")
    long.reserve("a")
    most = 86_400_000 + GRACE_MS  # a unit takes a day to come back
    assert most - 10_000 < client.pttl(long.key) <= most
    # usage() and a repeated request write nothing: they keep no key alive.
    client.pexpire(limit.key, 50)
    limit.usage()
    limit.reserve("b")
    wait_for(lambda: client.exists(limit.key) == 0, "the idle bucket expired", timeout=30)


def test_a_bucket_with_nothing_to_say_is_deleted(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "10/s")
    limit.reserve("a")
    assert client.exists(limit.key)
    limit.settle("a", 0)  # given back: the bucket is full, and nothing is ahead
    assert client.exists(limit.key) == 0
    assert record(client, limit, "a") is not None  # the request is still remembered


def test_a_restart_without_persistence_forgets_the_bucket(own_server: RedisServer) -> None:
    client = redis.Redis.from_url(own_server.url)
    limit = RateLimit(client, "api", "1/60s")
    limit.reserve("a")
    assert limit.reserve("b").delay > 50
    limit.pause(600)
    own_server.restart()
    # As docs/rate.md says: the bucket starts full, and the pause is gone.
    assert limit.reserve("c").delay == 0.0
    assert limit.usage().paused_for == 0.0
    client.close()


# -- settle ------------------------------------------------------------------------------------
# At 1 per 10 s: an interval of 10 s, so that the server's clock never overtakes the bucket in
# these tests, and each figure is exact.

SLOW = Rate(1, 10)
UNIT = 10_000_000  # its interval, us


def test_settle_charges_more_to_the_slots_after(client: redis.Redis) -> None:
    limit = RateLimit(client, "llm", SLOW)
    limit.reserve("a")
    a = slot_us(client, limit, "a")
    limit.settle("a", 3)
    assert record(client, limit, "a") == (a, 3.0)
    assert bucket(client, limit)["tat"] == a + 3 * UNIT
    limit.reserve("b")
    assert slot_us(client, limit, "b") == a + 3 * UNIT  # waits for the 2 units owed, too


def test_settle_gives_back_less(client: redis.Redis) -> None:
    limit = RateLimit(client, "llm", SLOW)
    limit.reserve("first")
    limit.reserve("a", cost=5)
    first, a = slot_us(client, limit, "first"), slot_us(client, limit, "a")
    # (a cost above the burst starts on a full bucket, one unit after the first)
    assert a == first + UNIT and bucket(client, limit)["tat"] == a + 5 * UNIT
    limit.settle("a", 2)
    assert record(client, limit, "a") == (a, 2.0)
    assert bucket(client, limit) == {"tat": a + 2 * UNIT, "last": a}
    limit.reserve("b")
    assert slot_us(client, limit, "b") == a + 2 * UNIT


def test_settle_counts_the_reserved_cost_and_never_gives_back_past_a_full_bucket(
    client: redis.Redis,
) -> None:
    limit = RateLimit(client, "llm", SLOW)
    limit.reserve("a")
    limit.reserve("b", cost=5)
    a = slot_us(client, limit, "a")
    limit.settle("b", 4, estimate=99)  # the record's cost counts (5), not the estimate
    assert bucket(client, limit)["tat"] == a + 5 * UNIT  # (b at a + 1, owing 5, then 1 back)
    full = RateLimit(client, "full", SLOW, burst=2)
    full.reserve("c", cost=2)
    assert full.usage().available <= 0.01
    full.settle("c", 0)
    usage = full.usage()
    assert usage.available == 2.0 and usage.next_delay == 0.0  # full, and no fuller
    assert record(client, full, "c") is not None and record(client, full, "c")[1] == 0.0  # type: ignore[index]


def test_settle_twice_is_settle_once(client: redis.Redis) -> None:
    limit = RateLimit(client, "llm", SLOW)
    limit.reserve("up")
    limit.reserve("down", cost=4)
    up = slot_us(client, limit, "up")
    assert bucket(client, limit)["tat"] == up + 5 * UNIT  # (down at up + 1, owing 4)
    limit.settle("up", 3)
    limit.settle("down", 1)
    assert bucket(client, limit)["tat"] == up + 4 * UNIT  # 2 more, 3 less
    state = bucket(client, limit)
    records = (record(client, limit, "up"), record(client, limit, "down"))
    limit.settle("up", 3)
    limit.settle("down", 1)
    assert bucket(client, limit) == state
    assert (record(client, limit, "up"), record(client, limit, "down")) == records
    # Settled again with another cost: the difference from the last one.
    limit.settle("up", 4)
    assert bucket(client, limit)["tat"] == state["tat"] + UNIT


def test_settle_rounds_in_favour_of_the_limit(client: redis.Redis) -> None:
    """Owed units round up to whole us of the bucket, units given back round down."""
    rate = Rate(3, 10)
    interval = interval_us(rate)
    assert interval == 3_333_334  # not a whole number of ms: 0.3 of it is 1,000,000.2 us
    limit = RateLimit(client, "llm", rate)
    limit.reserve("a")
    limit.reserve("b", cost=2)
    tat = bucket(client, limit)["tat"]
    limit.settle("a", 1.3)  # 0.3 more: 1,000,001 us
    assert bucket(client, limit)["tat"] == tat + 1_000_001
    limit.settle("b", 1.7)  # 0.3 less: 1,000,000 us
    assert bucket(client, limit)["tat"] == tat + 1


def test_settle_of_a_forgotten_request_uses_the_estimate(client: redis.Redis) -> None:
    limit = RateLimit(client, "llm", SLOW)
    limit.reserve("a")
    a = slot_us(client, limit, "a")
    t0 = server_us(client)
    limit.settle("ghost", 3, estimate=1)  # reserved 1 (as far as the caller knows), cost 3
    t1 = server_us(client)
    assert bucket(client, limit)["tat"] == a + 3 * UNIT
    written = record(client, limit, "ghost")
    assert written is not None and written[1] == 3.0 and t0 <= written[0] <= t1
    # Settled again: the record is there now, nothing more is charged.
    state = bucket(client, limit)
    limit.settle("ghost", 3, estimate=1)
    assert bucket(client, limit) == state
    # Less than the estimate: given back.
    limit.reserve("b", cost=3)
    before = bucket(client, limit)["tat"]
    limit.settle("ghost-2", 1, estimate=3)
    assert bucket(client, limit)["tat"] == before - 2 * UNIT


# -- pause -------------------------------------------------------------------------------------


def test_a_pause_puts_slots_after_it(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "10/s")
    t0 = server_us(client)
    usage = limit.pause(30)
    t1 = server_us(client)
    paused = bucket(client, limit)["paused"]
    assert t0 + 30_000_000 <= paused <= t1 + 30_000_000
    assert 29 < usage.paused_for <= 30 and 29 < usage.next_delay <= 30
    first = limit.reserve("a")
    limit.reserve("b")
    assert first.granted and 29 < first.delay <= 30
    assert slot_us(client, limit, "a") == paused  # at the end of the pause, a full bucket
    assert slot_us(client, limit, "b") == paused + 100_000
    refused = limit.reserve("c", max_delay=10)
    assert not refused.granted and record(client, limit, "c") is None


def test_a_request_reserved_before_a_pause_gets_a_slot_after_it(client: redis.Redis) -> None:
    rate = Rate(1, 1)
    limit = RateLimit(client, "api", rate)
    limit.reserve("a")
    limit.reserve("b")
    b = slot_us(client, limit, "b")
    assert limit.reserve("b").slot_ms == b // 1000  # no pause: kept
    limit.pause(30)
    paused = bucket(client, limit)["paused"]
    again = limit.reserve("b")
    assert again.granted and slot_us(client, limit, "b") == paused
    # The old slot's unit is not given back: the next one comes an interval after the pause.
    limit.reserve("c")
    assert slot_us(client, limit, "c") == paused + 1_000_000
    # Its new slot is after the pause: asked again, it keeps it.
    assert limit.reserve("b").slot_ms == paused // 1000


def test_a_longer_pause_is_kept_and_resume_ends_it(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "10/s")
    limit.pause(60)
    paused = bucket(client, limit)["paused"]
    shorter = limit.pause(1)
    assert bucket(client, limit)["paused"] == paused and shorter.paused_for > 59
    resumed = limit.resume()
    assert resumed.paused_for == 0.0 and resumed.next_delay == 0.0
    assert "paused" not in bucket(client, limit)
    assert limit.reserve("a").delay == 0.0
    assert limit.resume().paused_for == 0.0  # nothing happens without a pause


def test_a_pause_has_a_ttl_and_vanishes(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "10/s")
    limit.pause(0.3)
    assert 0 < client.pttl(limit.key) <= 300 + GRACE_MS
    pause_end = bucket(client, limit)["paused"]
    wait_for(lambda: server_us(client) > pause_end, "the pause ended")
    assert limit.usage().paused_for == 0.0
    assert limit.reserve("a").delay == 0.0
    assert "paused" not in bucket(client, limit)  # dropped once past
    limit.pause(0.05)
    wait_for(lambda: client.exists(limit.key) == 0, "the paused bucket expired", timeout=30)


# -- limits set at runtime ---------------------------------------------------------------------


def test_runtime_limits_apply_at_the_next_reservation_and_clear_restores(
    client: redis.Redis,
) -> None:
    limit = RateLimit(client, "api", "10/s")
    limit.reserve("a")
    state = set_limits(client, "api", rate="1/s")
    assert state.rate == Rate(1, 1.0) and state.burst is None
    got = limit.reserve("b")
    assert got.rate == Rate(1, 1.0) and got.burst == 1
    limit.reserve("c")
    b, c = slot_us(client, limit, "b"), slot_us(client, limit, "c")
    assert c - b == 1_000_000
    assert limit.usage().rate == Rate(1, 1.0)
    cleared = clear_limits(client, "api")
    assert cleared.rate is None and cleared.burst is None
    assert not client.exists(LockKeys.of("redislock", "api").limits)
    got = limit.reserve("d")
    limit.reserve("e")
    d, e = slot_us(client, limit, "d"), slot_us(client, limit, "e")
    assert got.rate == Rate(10, 1.0)
    assert d == c + 1_000_000 and e - d == 100_000  # the code's interval again


def test_a_runtime_burst_lets_that_many_start_at_once(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "1/60s")
    set_limits(client, "api", burst=3)
    got = [limit.reserve(f"r{i}") for i in range(4)]
    assert [g.delay for g in got[:3]] == [0.0] * 3 and got[3].delay > 50
    assert {g.burst for g in got} == {3} and {g.rate for g in got} == {Rate(1, 60)}
    assert limit.usage().burst == 3


def test_a_limit_raised_at_runtime_never_hands_out_a_slot_before_the_last(
    client: redis.Redis,
) -> None:
    limit = RateLimit(client, "api", "1/60s")
    limit.reserve("a")
    queued = limit.reserve("b")
    assert queued.delay > 50
    set_limits(client, "api", burst=5)  # the bucket now has room for 4 more at once
    after = limit.reserve("c")
    # First come, first served: not before b, even though the larger bucket has room now.
    assert after.granted and slot_us(client, limit, "c") == slot_us(client, limit, "b")
    assert after.burst == 5 and after.rate == Rate(1, 60.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": "fast"}, "rate must be '<limit>/<period>'"),
        ({"rate": "0/s"}, "the limit must be an integer from 1"),
        ({"rate": "2000000/s"}, "at most 1,000,000 units a second"),
        ({"burst": 0}, "burst must be an integer from 1"),
        ({"burst": True}, "burst must be an integer from 1"),
        ({"rate": "5/s", "burst": -1}, "burst must be an integer from 1"),
        ({"rate": "5/x", "burst": 2}, "rate must be"),
        ({}, "needs a rate, a burst or a cap"),
    ],
)
def test_bad_runtime_limits_are_refused_and_nothing_is_written(
    client: redis.Redis, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(LockConfigError, match=message) as info:
        set_limits(client, "api", **kwargs)  # type: ignore[arg-type]
    assert info.value.name == "api"
    assert client.keys("*") == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rate", "fast"),
        ("rate", "10/s"),
        ("rate", "10"),
        ("rate", "-1 1000"),
        ("burst", "lots"),
        ("burst", ""),
        # Past the pattern, out of the ranges set_limits allows (a limit of 0, no window, too
        # fast, a burst that is not a whole number of units from 1 to 10**9).
        ("rate", "0 1000"),
        ("rate", "1 0"),
        ("rate", "5000000000 1000"),
        ("burst", "0"),
        ("burst", "-3"),
        ("burst", "1.5"),
        ("burst", "inf"),
        ("burst", "nan"),
    ],
)
def test_a_malformed_runtime_limit_makes_reserve_fail_clearly(
    client: redis.Redis, field: str, value: str
) -> None:
    """A value written by hand (not through set_limits) that is not what set_limits writes:
    every call fails with a LockBackendError naming the limit and saying the runtime value is
    malformed, and writes nothing."""
    limit = RateLimit(client, "api", "1/s")
    client.hset(LockKeys.of("redislock", "api").limits, field, value)
    for call in (lambda: limit.reserve("a"), limit.usage, lambda: limit.pause(1)):
        with pytest.raises(LockBackendError, match=f"runtime {field} in .* is malformed") as info:
            call()
        assert info.value.name == "api"
    assert sorted(client.keys("*")) == [LockKeys.of("redislock", "api").limits.encode()]


# -- many callers ------------------------------------------------------------------------------

PROCESSES = 3
THREADS = 2
CALLS = 20
SHARED = Rate(4, 2)  # an interval of 0.5 s: every call but the first few queues


def _caller(url: str, tag: str, burst: int, barrier: threading.Barrier | None) -> None:
    client = redis.Redis.from_url(url)
    limit = RateLimit(client, "shared", SHARED, burst=burst)
    costs = random.Random(tag).choices(range(1, burst + 1), k=CALLS)
    if barrier is not None:
        barrier.wait(30)
    for i, cost in enumerate(costs):
        got = limit.reserve(f"{tag}-{i}", cost=cost)
        assert got.granted
        client.rpush(f"got:{tag}", got.slot_ms)
    client.close()


def _process(index: int, url: str, burst: int, start: Event) -> None:
    start.wait(30)
    threads = [
        threading.Thread(target=_caller, args=(url, f"p{index}t{t}", burst, None))
        for t in range(THREADS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


@pytest.mark.parametrize("burst", [1, 3])
def test_many_processes_and_threads_never_crowd_a_window(
    client: redis.Redis, redis_server: RedisServer, burst: int
) -> None:
    """Burst 1 and cost 1: the slots are also as tight as the rate. Burst 3 and costs of 1 to
    3: no window holds more than the burst and the rate allow."""
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    procs = [
        ctx.Process(target=_process, args=(i, redis_server.url, burst, start))
        for i in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    barrier = threading.Barrier(THREADS)
    here = [
        threading.Thread(target=_caller, args=(redis_server.url, f"main{t}", burst, barrier))
        for t in range(THREADS)
    ]
    begin = server_us(client)
    start.set()
    for t in here:
        t.start()
    for t in here:
        t.join(60)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    end = server_us(client)
    tags = [f"p{i}t{t}" for i in range(PROCESSES) for t in range(THREADS)]
    tags += [f"main{t}" for t in range(THREADS)]
    limit = RateLimit(client, "shared", SHARED, burst=burst)
    grants = []
    for tag in tags:
        got = [int(s) for s in client.lrange(f"got:{tag}", 0, -1)]
        assert len(got) == CALLS
        assert got == sorted(got), f"{tag}: a later call got an earlier slot"
        found = [record(client, limit, f"{tag}-{i}") for i in range(CALLS)]
        assert [r[0] // 1000 for r in found if r] == got  # the answers are the records
        grants += [r for r in found if r]
    assert len(grants) == len(tags) * CALLS
    assert len(client.keys("redislock:{shared}:r:*")) == len(grants)
    assert min(slot for slot, _ in grants) >= begin
    assert overfull(grants, burst, SHARED.limit, SHARED.per_ms) == []  # the invariant
    if burst == 1:
        assert {cost for _, cost in grants} == {1.0}
        # And the rate is reached: every slot reserved ahead is exactly where the bucket allows.
        assert loose(grants, burst, SHARED, end) == []


def test_the_checks_of_the_many_callers_test_can_fail() -> None:
    second = 1_000_000
    # 1 per second, burst 1: two slots less than a second apart crowd it.
    assert overfull([(0, 1), (second - 1, 1)], 1, 1, 1000) == [(0, second - 1)]
    assert overfull([(0, 1), (second, 1)], 1, 1, 1000) == []
    # Burst 3: three at once are fine, a fourth too soon is not; costs count as units.
    assert overfull([(0, 1), (0, 1), (0, 1), (second, 1)], 3, 1, 1000) == []
    assert overfull([(0, 1), (0, 1), (0, 1), (second - 1, 1)], 3, 1, 1000) != []
    assert overfull([(0, 2), (second, 2)], 2, 1, 1000) != []
    assert overfull([(0, 2), (2 * second, 2)], 2, 1, 1000) == []
    assert overfull([(0, 0.5), (second // 2, 1)], 1, 1, 1000) == []
    assert overfull([(0, 0.5), (second // 2 - 1, 1)], 1, 1, 1000) != []
    # Tightness: a slot ahead (after the end) later than the bucket allowed is found.
    rate = Rate(1, 1)
    assert loose([(0, 1), (second, 1), (2 * second, 1)], 1, rate, end_us=10) == []
    assert loose([(0, 1), (second, 1), (2 * second + 1, 1)], 1, rate, end_us=10) == [
        (2 * second + 1, 2 * second)
    ]
    assert loose([(0, 2), (2 * second, 1)], 1, rate, end_us=10) == []
    assert loose([(0, 1), (second + 5, 1)], 1, rate, end_us=second + 5) == []  # free when asked


# -- faults ------------------------------------------------------------------------------------


@pytest.fixture
def proxy(redis_server: RedisServer, client: redis.Redis) -> Iterator[FaultProxy]:
    # Loaded beforehand: a NOSCRIPT answer and its SCRIPT LOAD would be among what is lost.
    client.script_load(script("rate").script)
    with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        yield proxy


def _through(proxy: FaultProxy, retries: int) -> redis.Redis:
    c = redis.Redis.from_url(proxy.url, socket_timeout=0.5, retry=Retry(NoBackoff(), retries))
    c.ping()
    return c


@pytest.mark.faults
def test_a_lost_reply_retried_gets_the_same_slot_once(
    client: redis.Redis, proxy: FaultProxy
) -> None:
    through = _through(proxy, retries=1)
    limit = RateLimit(through, "api", "1/10s")
    RateLimit(client, "api", "1/10s").reserve("first")
    first = slot_us(client, limit, "first")
    before = proxy.seen("EVALSHA")
    proxy.drop_replies(1, command="EVALSHA")
    got = limit.reserve("job-1", cost=1)
    assert proxy.seen("EVALSHA") - before == 2  # the script ran twice
    # ... and answered the first run's slot, the one after "first": it took one slot, once.
    assert got.granted and slot_us(client, limit, "job-1") == first + 10_000_000
    assert got.slot_ms == (first + 10_000_000) // 1000
    assert bucket(client, limit)["tat"] == first + 20_000_000
    through.close()


@pytest.mark.faults
def test_a_lost_reply_not_retried_leaves_a_slot_the_same_id_finds(
    client: redis.Redis, proxy: FaultProxy
) -> None:
    through = _through(proxy, retries=0)
    limit = RateLimit(through, "api", "1/10s")
    proxy.drop_replies(1, command="EVALSHA")
    with pytest.raises(LockBackendError) as info:
        limit.reserve("job-1")
    assert info.value.name == "api" and "rate limit 'api'" in str(info.value)
    reserved = record(client, limit, "job-1")
    assert reserved is not None  # Redis ran it: the slot is taken ...
    state = bucket(client, limit)
    again = RateLimit(client, "api", "1/10s").reserve("job-1")
    assert again.slot_ms == reserved[0] // 1000  # ... and found again, taking nothing more
    assert bucket(client, limit) == state
    through.close()


@pytest.mark.faults
def test_a_lost_settle_reply_retried_settles_once(client: redis.Redis, proxy: FaultProxy) -> None:
    through = _through(proxy, retries=1)
    limit = RateLimit(through, "llm", SLOW)
    limit.reserve("up")
    limit.reserve("down", cost=5)
    tat = bucket(client, limit)["tat"]
    before = proxy.seen("EVALSHA")
    proxy.drop_replies(1, command="EVALSHA")
    limit.settle("up", 3)  # 2 units more
    proxy.drop_replies(1, command="EVALSHA")
    limit.settle("down", 1)  # 4 units less
    assert proxy.seen("EVALSHA") - before == 4  # each ran twice
    assert bucket(client, limit)["tat"] == tat + 2 * UNIT - 4 * UNIT  # each counted once
    assert record(client, limit, "up")[1] == 3.0  # type: ignore[index]
    assert record(client, limit, "down")[1] == 1.0  # type: ignore[index]
    through.close()


@pytest.mark.faults
def test_a_lost_pause_reply_retried_pauses_once(client: redis.Redis, proxy: FaultProxy) -> None:
    through = _through(proxy, retries=1)
    limit = RateLimit(through, "api", "10/s")
    before = proxy.seen("EVALSHA")
    t0 = server_us(client)
    proxy.drop_replies(1, command="EVALSHA")
    usage = limit.pause(30)
    t1 = server_us(client)
    assert proxy.seen("EVALSHA") - before == 2
    # One pause: 30 s from one of the runs (the second keeps the first's or ends a little later).
    paused = bucket(client, limit)["paused"]
    assert t0 + 30_000_000 <= paused <= t1 + 30_000_000
    assert 29 < usage.paused_for <= 30
    proxy.drop_replies(1, command="EVALSHA")
    assert limit.resume().paused_for == 0.0
    assert "paused" not in bucket(client, limit)
    through.close()


@pytest.mark.faults
def test_redis_down_is_a_backend_error_naming_the_limit(own_server: RedisServer) -> None:
    client = redis.Redis.from_url(
        own_server.url,
        socket_connect_timeout=0.05,
        socket_timeout=0.05,
        retry=Retry(NoBackoff(), 0),
    )
    limit = RateLimit(client, "api", "1/s")
    own_server.stop()
    calls = (
        lambda: limit.reserve("a"),
        lambda: limit.settle("a", 2),
        lambda: limit.pause(1),
        limit.resume,
        limit.usage,
        limit.reset,
    )
    for call in calls:
        with pytest.raises(LockBackendError) as info:
            call()
        assert info.value.name == "api"
        assert isinstance(info.value.__cause__, redis.ConnectionError)
    client.close()
