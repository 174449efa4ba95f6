"""The RQ side of the conformance table: one ``@locked`` job per entry of ``scenarios.JOBS``,
a module-level function of the job's name (``conformance.confrq.<job>``), declared from the very
options the Celery side takes.

Workers run ``ConfWorker`` (a ``LockWorker`` that has imported this module before it forks).
Markers go to the job's own Redis, and, for what a producer signals at enqueue, to
``CONF_RQ_URL``. The lock Redis and policy are the worker's ``REDISLOCK_*`` environment.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import redis
from rq import get_current_job

from celery_redislock.integrations.rq import (
    LockWorker,
    lock_acquired,
    lock_backend_error,
    lock_conflict,
    lock_lost,
    lock_released,
    locked,
)

from .scenarios import JOBS, rate_hooks


class ConfWorker(LockWorker):
    """A ``LockWorker`` whose horses find this module imported already (no import per job)."""


def body(key: str, seconds: float) -> str:
    """The body of every call: notes that it ran and where, then holds as asked (``seconds``
    below 0: fails)."""
    job = get_current_job()
    assert job is not None
    r = job.connection
    with r.pipeline() as notes:
        notes.rpush(f"ran:{key}", job.id)
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


def _declare(job: str) -> Callable[..., str]:
    spec = JOBS[job]

    def run(key: str, seconds: float = 0.0, tenant: str = "") -> str:
        return body(key, seconds)  # (`tenant`: a lock's tenant= reads it)

    # RQ runs a job by its import path: the function must look like a module-level one.
    run.__name__ = run.__qualname__ = job
    run.__module__ = __name__
    decorated = locked(lock=spec.lock, unique=spec.unique, rate=spec.rate)(run)
    globals()[job] = decorated
    return decorated


JOBS_BY_NAME = {job: _declare(job) for job in JOBS}

_producer: redis.Redis | None = None


def _notes() -> redis.Redis:
    job = get_current_job()
    if job is not None:
        return job.connection
    global _producer
    if _producer is None:
        _producer = redis.Redis.from_url(os.environ["CONF_RQ_URL"])
    return _producer


@lock_conflict.connect
def _note_conflict(sender: str, task_id: str, action: str, **_: Any) -> None:
    _notes().rpush(f"actions:{task_id}", action)


@lock_backend_error.connect
def _note_backend_error(sender: str, task_id: str, policy: str, **_: Any) -> None:
    _notes().rpush(f"actions:{task_id}", f"backend_error:{policy}")


@lock_acquired.connect
def _note_acquired(sender: str, task_id: str, **_: Any) -> None:
    _notes().rpush(f"lease:{task_id}", "acquired")


@lock_released.connect
def _note_released(sender: str, task_id: str, **_: Any) -> None:
    _notes().rpush(f"lease:{task_id}", "released")


@lock_lost.connect
def _note_lost(sender: str, task_id: str, **_: Any) -> None:
    _notes().rpush(f"lease:{task_id}", "lost")
