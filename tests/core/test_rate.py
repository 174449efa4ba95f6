"""Fleet-wide rate limits (celery_redislock.core.rate): the window of reserved slots on a real
Redis, under threads and processes, through lost replies and with Redis down; and the parsing
of rates."""

from __future__ import annotations

import math
import multiprocessing
import threading
from collections.abc import Iterator
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
from celery_redislock.core.keys import LockKeys
from celery_redislock.core.rate import Rate, RateLimit, Reservation, parse_rate
from celery_redislock.core.scripts import script

KEEP_MS = 120_000  # rate.lua: how long an id is remembered after its slot
GRACE_MS = 1000  # _time.lua
KEPT = 10_000  # rate.lua: how many ids are remembered at most (when limit is lower)


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def packed_or_immediate(slots: list[int], limit: int, per_ms: int, end_ms: int) -> list[int]:
    """The slots (sorted) that break the rule a full window must follow: each is either
    exactly ``per`` after the ``limit``-th slot before it (the backlog moves on by one window),
    or was free when asked (it is then no later than ``end_ms``, the server's time after every
    call). Empty when the slots are as tight as the rate allows."""
    return [
        s
        for i, s in enumerate(slots)
        if i >= limit and s != slots[i - limit] + per_ms and s > end_ms
    ]


def crowded(slots: list[int], limit: int, per_ms: int) -> list[tuple[int, int]]:
    """Pairs of slots ``limit`` apart (sorted) that are less than ``per`` apart: a window of
    ``per`` ms holding more than ``limit`` slots. Empty when the invariant holds."""
    ordered = sorted(slots)
    return [
        (ordered[i - limit], s)
        for i, s in enumerate(ordered)
        if i >= limit and s - ordered[i - limit] < per_ms
    ]


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


@pytest.mark.parametrize("value", ["0/m", "100001/h", "1000000/d"])
def test_a_limit_out_of_range_is_refused_saying_why(value: str) -> None:
    with pytest.raises(LockConfigError) as info:
        parse_rate(value, name="api")
    message = str(info.value)
    assert "from 1 to 100000" in message and repr(value) in message, message
    assert "one entry per start" in message and "'1000/36s'" in message, message
    assert info.value.name == "api"


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


# -- arguments ---------------------------------------------------------------------------------


def test_bad_arguments_are_refused_early(client: redis.Redis) -> None:
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
    limit = RateLimit(client, "api", "1/s")
    for bad in ("", None, 42):
        with pytest.raises(LockConfigError, match="request_id must be a non-empty string"):
            limit.reserve(bad)  # type: ignore[arg-type]
    wrong: object
    for wrong in (-1, math.nan, "1", True, 31 * 86400):
        with pytest.raises(LockConfigError, match="max_delay must be a number of seconds"):
            limit.reserve("r", max_delay=wrong)  # type: ignore[arg-type]
        with pytest.raises(LockConfigError, match="max_late must be a number of seconds"):
            limit.reserve("r", max_late=wrong)  # type: ignore[arg-type]
    assert client.keys("*") == []  # nothing was sent


def test_name_rate_and_key(client: redis.Redis) -> None:
    limit = RateLimit(client, "sync:{42}", "5/2s", namespace="ns")
    assert limit.name == "sync:{42}" and limit.rate == Rate(5, 2.0)
    assert limit.key == "ns:{sync:{42}}:rate"
    # One slot with the lock of the same name: a script may touch both on a Redis Cluster.
    assert key_slot(limit.key.encode()) == key_slot(LockKeys.of("ns", "sync:{42}").leases.encode())
    assert repr(limit) == "RateLimit('sync:{42}', '5/2s', namespace='ns')"


# -- slots -------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3])
def test_slots_are_handed_out_in_order_and_as_tight_as_the_rate(
    client: redis.Redis, n: int
) -> None:
    limit = RateLimit(client, "api", f"{n}/10s")
    calls = 3 * n + 1
    before = server_ms(client)
    got = [limit.reserve(f"r{i}") for i in range(calls)]
    after = server_ms(client)
    slots = [g.slot_ms for g in got]
    assert all(g.granted for g in got)
    assert slots == sorted(slots)  # a later request never gets an earlier slot
    assert all(before <= s <= after for s in slots[:n])  # the first n start now
    assert [g.delay for g in got[:n]] == [0.0] * n
    # Then the backlog moves on by one window per n: exactly, not later.
    assert [s - slots[i] for i, s in enumerate(slots[n:])] == [10_000] * (calls - n)
    for g in got[n:]:
        assert g.slot_ms - after <= g.delay * 1000 <= g.slot_ms - before
    assert client.zcard(limit.key) == calls


def test_a_free_window_starts_at_once(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "2/0.1s")
    first = [limit.reserve(f"a{i}").slot_ms for i in range(2)]
    wait_for(lambda: server_ms(client) >= first[1] + 100, "the window passed")
    now = server_ms(client)
    later = limit.reserve("b")
    assert later.delay == 0.0 and later.slot_ms >= now


def test_a_request_asked_twice_takes_one_slot(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "1/60s")
    first = limit.reserve("job-1")
    queued = limit.reserve("job-2")
    assert queued.delay > 50
    assert limit.reserve("job-1").slot_ms == first.slot_ms
    again = limit.reserve("job-2")
    assert again.slot_ms == queued.slot_ms and again.granted
    assert client.zcard(limit.key) == 2
    # The next new request comes after both: neither repeat took a slot.
    assert limit.reserve("job-3").slot_ms == queued.slot_ms + 60_000


def test_max_delay_refuses_and_reserves_nothing(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "1/60s")
    assert limit.reserve("a", max_delay=0).granted  # a free slot is now: within any max_delay
    refused = limit.reserve("b", max_delay=5)
    assert refused == Reservation(granted=False, delay=refused.delay, slot_ms=refused.slot_ms)
    assert 50 < refused.delay <= 60
    assert client.zcard(limit.key) == 1 and client.zscore(limit.key, "b") is None
    # The slot b was refused is still free: the next request gets it.
    taken = limit.reserve("c", max_delay=60)
    assert taken.granted and taken.slot_ms == refused.slot_ms
    # A request that holds a slot keeps it, whatever max_delay it asks with now.
    again = limit.reserve("c", max_delay=0)
    assert again.granted and again.slot_ms == taken.slot_ms


def test_a_late_start_gives_its_slot_up_and_goes_to_the_back(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "2/5s")
    a, x, b, y = (limit.reserve(r).slot_ms for r in "axby")
    assert (b, y) == (a + 5000, x + 5000)
    # On time (within max_late): the same slot.
    assert limit.reserve("a", max_late=60).slot_ms == a
    wait_for(lambda: server_ms(client) > max(a, x) + 50, "a's and x's slots are 50 ms past")
    late = limit.reserve("a", max_late=0.05)
    # Behind b and y, a window after the one it was in: its stale slot counts no more.
    assert late.granted and late.slot_ms == a + 10_000
    assert client.zcard(limit.key) == 4  # the stale slot was given up, not kept
    assert limit.reserve("a", max_late=0.05).slot_ms == late.slot_ms  # asked again: the same
    # A late request whose new slot would be too far is refused, and its stale slot dropped.
    refused = limit.reserve("x", max_late=0.05, max_delay=1)
    assert not refused.granted and refused.slot_ms == x + 10_000
    assert client.zscore(limit.key, "x") is None and client.zcard(limit.key) == 3


def test_usage_counts_the_window_and_the_backlog(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "2/60s")
    assert limit.usage().started == 0 and limit.usage().next_delay == 0.0
    slots = [limit.reserve(f"r{i}").slot_ms for i in range(3)]
    usage = limit.usage()
    assert (usage.started, usage.ahead) == (2, 1)
    assert usage.next_slot_ms == slots[1] + 60_000  # after the second, a window on
    assert 50 < usage.next_delay <= 60
    assert client.zcard(limit.key) == 3  # usage reserves nothing


def test_reset_forgets_every_slot(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "1/60s")
    limit.reserve("a")
    assert limit.reserve("b").delay > 50
    limit.reset()
    assert client.exists(limit.key) == 0
    assert limit.reserve("c").delay == 0.0


def test_an_idle_limit_expires(client: redis.Redis) -> None:
    limit = RateLimit(client, "api", "1/1s")
    limit.reserve("a")
    assert 0 < client.pttl(limit.key) <= KEEP_MS + GRACE_MS
    future = limit.reserve("b")  # a slot ahead: the key lives until KEEP_MS past it
    delay_ms = future.delay * 1000
    # (Bounds below allow for 10 s between the call and the reading: a loaded machine.)
    most = delay_ms + KEEP_MS + GRACE_MS
    assert most - 10_000 < client.pttl(limit.key) <= most
    long = RateLimit(client, "daily", "1/d")
    long.reserve("a")
    most = 86_400_000 + GRACE_MS  # per, when longer than KEEP_MS
    assert most - 10_000 < client.pttl(long.key) <= most
    # usage() and a repeated request write nothing: they keep no key alive.
    client.pexpire(limit.key, 50)
    limit.usage()
    limit.reserve("b")
    wait_for(lambda: client.exists(limit.key) == 0, "the idle key expired", timeout=5)


def test_the_ids_remembered_are_bounded(client: redis.Redis) -> None:
    limit = RateLimit(client, "busy", "3/s")
    sha = client.script_load(script("rate").script)
    pipe = client.pipeline(transaction=False)  # 10,050 reservations in one round trip
    for i in range(KEPT + 50):
        pipe.evalsha(sha, 1, limit.key, "r", f"r{i}", "3", "1000", "", "")
    slots = [int(reply.split()[1]) for reply in pipe.execute()]
    assert client.zcard(limit.key) == KEPT
    assert client.zscore(limit.key, "r49") is None and client.zscore(limit.key, "r50") is not None
    assert crowded(slots, 3, 1000) == []
    # A forgotten id asked again takes a new slot at the back: a spare slot, not one too many.
    assert limit.reserve("r0").slot_ms == slots[-3] + 1000


def test_a_restart_without_persistence_forgets_the_window(own_server: RedisServer) -> None:
    client = redis.Redis.from_url(own_server.url)
    limit = RateLimit(client, "api", "1/60s")
    limit.reserve("a")
    assert limit.reserve("b").delay > 50
    own_server.restart()
    assert limit.reserve("c").delay == 0.0  # as docs/rate.md says: the window starts empty
    client.close()


# -- many callers ------------------------------------------------------------------------------

PROCESSES = 3
THREADS = 2
CALLS = 20
LIMIT, PER = 4, "4/2s"


def _caller(url: str, tag: str, barrier: threading.Barrier | None) -> None:
    client = redis.Redis.from_url(url)
    limit = RateLimit(client, "shared", PER)
    if barrier is not None:
        barrier.wait(30)
    for i in range(CALLS):
        got = limit.reserve(f"{tag}-{i}")
        client.rpush(f"got:{tag}", got.slot_ms)
    client.close()


def _process(index: int, url: str, start: Event) -> None:
    start.wait(30)
    threads = [
        threading.Thread(target=_caller, args=(url, f"p{index}t{t}", None)) for t in range(THREADS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def test_many_processes_and_threads_never_crowd_a_window(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_process, args=(i, redis_server.url, start)) for i in range(3)]
    for p in procs:
        p.start()
    barrier = threading.Barrier(THREADS)
    here = [
        threading.Thread(target=_caller, args=(redis_server.url, f"main{t}", barrier))
        for t in range(THREADS)
    ]
    begin = server_ms(client)
    start.set()
    for t in here:
        t.start()
    for t in here:
        t.join(60)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    end = server_ms(client)
    tags = [f"p{i}t{t}" for i in range(PROCESSES) for t in range(THREADS)]
    tags += [f"main{t}" for t in range(THREADS)]
    per_caller = {tag: [int(s) for s in client.lrange(f"got:{tag}", 0, -1)] for tag in tags}
    slots = sorted(s for got in per_caller.values() for s in got)
    assert len(slots) == len(tags) * CALLS == client.zcard("redislock:{shared}:rate")
    assert crowded(slots, LIMIT, 2000) == []  # the invariant
    for tag, got in per_caller.items():
        assert got == sorted(got), f"{tag}: a later call got an earlier slot"
    assert slots[0] >= begin
    # And the rate is reached: the backlog moves on by exactly one window per LIMIT slots.
    assert packed_or_immediate(slots, LIMIT, 2000, end) == []


def test_the_checks_of_the_many_callers_test_can_fail() -> None:
    assert crowded([0, 10, 20, 1999], 3, 2000) == [(0, 1999)]
    assert crowded([0, 10, 20, 2000], 3, 2000) == []
    assert packed_or_immediate([0, 10, 20, 2001], 3, 2000, end_ms=500) == [2001]
    assert packed_or_immediate([0, 10, 20, 300, 2010], 3, 2000, end_ms=500) == []


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
    first = RateLimit(client, "api", "1/10s").reserve("first")
    before = proxy.seen("EVALSHA")
    proxy.drop_replies(1, command="EVALSHA")
    got = limit.reserve("job-1")
    assert proxy.seen("EVALSHA") - before == 2  # the script ran twice
    # ... and answered the first run's slot, the one after "first": it took one slot, once.
    assert got.granted and got.slot_ms == first.slot_ms + 10_000
    assert client.zcard(limit.key) == 2
    assert client.zscore(limit.key, "job-1") == got.slot_ms
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
    reserved = client.zscore(limit.key, "job-1")
    assert reserved is not None  # Redis ran it: the slot is taken ...
    again = RateLimit(client, "api", "1/10s").reserve("job-1")
    assert again.slot_ms == reserved and client.zcard(limit.key) == 1  # ... and found again
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
    for call in (lambda: limit.reserve("a"), limit.usage, limit.reset):
        with pytest.raises(LockBackendError) as info:
            call()
        assert info.value.name == "api"
        assert isinstance(info.value.__cause__, redis.ConnectionError)
    client.close()
