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


class _Events:
    """This process's lock events: the switch (shared with the pool children), the worker's
    host name, and whether a failed send was logged (once)."""

    def __init__(self) -> None:
        self.switch: _Switch | None = None
        self.hostname: str | None = None
        self.warned = threading.Event()

    def start(self, worker: Any) -> None:
        on = bool(getattr(worker, "task_events", False))
        if self.switch is None:
            self.switch = _Switch(on)
        else:
            self.switch.set(on)
        self.hostname = getattr(worker, "hostname", None)

    def follow(self, dispatcher: Any) -> None:
        if self.switch is None:
            return
        # As Celery's own task events (Request.send_event, EventDispatcher.send): an enabled
        # dispatcher that sends the "task" group, or every group.
        groups = getattr(dispatcher, "groups", None)
        enabled = bool(getattr(dispatcher, "enabled", False))
        self.switch.set(enabled and (not groups or "task" in groups))

    def on(self, task: Any) -> bool:
        # A task declared with send_events=False sends none, as for Celery's own task events.
        return bool(self.switch) and getattr(task, "send_events", True) is not False

    def send(self, task: Any, type_: str, task_id: Any, **fields: Any) -> None:
        app = getattr(task, "app", None)
        if app is None or not task_id:  # sent by a producer that published by name: no task
            return
        hostname = self.hostname or getattr(task.request, "hostname", None)
        try:
            with app.events.default_dispatcher(hostname=hostname) as dispatcher:
                dispatcher.send(type_, uuid=str(task_id), **fields)
        except Exception as exc:  # a monitoring event must never change how a task runs
            if not self.warned.is_set():
                self.warned.set()
                log.warning("celery_redislock: could not send the %s event: %r", type_, exc)


_EVENTS = _Events()


def enable_at_worker_start(sender: Any = None, **_: Any) -> None:
    """``worker_init`` receiver: connects the receivers that turn the lock signals into events
    (pool children, forked later, inherit them), and those that follow the worker's event
    dispatcher in its main process. Nothing is sent while task events are off."""
    _EVENTS.start(sender)
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


def _follow_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    # Sent in the main process before the request goes to the pool: its child sees the state.
    _EVENTS.follow(getattr(request, "eventer", None))


def _follow_heartbeat(sender: Any = None, **_: Any) -> None:
    # Every 2 s (the worker heartbeat): events turned on or off reach tasks already running.
    _EVENTS.follow(getattr(sender, "eventer", None))


def _acquired(
    sender: Any = None, task_id: Any = None, lock: str = "", lease: Any = None, **kw: Any
) -> None:
    if _EVENTS.on(sender):
        _EVENTS.send(
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
    if _EVENTS.on(sender):
        _EVENTS.send(
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
    if _EVENTS.on(sender):
        holders = [str(h) for h in kw.get("holders") or ()]
        _EVENTS.send(
            sender, "task-lock-conflict", task_id, lock=lock, action=action, holders=holders
        )


def _lost(sender: Any = None, task_id: Any = None, lease: Any = None, **kw: Any) -> None:
    if _EVENTS.on(sender):
        error = kw.get("error")
        _EVENTS.send(
            sender,
            "task-lock-lost",
            task_id,
            lock=getattr(lease, "name", None),
            fence=getattr(lease, "fence", None),
            error=None if error is None else str(error),
        )
