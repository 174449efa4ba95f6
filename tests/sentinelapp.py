"""The Celery app the Sentinel failover test runs in a real worker: its locks live in the master
a Sentinel group names (``SENTINELAPP_SENTINELS``), its broker, results and notes in a plain
redis-server of their own (``LOCKAPP_REDIS_URL``, set by tests/workers.py), untouched by the
failover.

Every run of ``work`` notes when it held its lock (``time.monotonic()``, one clock for every
process of the host), so the test can check that no two runs overlapped.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from celery_redislock import install

URL = os.environ["LOCKAPP_REDIS_URL"]
app = install(Celery("sentinelapp", broker=URL, backend=URL))
app.conf.update(
    redislock_sentinels=os.environ["SENTINELAPP_SENTINELS"],
    redislock_sentinel_master=os.environ["SENTINELAPP_MASTER"],
    # A lease the master alone had would be lost by the failover: the replica must have it.
    redislock_min_replicas=1,
    redislock_replica_timeout=1.0,
    redislock_ttl=10.0,  # well above the failover's few seconds
    redislock_on_backend_error=os.environ.get("SENTINELAPP_POLICY", "fail"),
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)
notes = redis.Redis.from_url(URL)


@app.task(
    bind=True, lock={"key": "shared", "on_conflict": "retry", "countdown": 0.05}, max_retries=0
)
def work(self: Any, i: int) -> int:
    """Holds the one shared lock for a moment and notes when."""
    began = time.monotonic()
    time.sleep(0.1)
    notes.rpush("held", f"{i} {began!r} {time.monotonic()!r} {os.getpid()}")
    return i
