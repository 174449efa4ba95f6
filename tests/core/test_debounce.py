"""Debounced calls in the core (core/debounce.py, pending_call/take/sent.lua) on a real Redis:
the latest call wins, nothing is published before the key is quiet (or max_wait passed), a
publisher that fails or dies leaves the call to be published again, never dropped, and a lost
reply on any of the scripts is safe to retry. The frameworks' side is in the conformance
suite (tests/conformance, rows ``debounce_*``)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from faultproxy import FaultProxy
from helpers import redis_time_ms, wait_for, wait_redis_time
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redislock import LockBackendError
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.debounce import defer, pending_key, sweep_pending
from celery_redislock.core.keys import LockKeys
from celery_redislock.core.scripts import run, script

NS = "redislock"


class Publisher:
    """Records what a sweeper publishes; fails the first ``failures`` publishes."""

    def __init__(self, failures: int = 0) -> None:
        self.sent: list[tuple[str, str]] = []
        self.failures = failures

    def __call__(self, call_id: str, payload: str) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("broker down")
        self.sent.append((call_id, payload))


def sweep_until(client: redis.Redis, publish: Publisher, count: int, window: float = 30) -> None:
    wait_for(
        lambda: (
            sweep_pending(client, NS, publish, window=window) >= 0 and len(publish.sent) >= count
        ),
        f"{count} published",
        10,
    )


def test_a_burst_is_published_once_with_the_latest_call(client: redis.Redis) -> None:
    calls = [defer(client, NS, "k", f"c{n}", f"p{n}", quiet=0.3, max_wait=None) for n in range(5)]
    assert [c.id for c in calls] == ["c0"] * 5  # every caller is handed the pending call's id
    publish = Publisher()
    swept = sweep_pending(client, NS, publish)
    if redis_time_ms(client) < calls[-1].due_ms:  # (swept before it was due: the usual case)
        assert swept == 0  # not quiet yet: nothing published
    sweep_until(client, publish, 1)
    assert publish.sent == [("c0", "p4")]
    # Anything left of it would be due by now (it was published): this sweep finds nothing.
    assert sweep_pending(client, NS, publish) == 0 and len(publish.sent) == 1
    # Published and confirmed: the key's record is gone, and so is its listing (once old).
    assert not client.exists(LockKeys.of(NS, "k").pending)


def test_max_wait_publishes_during_a_steady_stream(client: redis.Redis) -> None:
    # A 30 s quiet time, which no call of this stream lets pass, however slow the machine:
    # only max_wait can publish.
    first = defer(client, NS, "k", "c0", "p0", quiet=30, max_wait=0.8)
    publish = Publisher()
    n = 0
    while not publish.sent:
        n += 1
        kept = defer(client, NS, "k", f"c{n}", f"p{n}", quiet=30, max_wait=0.8)
        assert kept.due_ms <= first.due_ms  # never past first + max_wait
        sweep_pending(client, NS, publish)
        time.sleep(0.1)  # the stream's pace: time passing is the point (at least 0.1 s a call)
        # 50 calls take 5 s at least: far past the 0.8 s of max_wait.
        assert n < 50, "max_wait did not publish while calls kept coming"
    assert publish.sent[0][0] == "c0"
    # The calls after it make the next pending call.
    later = defer(client, NS, "k", "late", "p-late", quiet=0.1, max_wait=None)
    assert later.made and later.id == "late"


def test_a_failed_publish_is_published_again_never_dropped(client: redis.Redis) -> None:
    wait_redis_time(client, defer(client, NS, "k", "c0", "p0", quiet=0.05, max_wait=None).due_ms)
    publish = Publisher(failures=1)
    assert sweep_pending(client, NS, publish, window=0.3) == 0  # the broker failed
    assert publish.failures == 0  # (it was tried)
    # A call meanwhile makes a new pending call: the one being published keeps its arguments.
    defer(client, NS, "k", "c1", "p1", quiet=0.05, max_wait=None)
    sweep_until(client, publish, 2, window=0.3)
    assert publish.sent == [("c0", "p0"), ("c1", "p1")]  # in order, each once


def test_a_publisher_that_died_is_replaced_by_another_sweeper(client: redis.Redis) -> None:
    """A worker took the call and died before publishing it: after the publish window, any
    other sweeper publishes it, under the same id."""
    wait_redis_time(client, defer(client, NS, "k", "c0", "p0", quiet=0.05, max_wait=None).due_ms)
    keys = [LockKeys.of(NS, "k").pending]
    took_at = redis_time_ms(client)
    taken = run("pending_take", client, keys, ["2000", "dead"])  # the dead worker's take
    assert [t.decode() for t in taken] == ["p", "c0", "p0"]
    publish = Publisher()
    swept = sweep_pending(client, NS, publish, window=0.3)
    if redis_time_ms(client) < took_at + 2000:  # (a machine that slow: nothing to tell here)
        assert swept == 0  # still in its window
    sweep_until(client, publish, 1, window=0.3)
    assert publish.sent == [("c0", "p0")]


def test_a_pending_call_outlives_a_restart_with_aof(own_server: RedisServer) -> None:
    aof = ("--appendonly", "yes", "--appendfsync", "always")
    own_server.stop()
    own_server.start(*aof)
    c = redis.Redis.from_url(own_server.url)
    try:
        defer(c, NS, "k", "c0", "p0", quiet=0.2, max_wait=None)
        c.close()
        own_server.stop()  # (SIGTERM: the AOF, fsynced at every write, is what it restarts from)
        own_server.start(*aof)
        c = redis.Redis.from_url(own_server.url)
        publish = Publisher()
        sweep_until(c, publish, 1)
        assert publish.sent == [("c0", "p0")]
    finally:
        c.close()


# -- lost replies ------------------------------------------------------------------------------


@pytest.fixture
def proxy(redis_server: RedisServer, client: redis.Redis) -> Iterator[FaultProxy]:
    for name in ("pending_call", "pending_take", "pending_sent"):
        client.script_load(script(name).script)
    with FaultProxy("127.0.0.1", redis_server.port) as fault_proxy:
        yield fault_proxy


def test_lost_replies_are_safe_to_retry(proxy: FaultProxy, client: redis.Redis) -> None:
    """Each script's reply lost once and the call retried by redis-py: one pending call with
    the latest arguments, published once."""
    through = redis.Redis.from_url(proxy.url, socket_timeout=0.5, retry=Retry(NoBackoff(), 1))
    through.ping()
    try:
        proxy.reset_after(1, command="EVALSHA")
        assert defer(through, NS, "k", "c0", "p0", quiet=0.05, max_wait=None).made
        proxy.reset_after(1, command="EVALSHA")
        kept = defer(through, NS, "k", "c1", "p1", quiet=0.05, max_wait=None)
        assert kept.id == "c0"
        wait_redis_time(client, kept.due_ms)
        publish = Publisher()
        proxy.reset_after(1, command="EVALSHA")  # the take's reply
        wait_for(
            lambda: sweep_pending(through, NS, publish) >= 0 and bool(publish.sent), "published"
        )
        assert publish.sent == [("c0", "p1")]
        assert proxy.faults == 3
        assert not client.exists(LockKeys.of(NS, "k").pending)
        # The confirmation's reply lost: run again, it answers the same and keeps nothing.
        defer(client, NS, "k", "c2", "p2", quiet=0.0, max_wait=None)
        keys = [LockKeys.of(NS, "k").pending]
        assert run("pending_take", client, keys, ["30000", "t"])[1] == b"c2"
        proxy.reset_after(1, command="EVALSHA")
        assert run("pending_sent", through, keys, ["c2"]) == b"0"
        assert proxy.faults == 4 and not client.exists(keys[0])
        # Nothing left to publish (c2 was due at once): a sweep finds nothing.
        assert sweep_pending(through, NS, publish) == 0 and len(publish.sent) == 1
    finally:
        through.close()


def test_a_key_is_listed_before_its_pending_call_is_written(client: redis.Redis) -> None:
    """A producer that dies between its two steps leaves a listing, never an unlisted call:
    the listing comes first, and a listing younger than 10 s is not forgotten."""
    client.hset(pending_key(NS), "k", f'{{"look": 0, "at": {time.time():f}}}')
    assert sweep_pending(client, NS, Publisher()) == 0
    assert client.hexists(pending_key(NS), "k")  # young: kept for the call about to be written


def test_a_lost_reply_not_retried_keeps_the_call_and_a_second_call_folds_into_it(
    proxy: FaultProxy, client: redis.Redis
) -> None:
    """The caller is told Redis failed, but the call was kept: it runs, and calling again is
    safe (folded into the same pending call, with the latest arguments)."""
    through = redis.Redis.from_url(proxy.url, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    through.ping()
    try:
        proxy.reset_after(1, command="EVALSHA")
        with pytest.raises(LockBackendError):
            defer(through, NS, "k", "c0", "p0", quiet=0.05, max_wait=None)
    finally:
        through.close()
    again = defer(client, NS, "k", "c1", "p1", quiet=0.05, max_wait=None)
    assert (again.id, again.made) == ("c0", False)
    publish = Publisher()
    sweep_until(client, publish, 1)
    assert publish.sent == [("c0", "p1")]
