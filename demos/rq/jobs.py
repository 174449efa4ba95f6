"""The RQ part's jobs: one per use case, each noting when and where it ran.

Workers run them as ``rq worker -w celery_redislock.integrations.rq.LockWorker rqdemo``; the
lock Redis is each job's own RQ connection. Every run appends an interval (use case, key,
worker, horse pid, fence, start and end in wall-clock seconds) to a Redis list, in the format
of the Celery part's runs (:class:`demos._common.runs.TaskRun`), so both are judged and drawn
alike; every lock conflict, and every lease taken after a wait, is noted as an
:class:`~demos._common.runs.Event` (the enqueue's refusals in the producer). Locks and unique
claims live under the namespace ``rqdemo``, so one ``SCAN`` clears what
an earlier run left.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import redis
from rq import get_current_job

from celery_redislock.core.admin import describe_lock
from celery_redislock.integrations.rq import (
    Settings,
    lock_acquired,
    lock_conflict,
    locked,
    spec_of,
)

from .._common.runs import note_event

__all__ = [
    "EVENTS",
    "INTERVALS",
    "NAMESPACE",
    "QUEUE",
    "call_api",
    "import_batch",
    "nightly_report",
]

QUEUE = "rqdemo"
NAMESPACE = "rqdemo"
INTERVALS = f"{NAMESPACE}:intervals"
EVENTS = f"{NAMESPACE}:events"
# Work per run, in seconds; the quick demo halves it (the Celery part's variable).
SCALE = float(os.environ.get("TASKDEMO_SCALE", "1"))
SETTINGS = Settings(namespace=NAMESPACE)


@contextmanager
def ran(fun: Callable[..., Any], case: str, key: str, *args: Any) -> Iterator[None]:
    """Notes the run of ``fun(*args)`` as an interval; a run killed midway keeps its start (end
    null). Its fence is read from the lock's holders: the lease whose task id is this job's."""
    job = get_current_job()
    assert job is not None, "run by an RQ worker"
    spec = spec_of(fun)
    assert spec is not None
    state = describe_lock(job.connection, spec.lock_name(args, {}), NAMESPACE)
    fence = next((h.fence for h in state.holders if h.info.get("task_id") == job.id), None)
    record: dict[str, Any] = {
        "case": case,
        "key": key,
        "worker": os.environ.get("RQ_WORKER_ID", "?"),
        "pid": os.getpid(),
        "fence": fence,
        "task_id": job.id,
        "start": time.time(),
        "end": None,
        "horse": True,
    }
    index = job.connection.rpush(INTERVALS, json.dumps(record)) - 1
    try:
        yield
    finally:
        record["end"] = time.time()
        job.connection.lset(INTERVALS, index, json.dumps(record))


def _work(seconds: float) -> None:
    time.sleep(seconds * SCALE)


@locked(unique="until_finished", settings=SETTINGS)
def nightly_report(day: str) -> str:
    """A singleton: enqueued many times through ``UniqueQueue``, queued and run once."""
    with ran(nightly_report, "rq-singleton", f"report:{day}", day):
        _work(1.5)
    return day


@locked(
    lock={"key": "external-api", "limit": 3, "on_conflict": "wait", "timeout": 60},
    settings=SETTINGS,
)
def call_api(request_id: int) -> int:
    """At most 3 calls in flight across every worker; a fourth waits in the lock's line."""
    with ran(call_api, "rq-cap", "external-api", request_id):
        _work(0.2)
    return request_id


@locked(
    lock={"key": "import:{batch}", "ttl": 10, "on_conflict": "wait", "timeout": 60},
    settings=SETTINGS,
)
def import_batch(batch: str, seconds: float) -> str:
    """A long import; its horse is killed, and a copy waiting on another worker takes over
    (ttl 10 s: taking over well before that shows the parent released the dead horse's lease)."""
    with ran(import_batch, "rq-recovery", f"import:{batch}", batch, seconds):
        time.sleep(seconds)
    return batch


CASES = {"nightly_report": "rq-singleton", "call_api": "rq-cap", "import_batch": "rq-recovery"}
"""A job's function name -> its use case."""


@cache
def _events_client() -> redis.Redis:
    # The producer (refused enqueues) and the horses (conflicts, waits) alike: REDIS_URL is
    # set in both (the demo sets it, and the workers inherit it).
    return redis.Redis.from_url(os.environ["REDIS_URL"])


def _case(sender: object) -> str:
    name = str(sender).rsplit(".", 1)[-1]
    return CASES.get(name, name)


def _conflict(sender: object = None, action: str = "", task_id: str = "", **_: Any) -> None:
    note_event(_events_client(), EVENTS, _case(sender), action, task_id)


def _acquired(sender: object = None, task_id: str = "", waited: float = 0.0, **_: Any) -> None:
    # Only a job that may wait for its lock: another one's ``waited`` is the acquire's own time
    # (a new horse's first call connects), not a wait.
    spec = spec_of(globals().get(str(sender).rsplit(".", 1)[-1]))
    if spec is not None and spec.lock is not None and spec.lock.on_conflict in ("wait", "queue"):
        note_event(_events_client(), EVENTS, _case(sender), "acquired", task_id, waited)


lock_conflict.connect(_conflict)
lock_acquired.connect(_acquired)
