"""Celery task events for locks, sent through Celery's own event mechanism so that Flower and
``celery events`` show them beside ``task-started`` and ``task-succeeded``:

``task-lock-acquired`` (lock, fence, mode, waited), ``task-lock-released`` (lock, fence, held),
``task-lock-conflict`` (lock, action, holders), ``task-lock-lost`` (lock, fence, error).

Only a worker started with task events on (``-E``, or ``worker_send_task_events = True``)
sends them: its receivers are connected as it starts, so without events nothing is added to
a task's run. (``celery control enable_events`` on a running worker does not turn them on.)
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .signals import lock_acquired, lock_conflict, lock_lost, lock_released

__all__ = ["EVENT_TYPES", "enable_at_worker_start"]

log = logging.getLogger(__name__)

EVENT_TYPES = (
    "task-lock-acquired",
    "task-lock-released",
    "task-lock-conflict",
    "task-lock-lost",
)

_hostname: list[str | None] = [None]
_warned = threading.Event()


def enable_at_worker_start(sender: Any = None, **_: Any) -> None:
    """``worker_init`` receiver: if the worker sends task events, connect the receivers that
    turn the lock signals into events (pool children, forked later, inherit them)."""
    if not getattr(sender, "task_events", False):
        return
    _hostname[0] = getattr(sender, "hostname", None)
    for signal, receiver in (
        (lock_acquired, _acquired),
        (lock_released, _released),
        (lock_conflict, _conflict),
        (lock_lost, _lost),
    ):
        signal.connect(
            receiver, weak=False, dispatch_uid=f"celery_redislock.events.{receiver.__name__}"
        )


def _send(task: Any, type_: str, task_id: Any, **fields: Any) -> None:
    app = getattr(task, "app", None)
    if app is None or not task_id:  # sent by a producer that published by name: no task here
        return
    hostname = _hostname[0] or getattr(task.request, "hostname", None)
    try:
        with app.events.default_dispatcher(hostname=hostname) as dispatcher:
            dispatcher.send(type_, uuid=str(task_id), **fields)
    except Exception as exc:  # a monitoring event must never change how a task runs
        if not _warned.is_set():
            _warned.set()
            log.warning("celery_redislock: could not send the %s event: %r", type_, exc)


def _acquired(
    sender: Any = None, task_id: Any = None, lock: str = "", lease: Any = None, **kw: Any
) -> None:
    _send(
        sender,
        "task-lock-acquired",
        task_id,
        lock=lock,
        fence=getattr(lease, "fence", None),
        mode=getattr(lease, "mode", None),
        waited=kw.get("waited"),
    )


def _released(
    sender: Any = None, task_id: Any = None, lock: str = "", lease: Any = None, **kw: Any
) -> None:
    _send(
        sender,
        "task-lock-released",
        task_id,
        lock=lock,
        fence=getattr(lease, "fence", None),
        held=kw.get("held"),
    )


def _conflict(
    sender: Any = None, task_id: Any = None, lock: str = "", action: str = "", **kw: Any
) -> None:
    holders = [str(h) for h in kw.get("holders") or ()]
    _send(sender, "task-lock-conflict", task_id, lock=lock, action=action, holders=holders)


def _lost(sender: Any = None, task_id: Any = None, lease: Any = None, **kw: Any) -> None:
    error = kw.get("error")
    _send(
        sender,
        "task-lock-lost",
        task_id,
        lock=getattr(lease, "name", None),
        fence=getattr(lease, "fence", None),
        error=None if error is None else str(error),
    )
