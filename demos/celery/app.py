"""The demo's Celery app: one task per use case, each noting when and where it ran.

Workers run it as ``celery -A demos.celery.app worker``. Broker, results and locks
are all on ``REDIS_URL``. Every run of a task appends an interval (use case, key, worker, pid,
fence, start and end in wall-clock seconds) to a Redis list; every lock conflict counts its
action, and notes it as an event (when, which task), as does every lease taken after a wait.
The demo's producer reads them to judge and draw what happened.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from celery import Celery

from celery_redislock import install
from celery_redislock.integrations.celery import lock_acquired, lock_conflict

from .._common.runs import note_event

URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
INTERVALS = "taskdemo:intervals"
ACTIONS = "taskdemo:actions"  # hash: "<case>:<action>" -> count
EVENTS = "taskdemo:events"  # conflicts and waits, as demos._common.runs.Event
# Work per run, in seconds; the quick demo halves it.
SCALE = float(os.environ.get("TASKDEMO_SCALE", "1"))

app = install(Celery("taskdemo", broker=URL, backend=URL))
app.conf.update(
    redislock_url=URL,
    worker_prefetch_multiplier=1,
    result_expires=600,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
r = redis.Redis.from_url(URL)
_HOST = socket.gethostname()


@contextmanager
def ran(task: Any, case: str, key: str) -> Iterator[None]:
    """Notes the run as an interval; a run killed midway keeps its start (end null)."""
    lease = task.lease
    record = {
        "case": case,
        "key": key,
        "worker": task.request.hostname or _HOST,
        "pid": os.getpid(),
        "fence": lease.fence if lease is not None else None,
        "task_id": task.request.id,
        "start": time.time(),
        "end": None,
    }
    index = r.rpush(INTERVALS, json.dumps(record)) - 1
    try:
        yield
    finally:
        record["end"] = time.time()
        r.lset(INTERVALS, index, json.dumps(record))


def _work(seconds: float) -> None:
    time.sleep(seconds * SCALE)


RETRY = {"on_conflict": "retry", "countdown": 0.1}


@app.task(bind=True, unique="until_finished")  # type: ignore[untyped-decorator]
def nightly_report(self: Any, day: str) -> str:
    """A singleton: enqueued many times, queued and run once at a time."""
    with ran(self, "singleton", f"report:{day}"):
        _work(1.5)
    return day


@app.task(bind=True, lock={"key": "customer:{customer_id}", **RETRY})  # type: ignore[untyped-decorator]
def sync_customer(self: Any, customer_id: int) -> int:
    """Never twice at once for one customer; customers run side by side."""
    with ran(self, "per-customer", f"customer:{customer_id}"):
        _work(0.15)
    return customer_id


@app.task(bind=True, lock={"key": "external-api", "limit": 3, "on_conflict": "queue"})  # type: ignore[untyped-decorator]
def call_api(self: Any, request_id: int) -> int:
    """At most 3 calls in flight across every worker."""
    with ran(self, "cap", "external-api"):
        _work(0.2)
    return request_id


@app.task(bind=True, lock={"key": "cache:{region}", "mode": "read", **RETRY})  # type: ignore[untyped-decorator]
def read_cache(self: Any, region: str) -> str:
    """Readers share the cache..."""
    with ran(self, "read-write", f"read:{region}"):
        _work(0.2)
    return region


@app.task(bind=True, lock={"key": "cache:{region}", "mode": "write", **RETRY})  # type: ignore[untyped-decorator]
def rebuild_cache(self: Any, region: str) -> str:
    """... and a rebuild runs alone."""
    with ran(self, "read-write", f"write:{region}"):
        _work(0.3)
    return region


@app.task(bind=True, lock={"key": "import:{batch}", "ttl": 3, "on_conflict": "wait", "timeout": 60})  # type: ignore[untyped-decorator]
def import_batch(self: Any, batch: str, seconds: float) -> str:
    """A long import; the worker running it is killed, and a waiting copy takes over."""
    with ran(self, "recovery", f"import:{batch}"):
        time.sleep(seconds)
    return batch


@app.task(bind=True, lock={"key": "ledger:{account}", "on_conflict": "queue"})  # type: ignore[untyped-decorator]
def post_ledger(self: Any, account: str, n: int) -> int:
    """One posting at a time per account; the rest wait in the lock's task line, in order."""
    r.rpush(f"taskdemo:order:{account}", n)
    with ran(self, "line", f"ledger:{account}"):
        _work(0.1)
    return n


def _case_of(sender: Any) -> str:
    return str(getattr(sender, "demo_case", None) or getattr(sender, "name", "?"))


def _count(sender: Any = None, action: str = "", task_id: str = "", **_: Any) -> None:
    r.hincrby(ACTIONS, f"{_case_of(sender)}:{action}", 1)
    note_event(r, EVENTS, _case_of(sender), action, task_id)


def _acquired(sender: Any = None, task_id: str = "", waited: float = 0.0, **_: Any) -> None:
    # Only a task that may wait for its lock: another one's ``waited`` is the acquire's own
    # time (a new process's first call connects), not a wait.
    options = getattr(sender, "lock_options", None)
    if options is not None and options.on_conflict in ("wait", "queue"):
        note_event(r, EVENTS, _case_of(sender), "acquired", task_id, waited)


for _task, _case in (
    (nightly_report, "singleton"),
    (sync_customer, "per-customer"),
    (call_api, "cap"),
    (read_cache, "read-write"),
    (rebuild_cache, "read-write"),
    (import_batch, "recovery"),
    (post_ledger, "line"),
):
    _task.demo_case = _case
lock_conflict.connect(_count, weak=False)
lock_acquired.connect(_acquired, weak=False)
