"""Celery task events for locks (``task-lock-acquired``, ``-released``, ``-conflict``, ``-lost``),
sent through Celery's own dispatcher so that Flower and ``celery events`` show them, whenever the
worker sends task events (``-E``, ``worker_send_task_events``, ``enable_events``). The dispatcher
lives in the main process, the events are sent from the pool child: the main process copies its
state into a byte of memory shared with the children, at each task received and heartbeat."""

from __future__ import annotations

import logging
import mmap
import threading
from typing import Any

from celery.signals import heartbeat_sent, task_received

from .signals import lock_acquired, lock_conflict, lock_lost, lock_released

__all__ = ["enable_at_worker_start"]

log = logging.getLogger(__name__)


class _Events:
    """This worker process's lock events: whether task events are on (one byte of anonymous
    shared memory, made in the main process before its pool forks, so that every child reads
    what the main process writes; a plain variable would be copied at fork and never change in
    the child), the worker's host name, and whether a failed send was logged (once)."""

    def __init__(self) -> None:
        self.switch: mmap.mmap | None = None
        self.hostname: str | None = None
        self.warned = threading.Event()

    def set(self, on: bool) -> None:
        if self.switch is not None:
            self.switch[0] = 1 if on else 0

    @property
    def on(self) -> bool:
        return self.switch is not None and self.switch[0] == 1


_EVENTS = _Events()


def _follow(dispatcher: Any) -> None:
    # As Celery's own task events (Request.send_event, EventDispatcher.send): an enabled
    # dispatcher that sends the "task" group, or every group.
    groups = getattr(dispatcher, "groups", None)
    _EVENTS.set(bool(getattr(dispatcher, "enabled", False)) and (not groups or "task" in groups))


def _send(task: Any, what: str, task_id: Any, lease: Any, **fields: Any) -> None:
    # A task declared with send_events=False sends none, as for Celery's own task events.
    if not _EVENTS.on or getattr(task, "send_events", True) is False:
        return
    app = getattr(task, "app", None)
    if app is None or not task_id:  # sent by a producer that published by name: no task
        return
    if what != "conflict":  # (from the lease)
        fields["fence"] = getattr(lease, "fence", None)
    if what == "acquired":
        fields["mode"] = getattr(lease, "mode", None)
    type_ = f"task-lock-{what}"
    hostname = _EVENTS.hostname or getattr(task.request, "hostname", None)
    try:
        with app.events.default_dispatcher(hostname=hostname) as dispatcher:
            dispatcher.send(type_, uuid=str(task_id), **fields)
    except Exception as exc:  # a monitoring event must never change how a task runs
        if not _EVENTS.warned.is_set():
            _EVENTS.warned.set()
            log.warning("celery_redislock: could not send the %s event: %r", type_, exc)


def enable_at_worker_start(sender: Any = None, **_: Any) -> None:
    """``worker_init`` receiver: connects the receivers that turn the lock signals into events
    (pool children, forked later, inherit them), and those that follow the worker's event
    dispatcher in its main process. Nothing is sent while task events are off."""
    if _EVENTS.switch is None:
        _EVENTS.switch = mmap.mmap(-1, 1)
    _EVENTS.set(bool(getattr(sender, "task_events", False)))
    _EVENTS.hostname = getattr(sender, "hostname", None)
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
    _follow(getattr(request, "eventer", None))


def _follow_heartbeat(sender: Any = None, **_: Any) -> None:
    # Every 2 s (the worker heartbeat): events turned on or off reach tasks already running.
    _follow(getattr(sender, "eventer", None))


def _acquired(sender: Any = None, task_id: Any = None, lease: Any = None, **kw: Any) -> None:
    _send(sender, "acquired", task_id, lease, lock=kw.get("lock", ""), waited=kw.get("waited"))


def _released(sender: Any = None, task_id: Any = None, lease: Any = None, **kw: Any) -> None:
    _send(sender, "released", task_id, lease, lock=kw.get("lock", ""), held=kw.get("held"))


def _conflict(sender: Any = None, task_id: Any = None, **kw: Any) -> None:
    holders = [str(h) for h in kw.get("holders") or ()]
    _send(
        sender,
        "conflict",
        task_id,
        None,
        lock=kw.get("lock", ""),
        action=kw.get("action", ""),
        holders=holders,
        retry_after=kw.get("retry_after"),
    )


def _lost(sender: Any = None, task_id: Any = None, lease: Any = None, **kw: Any) -> None:
    error = kw.get("error")
    lock = getattr(lease, "name", None)
    _send(sender, "lost", task_id, lease, lock=lock, error=None if error is None else str(error))
