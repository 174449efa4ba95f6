"""The test app (tests/lockapp.py) with a few more tasks and receivers for the operator tests:
a copy that waits long in line for ``hold:<name>``, and receivers noting the lock signals in
Redis (``signal:lock_acquired``, ``signal:lock_released``: JSON records). Workers import it as
``cliapp``; ``CLIAPP_EVENTS=1`` makes them send task events, ``CLIAPP_METRICS=1`` connects the
Prometheus metrics."""

from __future__ import annotations

import json
import os
from typing import Any

from lockapp import app, r, started

from celery_redislock import lock_acquired, lock_released

__all__ = ["app"]

if os.environ.get("CLIAPP_EVENTS") == "1":
    app.conf.worker_send_task_events = True


@app.task(bind=True, lock={"key": "hold:{name}", "on_conflict": "wait", "timeout": 120})
def waits_long(self: Any, name: str) -> str:
    """Waits in line for ``hold:<name>`` for up to two minutes, then notes its start."""
    started(f"waited:{name}", self.request.id)
    return "ran"


def _note(kind: str, sender: Any, task_id: Any, lock: str, lease: Any, **kw: Any) -> None:
    record = {
        "sender": getattr(sender, "name", None),
        "task_id": task_id,
        "lock": lock,
        "fence": lease.fence,
        "pid": os.getpid(),
        **{k: v for k, v in kw.items() if k in ("waited", "held")},
    }
    r.rpush(f"signal:{kind}", json.dumps(record))


def _on_acquired(sender: Any = None, **kw: Any) -> None:
    _note("lock_acquired", sender, **kw)


def _on_released(sender: Any = None, **kw: Any) -> None:
    _note("lock_released", sender, **kw)


lock_acquired.connect(_on_acquired, weak=False)
lock_released.connect(_on_released, weak=False)


if os.environ.get("CLIAPP_METRICS") == "1":
    from celery_redislock.contrib import prometheus

    prometheus.install()
