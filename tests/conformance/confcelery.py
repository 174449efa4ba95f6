"""The Celery side of the conformance table: one task per entry of ``scenarios.JOBS``, named
``conf.<job>``, declared from the very options the RQ side takes.

Workers import it as ``conformance.confcelery`` (tests/ on PYTHONPATH). Broker, results and
markers are ``LOCKAPP_REDIS_URL`` (the Celery tests' Redis); the lock Redis too unless
``CONF_LOCK_URL`` names another, under the policy ``CONF_BACKEND_POLICY``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from celery_redislock import (
    install,
    lock_acquired,
    lock_backend_error,
    lock_conflict,
    lock_lost,
    lock_released,
)

from .scenarios import JOBS, rate_hooks

URL = os.environ["LOCKAPP_REDIS_URL"]
# Apart from the queue of tests/lockapp.py, on the same Redis; a test's own workers take another.
QUEUE = os.environ.get("CONF_QUEUE", "conformance")

app = install(Celery("confcelery", broker=URL, backend=URL, set_as_current=False))
app.conf.update(
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
    redislock_url=os.environ.get("CONF_LOCK_URL", URL),
    redislock_ttl=30.0,  # longer than any test waits: a lease that lapses is never mistaken
    redislock_line_sweep_interval=0.2,
    redislock_on_backend_error=os.environ.get("CONF_BACKEND_POLICY", "fail"),
)
if os.environ.get("CONF_LOG_FORMAT"):
    app.conf.worker_log_format = os.environ["CONF_LOG_FORMAT"]
r = redis.Redis.from_url(URL)


def body(run_id: str, key: str, seconds: float) -> str:
    """The body of every call: notes that it ran and where, then holds as asked (``seconds``
    below 0: fails)."""
    with r.pipeline() as notes:
        notes.rpush(f"ran:{key}", run_id)
        notes.rpush(f"ran-at:{key}", repr(time.time()))
        notes.rpush(f"args:{key}", repr(seconds))
        notes.hset("pid", key, os.getpid())
        notes.execute()
    rate_hooks(r, key)
    if seconds < 0:  # a call that fails
        raise RuntimeError("failed on purpose")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not r.exists(f"stop:{key}"):
        time.sleep(0.01)
    return "ran"


def _declare(job: str) -> Any:
    spec = JOBS[job]

    def run(self: Any, key: str, seconds: float = 0.0, tenant: str = "") -> str:
        return body(self.request.id, key, seconds)  # (`tenant`: a lock's tenant= reads it)

    run.__name__ = run.__qualname__ = job
    return app.task(
        bind=True,
        name=f"conf.{job}",
        lock=spec.lock,
        unique=spec.unique,
        rate=spec.rate,
        acks_late=spec.acks_late,
    )(run)


TASKS = {job: _declare(job) for job in JOBS}


def _note_conflict(sender: Any = None, task_id: str = "", action: str = "", **_: Any) -> None:
    r.rpush(f"actions:{task_id}", action)


def _note_backend_error(sender: Any = None, task_id: str = "", policy: str = "", **_: Any) -> None:
    r.rpush(f"actions:{task_id}", f"backend_error:{policy}")


lock_conflict.connect(_note_conflict, weak=False)
lock_backend_error.connect(_note_backend_error, weak=False)


def _note_acquired(sender: Any = None, task_id: str = "", **_: Any) -> None:
    r.rpush(f"lease:{task_id}", "acquired")


def _note_released(sender: Any = None, task_id: str = "", **_: Any) -> None:
    r.rpush(f"lease:{task_id}", "released")


lock_acquired.connect(_note_acquired, weak=False)
lock_released.connect(_note_released, weak=False)


def _note_lost(sender: Any = None, task_id: str = "", **_: Any) -> None:
    r.rpush(f"lease:{task_id}", "lost")


lock_lost.connect(_note_lost, weak=False)
