"""Several real processes contending for one lock: exclusion, caps and read/write sharing."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable

import pytest
import redis

from celery_redislock import Lock

PROCESSES = 4


def _run_all(target: Callable[..., None], *args: object, count: int = PROCESSES) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=target, args=(i, *args)) for i in range(count)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0, f"worker exited with {p.exitcode}"


def _increment(_: int, url: str, rounds: int, fair: bool) -> None:
    client = redis.Redis.from_url(url)
    lock = Lock(client, "counter", ttl=10, fair=fair)
    for _ in range(rounds):
        with lock.acquire(timeout=60) as lease:
            value = int(client.get("value") or 0)  # a non-atomic read-modify-write
            time.sleep(0.001)
            client.set("value", value + 1)
            client.rpush("fences", lease.fence)


@pytest.mark.parametrize("fair", [False, True])
def test_no_lost_update(client: redis.Redis, redis_server: object, fair: bool) -> None:
    rounds = 50
    _run_all(_increment, redis_server.url, rounds, fair)  # type: ignore[attr-defined]
    assert int(client.get("value") or 0) == PROCESSES * rounds
    fences = [int(f) for f in client.lrange("fences", 0, -1)]
    assert fences == sorted(fences) and len(set(fences)) == len(fences)


def _enter_and_leave(
    _: int, url: str, name: str, mode: str, limit: int | None, rounds: int
) -> None:
    """Counts holders with atomic INCR/DECR and records the highest count seen and any
    reader-with-writer overlap."""
    client = redis.Redis.from_url(url)
    lock = Lock(client, name, ttl=10, mode=mode, limit=limit)  # type: ignore[arg-type]
    mine, other = ("readers", "writers") if mode == "read" else ("writers", "readers")
    for _ in range(rounds):
        with lock.acquire(timeout=60):
            now = client.incr(mine)
            client.zadd("max", {mine: now}, gt=True)  # new members are added, others only grow
            if int(client.get(other) or 0) > 0:
                client.incr("overlap")
            time.sleep(0.01)
            client.decr(mine)


def test_cap_never_exceeded_and_reached(client: redis.Redis, redis_server: object) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    _run_all(_enter_and_leave, url, "api", "write", 3, 15, count=6)
    assert client.zscore("max", "writers") == 3
    assert client.get("overlap") is None


def test_readers_overlap_writers_alone(client: redis.Redis, redis_server: object) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_enter_and_leave, args=(i, url, "cache", "read", None, 20))
        for i in range(4)
    ]
    procs += [
        ctx.Process(target=_enter_and_leave, args=(i, url, "cache", "write", None, 10))
        for i in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert client.get("overlap") is None  # no reader ever saw a writer, nor a writer a reader
    assert client.zscore("max", "readers") >= 2  # readers did share
    assert client.zscore("max", "writers") == 1  # writers never did
