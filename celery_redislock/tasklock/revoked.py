"""A revoked unique task gives up its key at once: when the worker holding its message hears
the revoke (prefetched, countdown and ETA messages), or when a worker discards it."""

from __future__ import annotations

import functools
from typing import Any

from celery.signals import task_revoked, worker_init
from celery.worker import control
from celery.worker import state as worker_state

from .runtime import end_claim
from .task import LockedTask

__all__: list[str] = []


def _release_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    # task_revoked fires in the worker's main process as a revoked or expired message is
    # discarded (and as a running task is terminated: its claim went when it started).
    if isinstance(sender, LockedTask) and request is not None:
        end_claim(sender, request.id, request.args, request.kwargs)


def _held_request(state: Any, task_id: str) -> Any:
    """The request of a message this worker holds: reserved, or waiting for its ETA (kept on
    the consumer's timer; Celery 5.7 also lists those in ``scheduled_requests``)."""
    request = worker_state.requests.get(task_id)
    if request is not None:
        return request
    timer = getattr(getattr(state, "consumer", None), "timer", None)
    for item in getattr(timer, "queue", ()):
        for arg in getattr(item[-1], "args", ()):
            if getattr(arg, "id", None) == task_id and hasattr(arg, "task"):
                return arg
    return None


def _wrap_revoke_command(**_: Any) -> None:
    """Celery only marks a revoked id and discards the message when its time comes (an ETA
    message: at its ETA). The revoke command is wrapped so that a message this worker holds
    gives up its key as soon as the revoke arrives."""
    revoke = control.Panel.data.get("revoke")
    if revoke is None or getattr(revoke, "_redislock", False):
        return

    @functools.wraps(revoke)
    def revoke_and_release(state: Any, task_id: Any, *args: Any, **kwargs: Any) -> Any:
        reply = revoke(state, task_id, *args, **kwargs)
        for one in [task_id] if isinstance(task_id, str) else list(task_id or ()):
            request = _held_request(state, one)
            if request is not None and isinstance(request.task, LockedTask):
                end_claim(request.task, one, request.args, request.kwargs)
        return reply

    revoke_and_release._redislock = True  # type: ignore[attr-defined]
    control.Panel.data["revoke"] = revoke_and_release


task_revoked.connect(_release_revoked, weak=False)
worker_init.connect(_wrap_revoke_command, weak=False)
