"""Redis unreachable or hung: every public call of the lock core raises LockBackendError
(docs/failures.md, "Redis unreachable": "every call raises LockBackendError"), never a silent
success, with the redis-py error as its cause."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redislock import (
    Lock,
    LockBackendError,
    iter_locks,
    renew_leases,
)
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.contrib.testing import release_all


@pytest.mark.parametrize("fault", ["stopped", "paused"])
def test_every_public_call_raises_a_backend_error(own_server: RedisServer, fault: str) -> None:
    # Short timeouts and no redis-py retries: each call fails in a fraction of a second.
    client = redis.Redis.from_url(
        own_server.url,
        socket_connect_timeout=0.05,
        socket_timeout=0.05,
        retry=Retry(NoBackoff(), 0),
    )
    lock = Lock(client, "down", ttl=30)
    fair = Lock(client, "down-fair", ttl=30, fair=True)
    # Taken through a client with the usual timeouts (a loaded machine may take 50 ms to
    # answer), then held through ``lock``: the same lease, as its holder sees it.
    setup = redis.Redis.from_url(own_server.url)
    lease = replace(Lock(setup, "down", ttl=30).acquire(), lock=lock)
    setup.close()
    calls: dict[str, Callable[[], object]] = {
        "Lock.acquire(blocking=False)": lambda: lock.acquire(blocking=False),
        "Lock.acquire(timeout=1)": lambda: lock.acquire(timeout=1),
        "fair Lock.acquire(timeout=1)": lambda: fair.acquire(timeout=1),
        "Lease.release": lease.release,
        "Lock.release": lambda: lock.release(lease),
        "Lease.renew": lease.renew,
        "renew_leases": lambda: renew_leases([lease]),
        "Lock.holders": lock.holders,
        "Lock.locked": lock.locked,
        "Lock.release_where": lambda: lock.release_where(pid="4242"),
        "Lock.finish_job": lambda: lock.finish_job("job-1", keep=5),
        "iter_locks": lambda: list(iter_locks(client)),
        "release_all": lambda: release_all(client),
    }
    named = {"iter_locks": None, "release_all": None, "fair Lock.acquire(timeout=1)": "down-fair"}
    if fault == "stopped":
        own_server.stop()
    else:
        own_server.pause()
    try:
        for what, call in calls.items():
            with pytest.raises(LockBackendError) as info:
                call()
            assert isinstance(info.value.__cause__, redis.RedisError), what
            assert info.value.name == named.get(what, "down"), what
    finally:
        if fault == "paused":
            own_server.resume()
    assert not lease.released and not lease.lost  # nothing was decided without Redis
    client.close()
