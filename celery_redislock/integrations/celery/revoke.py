"""A revoked unique task gives up its key at once: when the worker holding its message hears
the revoke (prefetched, countdown and ETA messages), or when a worker discards it; and so does
a message a worker discards unrun because it does not know its task (an older deploy) or
cannot read it. A revoked link of a locked workflow gives its workflow's lease back the same
way."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.worker import state as worker_state

from ...core.line import drop_hand_over
from ...core.run.send import give_up_discarded
from ...errors import LockBackendError, LockConfigError
from ._compat import held_request, wrap_revoke_command
from .kind import CLAIM_HEADER, LINE_HEADER, is_locked_task
from .run import end_claim, lock_for
from .settings import client_for, settings_for
from .workflow import release_revoked_link

__all__ = ["release_discarded", "release_revoked", "wrap_revoke"]

log = logging.getLogger(__name__)


def release_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    """``task_revoked`` receiver: fires in the worker's main process as a revoked or expired
    message is discarded (and as a running task is terminated: its claim went when it
    started)."""
    if is_locked_task(sender) and request is not None:
        end_claim(sender, request.id, request.args, request.kwargs)
        token = (getattr(request, "headers", None) or {}).get(LINE_HEADER) or getattr(
            request, LINE_HEADER, None
        )
        if token and sender.lock_options is not None:
            _drop_hand_over(sender, request, str(token))


def release_discarded(
    sender: Any = None, message: Any = None, name: str | None = None, **_: Any
) -> None:
    """``task_unknown`` and ``task_rejected`` receiver: the worker's consumer (``sender``)
    discarded ``message`` unrun, its task ``name`` not registered here (a rolling deploy: an
    older worker took a new task's message) or the message unreadable. The unique claim the
    message holds, named by the header its publish added, goes: this worker need not know the
    task."""
    headers = getattr(message, "headers", None)
    if not isinstance(headers, dict):
        return
    claim, task_id = headers.get(CLAIM_HEADER), headers.get("id")
    app = getattr(sender, "app", None)
    if not (isinstance(claim, dict) and isinstance(task_id, str) and isinstance(app, Celery)):
        return  # not a unique call's message (or one published before the header existed)
    namespace, key = claim.get("namespace"), claim.get("key")
    if not (isinstance(namespace, str) and isinstance(key, str) and key):
        return
    settings = settings_for(app)
    if settings.disabled:
        return
    what = f"task {headers.get('task')}[{task_id}]"
    why = "discarded unrun (unregistered here)" if name else "rejected unrun"
    try:
        client = client_for(app, settings)
    except LockConfigError as exc:
        log.warning("%s %s: no Redis to give up its unique key %r: %s", what, why, key, exc)
        return
    give_up_discarded(client, namespace, key, task_id, what, why)


def _drop_hand_over(task: Any, request: Any, token: str) -> None:
    """A message published from a task line was discarded: the lock handed to it goes to the
    next in line now, not at the end of the hand-over window."""
    try:
        drop_hand_over(lock_for(task, request.args or (), request.kwargs or {}), token)
    except (LockBackendError, LockConfigError) as exc:
        log.warning(
            "task %s[%s]: could not give up its hand-over (the lock waits for its window): %s",
            task.name,
            request.id,
            exc,
        )


def _release_held(state: Any, task_id: str) -> None:
    request = held_request(state, task_id)
    if request is not None and is_locked_task(request.task):
        end_claim(request.task, task_id, request.args, request.kwargs)
        if request not in worker_state.active_requests:  # (a running link goes on with it)
            release_revoked_link(sender=request.task, request=request)


def wrap_revoke(**_: Any) -> None:
    """``worker_init`` receiver. Celery only marks a revoked id and discards the message when
    its time comes (an ETA message: at its ETA); with this, a message this worker holds gives
    up its key as soon as the revoke arrives."""
    wrap_revoke_command(_release_held)
