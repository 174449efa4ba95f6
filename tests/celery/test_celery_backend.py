"""The Redis for locks failing under real workers: mid-task (at release) and as tasks start.

The locks live on a Redis of their own, reached by the worker through a TCP proxy: stopping the
proxy makes that Redis unreachable (connections reset, new ones refused) while it keeps what it
holds, so the test can watch the lease the worker could not release. Broker and results stay
on the celery_server.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
import redis
from faultproxy import FaultProxy
from helpers import wait_for
from workers import Worker

from celery_redislock import Lock
from celery_redislock.contrib.redis_server import RedisServer

pytestmark = pytest.mark.faults  # the lock Redis made unreachable

TTL = 6.0  # long enough that the lease surely outlives the task's end, short to watch lapse


@pytest.fixture
def lock_redis() -> Iterator[RedisServer]:
    # One Redis version (the system one), like every worker test: the lock core is what runs
    # on each version.
    with RedisServer() as server:
        yield server


@pytest.fixture
def proxy(lock_redis: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", lock_redis.port) as through:
        yield through


@pytest.mark.slow
def test_lock_redis_unreachable_at_release_and_at_start_under_run(
    lockapp: ModuleType,
    workers: Callable[..., Worker],
    lock_redis: RedisServer,
    proxy: FaultProxy,
) -> None:
    worker = workers(
        env={
            "LOCKAPP_LOCK_URL": proxy.url,
            "LOCKAPP_TTL": str(TTL),
            "LOCKAPP_BACKEND_POLICY": "run",
        }
    )
    lock = Lock(redis.Redis.from_url(lock_redis.url), "hold:rel", ttl=TTL)
    job = lockapp.hold.delay("rel", 60)
    wait_for(lambda: lockapp.r.llen("started:rel") == 1, "the task runs", 20)
    assert [h.info["task_id"] for h in lock.holders()] == [job.id]

    # Unreachable at release: the task still ends as it would, and nobody releases its lease.
    proxy.stop()
    lockapp.r.set("stop:rel", 1)
    assert job.get(timeout=20) == "return"
    warning = "WARNING/.*lock 'hold:rel': release failed, the lease lapses within its ttl"
    wait_for(lambda: re.search(warning, worker.log()), "the release failure logged", 10)
    left = [(h.info["task_id"], h.expires_in) for h in lock.holders()]
    assert len(left) == 1 and left[0][0] == job.id, "the lease is still there"
    expires_in = left[0][1]
    assert 0 < expires_in <= TTL

    # Unreachable as a task starts, policy "run": it runs without the lock, logging an ERROR.
    unlocked = lockapp.hold.delay("unl", 0)
    assert unlocked.get(timeout=20) == "return"
    assert lockapp.r.llen("started:unl") == 1
    assert re.search(r"ERROR/.*\[" + unlocked.id + r"\] runs WITHOUT lock 'hold:unl'", worker.log())
    assert not Lock(redis.Redis.from_url(lock_redis.url), "hold:unl", ttl=TTL).locked()

    # The lease lapses on its own (nothing can reach that Redis to release it), at the expiry
    # seen above, within the ttl: Redis's own clock does that (the 60 s: liveness only).
    wait_for(lambda: not lock.locked(), "the lease lapses", 60)


def test_lock_redis_down_at_start_under_retry_republishes_until_it_is_back(
    lockapp: ModuleType,
    workers: Callable[..., Worker],
    lock_redis: RedisServer,
    proxy: FaultProxy,
) -> None:
    worker = workers(env={"LOCKAPP_LOCK_URL": proxy.url, "LOCKAPP_BACKEND_POLICY": "retry"})
    port = proxy.port
    proxy.stop()
    # duplicate: lock= hold:{name}, retried every 0.05 s doubling (at most 5 times: 1.6 s).
    job = lockapp.duplicate.delay("rt")
    retried = f"{job.id}] retries in"
    wait_for(lambda: worker.log().count(retried) >= 3, "re-published 3 times while down", 20)
    assert "Redis for lock 'hold:rt' failed" in worker.log()
    assert job.state == "RETRY"
    assert lockapp.r.llen("started:dup:rt") == 0, "never ran without its lock"

    back = FaultProxy("127.0.0.1", lock_redis.port, port=port).start()
    try:
        assert job.get(timeout=60) == "ran"  # (liveness only)
    finally:
        back.stop()
    # It runs at its next try once Redis is back, within the longest backoff: no wait it
    # announced was longer than that (1.6 s), however long each took on this machine.
    waits = [float(s) for s in re.findall(re.escape(retried) + r" ([0-9.]+)s", worker.log())]
    assert len(waits) >= 3 and max(waits) <= 1.6, waits
    assert lockapp.r.llen("started:dup:rt") == 1
    assert not Lock(redis.Redis.from_url(lock_redis.url), "hold:rt", ttl=TTL).locked()
