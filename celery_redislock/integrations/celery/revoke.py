"""A revoked unique task gives up its key at once: when the worker holding its message hears
the revoke (prefetched, countdown and ETA messages), or when a worker discards it."""

from __future__ import annotations

from typing import Any

from ._compat import held_request, wrap_revoke_command
from .claiming import end_claim
from .kind import is_locked_task

__all__ = ["release_revoked", "wrap_revoke"]


def release_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    """``task_revoked`` receiver: fires in the worker's main process as a revoked or expired
    message is discarded (and as a running task is terminated: its claim went when it
    started)."""
    if is_locked_task(sender) and request is not None:
        end_claim(sender, request.id, request.args, request.kwargs)


def _release_held(state: Any, task_id: str) -> None:
    request = held_request(state, task_id)
    if request is not None and is_locked_task(request.task):
        end_claim(request.task, task_id, request.args, request.kwargs)


def wrap_revoke(**_: Any) -> None:
    """``worker_init`` receiver. Celery only marks a revoked id and discards the message when
    its time comes (an ETA message: at its ETA); with this, a message this worker holds gives
    up its key as soon as the revoke arrives."""
    wrap_revoke_command(_release_held)
