"""Several rate limits taken at once (``reserve_all``, ``rate=`` as a list): one slot in all of
them or in none, a tenant's backlog that does not hold a shared limit's room, a lost reply, and
the declarations refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from faultproxy import FaultProxy
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redislock import LockConfigError
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.keys import LockKeys
from celery_redislock.core.options import call_signature
from celery_redislock.core.rate import RateLimit, reserve_all
from celery_redislock.core.rate_options import parse_rate_option
from celery_redislock.core.scripts import script


def record(client: redis.Redis, limit: RateLimit, request: str) -> bytes | None:
    return client.get(LockKeys.of(limit.namespace, limit.name).rate_request(request))  # type: ignore[return-value]


def test_the_slot_is_the_latest_of_the_limits_and_names_the_one_that_set_it(
    client: redis.Redis,
) -> None:
    tenant, shared = RateLimit(client, "tenant:a", "1/10s"), RateLimit(client, "api", "1/s")
    first = reserve_all([(tenant, 1), (shared, 1)], "a0")
    assert first.granted and first.delay == 0.0
    assert record(client, tenant, "a0") is not None and record(client, shared, "a0") is not None
    later = reserve_all([(tenant, 1), (shared, 1)], "a1", near=2)
    assert later.name == "tenant:a" and 9 < later.delay <= 10
    # Far off: taken in the tenant's limit only; the shared one, whose own slot is near, keeps
    # its room for others (a limit whose own slot is far takes it too, as the tenant's did).
    assert record(client, tenant, "a1") is not None and record(client, shared, "a1") is None
    other = RateLimit(client, "tenant:b", "1/10s")
    b = reserve_all([(other, 1), (shared, 1)], "b0", near=2)
    assert b.name == "api" and b.delay <= 1.0  # behind a0 in the shared limit, not behind a1
    # Asked again at its slot (here: with near covering it), a1 takes both at once.
    again = reserve_all([(tenant, 1), (shared, 1)], "a1", near=60)
    assert again.slot_ms == later.slot_ms and record(client, shared, "a1") is not None


def test_a_slot_within_near_is_taken_in_every_limit(client: redis.Redis) -> None:
    tenant, shared = RateLimit(client, "tenant:a", "1/10s"), RateLimit(client, "api", "5/s")
    reserve_all([(tenant, 1), (shared, 1)], "a0")
    got = reserve_all([(tenant, 1), (shared, 1)], "a1", near=30)
    assert 9 < got.delay <= 10
    assert record(client, tenant, "a1") is not None and record(client, shared, "a1") is not None
    # The shared limit was charged at that slot: a new call there now still starts at once
    # (its bucket had room now), and its own slot never goes before the last one handed out.
    assert reserve_all([(shared, 1)], "s0").slot_ms >= got.slot_ms


def test_refused_past_max_delay_takes_nothing_anywhere(client: redis.Redis) -> None:
    tenant, shared = RateLimit(client, "tenant:a", "1/60s"), RateLimit(client, "api", "10/s")
    reserve_all([(tenant, 1), (shared, 1)], "a0")
    before = {k: client.dump(k) for k in client.keys("*")}
    refused = reserve_all([(tenant, 1), (shared, 1)], "a1", max_delay=5, near=600)
    assert not refused.granted and refused.name == "tenant:a" and 55 < refused.delay <= 60
    assert {k: client.dump(k) for k in client.keys("*")} == before


def test_each_limit_is_charged_its_own_cost(client: redis.Redis) -> None:
    # (Slow refills, 1 token a second, so that a loaded machine's pauses do not show.)
    requests = RateLimit(client, "requests", "10/1000s", burst=10)
    tokens = RateLimit(client, "tokens", "1000/1000s", burst=1000)
    reserve_all([(requests, 1), (tokens, 400)], "r0")
    assert requests.usage().available == pytest.approx(9, abs=0.1)
    assert tokens.usage().available == pytest.approx(600, abs=2)
    heavy = reserve_all([(requests, 1), (tokens, 900)], "r1")
    # 300 tokens short, at 1 a second: the tokens' limit sets the slot.
    assert heavy.name == "tokens" and heavy.cost == 900 and 295 < heavy.delay <= 300


def test_limits_on_other_clients_or_of_one_name_are_refused(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    other = redis.Redis.from_url(redis_server.url)
    with pytest.raises(LockConfigError, match="must share one Redis client"):
        reserve_all([(RateLimit(client, "a", "1/s"), 1), (RateLimit(other, "b", "1/s"), 1)], "r")
    with pytest.raises(LockConfigError, match="must differ by name"):
        reserve_all([(RateLimit(client, "a", "1/s"), 1), (RateLimit(client, "a", "2/s"), 1)], "r")
    with pytest.raises(LockConfigError, match="at least one"):
        reserve_all([], "r")
    other.close()
    assert client.keys("*") == []


@pytest.fixture
def proxy(redis_server: RedisServer, client: redis.Redis) -> Iterator[FaultProxy]:
    client.script_load(script("rate").script)  # (a NOSCRIPT would be among what is lost)
    with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        yield proxy


@pytest.mark.faults
@pytest.mark.parametrize("retries", [0, 1])
def test_a_lost_reply_leaves_all_or_nothing_and_the_same_id_finds_it(
    client: redis.Redis, proxy: FaultProxy, retries: int
) -> None:
    through = redis.Redis.from_url(proxy.url, socket_timeout=0.5, retry=Retry(NoBackoff(), retries))
    through.ping()
    names = ("tenant:a", "api")
    limits = [(RateLimit(through, name, "1/10s"), 1.0) for name in names]
    proxy.drop_replies(1, command="EVALSHA")
    try:
        got = reserve_all(limits, "job-1")
    except Exception:
        assert retries == 0  # not retried: an error, the script having run
        got = reserve_all([(RateLimit(client, n, "1/10s"), 1.0) for n in names], "job-1")
    # Each limit holds exactly one slot for it, the same in both: all of it, once.
    slots = {record(client, limit, "job-1") for limit, _ in limits}
    assert len(slots) == 1 and None not in slots
    assert got.granted and got.delay == 0.0
    nxt = reserve_all([(RateLimit(client, n, "1/10s"), 1.0) for n in names], "job-2")
    assert 9 < nxt.delay <= 10  # one slot each was taken, not two
    through.close()


# -- the task option ---------------------------------------------------------------------------


def sync(tenant: str, order: int) -> None: ...


SIGNATURE = call_signature(sync, bound=False)


def test_rate_as_a_list_is_every_limit_with_the_smallest_max_delay() -> None:
    options = parse_rate_option(
        "sync",
        SIGNATURE,
        [
            {"rate": "10/s", "key": "tenant:{tenant}", "max_delay": 60},
            {"rate": "100/s", "key": "api", "burst": 5, "max_delay": 30},
            "1000/h",
        ],
    )
    assert options is not None and len(options.limits) == 3
    assert [str(each.rate) for each in options.limits] == ["10/1s", "100/1s", "1000/3600s"]
    assert options.max_delay == 30 and options.limits[1].burst == 5


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "at least one rate"),
        (["10/s", "20/s"], "several limits need a key each"),
        ([{"rate": "1/s", "key": "a"}, ["2/s"]], "each of several limits must be a rate or a dict"),
        ([{"rate": "1/s", "key": "{nope}"}], "template names argument(s) 'nope'"),
        ([{"rate": "1/s", "key": "a"}, {"rate": "fast", "key": "b"}], "must be '<limit>/<period>'"),
    ],
)
def test_a_bad_list_is_refused_at_declaration(value: object, message: str) -> None:
    with pytest.raises(LockConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_rate_option("sync", SIGNATURE, value)
