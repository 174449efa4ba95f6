"""Celery task events for locks, sent through Celery's own event mechanism so that Flower and
``celery events`` show them beside ``task-started`` and ``task-succeeded``:

``task-lock-acquired`` (lock, fence, mode, waited), ``task-lock-released`` (lock, fence, held),
``task-lock-conflict`` (lock, action, holders), ``task-lock-lost`` (lock, fence, error).

They are sent while the worker sends task events, as Celery decides for its own: its event
dispatcher is enabled and sends the ``task`` group (``-E``, ``worker_send_task_events``, or
``celery control enable_events`` on a running worker; ``disable_events`` stops them). The
dispatcher lives in the worker's main process, the lock events are sent where the task runs (a
pool child): the main process copies the dispatcher's state into a byte of memory it shares with
its children, as each task is received and at each worker heartbeat.
"""

from __future__ import annotations

import logging
import mmap
import threading
from typing import Any

from celery.signals import heartbeat_sent, task_received

from .signals import lock_acquired, lock_conflict, lock_lost, lock_released

__all__ = ["EVENT_TYPES", "enable_at_worker_start"]

log = logging.getLogger(__name__)

EVENT_TYPES = (
    "task-lock-acquired",
    "task-lock-released",
    "task-lock-conflict",
    "task-lock-lost",
)


class _Switch:
    """Whether task events are on: one byte of anonymous shared memory, made in the worker's
    main process before its pool forks, so that every child reads what the main process wrote
    (a plain variable would be copied at fork and never change in the child)."""

    def __init__(self, on: bool) -> None:
        self._byte = mmap.mmap(-1, 1)  # MAP_SHARED | MAP_ANONYMOUS: shared across fork
        self.set(on)

    def set(self, on: bool) -> None:
        self._byte[0] = 1 if on else 0

    def __bool__(self) -> bool:
        return self._byte[0] == 1


_switch: list[_Switch | None] = [None]
_hostname: list[str | None] = [None]
_warned = threading.Event()


def enable_at_worker_start(sender: Any = None, **_: Any) -> None:
    """``worker_init`` receiver: connects the receivers that turn the lock signals into events
    (pool children, forked later, inherit them), and those that follow the worker's event
    dispatcher in its main process. Nothing is sent while task events are off."""
    on = bool(getattr(sender, "task_events", False))
    if _switch[0] is None:
        _switch[0] = _Switch(on)
    else:
        _switch[0].set(on)
    _hostname[0] = getattr(sender, "hostname", None)
    for signal, receiver in (
        (lock_acquired, _acquired),
        (lock_released, _released),
        (lock_conflict, _conflict),
        (lock_lost, _lost),
        (task_received, _follow_received),
        (heartbeat_sent, _follow_heartbeat),
    ):
        signal.connect(
            receiver, weak=False, dispatch_uid=f"celery_redislock.events.{receiver.__name__}"
        )


def _follow(dispatcher: Any) -> None:
    switch = _switch[0]
    if switch is None:
        return
    # As Celery's own task events (Request.send_event, EventDispatcher.send): an enabled
    # dispatcher that sends the "task" group, or every group.
    groups = getattr(dispatcher, "groups", None)
    switch.set(bool(getattr(dispatcher, "enabled", False)) and (not groups or "task" in groups))


def _follow_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    # Sent in the main process before the request goes to the pool: its child sees the state.
    _follow(getattr(request, "eventer", None))


def _follow_heartbeat(sender: Any = None, **_: Any) -> None:
    # Every 2 s (the worker heartbeat): events turned on or off reach tasks already running.
    _follow(getattr(sender, "eventer", None))


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


def _on(task: Any) -> bool:
    # A task declared with send_events=False sends none, as for Celery's own task events.
    return bool(_switch[0]) and getattr(task, "send_events", True) is not False


def _acquired(
    sender: Any = None, task_id: Any = None, lock: str = "", lease: Any = None, **kw: Any
) -> None:
    if _on(sender):
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
    if _on(sender):
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
    if _on(sender):
        holders = [str(h) for h in kw.get("holders") or ()]
        _send(sender, "task-lock-conflict", task_id, lock=lock, action=action, holders=holders)


def _lost(sender: Any = None, task_id: Any = None, lease: Any = None, **kw: Any) -> None:
    if _on(sender):
        error = kw.get("error")
        _send(
            sender,
            "task-lock-lost",
            task_id,
            lock=getattr(lease, "name", None),
            fence=getattr(lease, "fence", None),
            error=None if error is None else str(error),
        )
