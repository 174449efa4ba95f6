"""The Celery app of ``benchmarks/celery_contended.py``: the same locked task three times, once
per conflict action (``retry``, ``wait``, ``queue``), plus the same with a cap of 3.

    CONTENDED_URL=redis://...   broker, results and locks on one Redis
    CONTENDED_RUN=<run id>      goes into every key

Each run records ``start end`` (``time.time()``, same host) under its key; every delivery of a
message (a first delivery, a conflict retry, a hand-over from the line) counts once.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import task_prerun

from celery_redislock import install

URL = os.environ.get("CONTENDED_URL", "redis://localhost:6379/0")
RUN = os.environ.get("CONTENDED_RUN", "dev")
app = install(Celery("contended_app", broker=URL, backend=URL))
app.conf.update(
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
    redislock_url=URL,
)
r = redis.Redis.from_url(URL)

ACTIONS = {
    "retry": {"on_conflict": "retry", "countdown": 0.1},
    "wait": {"on_conflict": "wait", "timeout": 120},
    "queue": {"on_conflict": "queue"},
}


def _work(kind: str, key: str, seconds: float) -> None:
    start = time.time()
    time.sleep(seconds)
    r.rpush(f"{RUN}:runs:{kind}:{key}", f"{start} {time.time()}")


def _task(action: str, capped: bool) -> Any:
    kind = f"{action}-cap" if capped else action
    lock = {"key": f"{RUN}:{kind}:" + ("cap" if capped else "{key}"), **ACTIONS[action]}
    if capped:
        lock["limit"] = 3

    @app.task(name=f"contended.{kind}", lock=lock)
    def run(key: str, seconds: float) -> None:
        _work(kind, key, seconds)

    return run


TASKS = {(action, capped): _task(action, capped) for action in ACTIONS for capped in (False, True)}


@task_prerun.connect
def _count_delivery(sender: Any = None, **_: Any) -> None:
    r.incr(f"{RUN}:deliveries:{getattr(sender, 'name', '?')}")
