"""``rate=`` for Celery: a task's start takes a slot of its fleet-wide rate limit; a task over
the rate is published again once, with the countdown to its reserved slot (the broker holds it
until then: no worker slot held, no retry loop), and starts at that slot."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore, Reject

from ...core import outcomes
from ...core.naming import lock_name
from ...core.options import LockOptions
from ...core.rate import RateLimit
from ...core.rate_options import RateOptions
from ...errors import LockBackendError, LockNotAcquired
from .conflicts import backend_down
from .publish import RATE_HEADER
from .settings import Settings, client_for
from .signals import lock_backend_error, lock_conflict

if TYPE_CHECKING:
    from .task import LockedTask

__all__ = ["take_rate_slot"]

log = logging.getLogger(__name__)

# A slot this close ahead is waited for in place: cheaper than a message through the broker.
_WAIT_IN_PLACE_S = 0.05


def take_rate_slot(
    task: LockedTask,
    task_id: str,
    args: Any,
    kwargs: Any,
    options: RateOptions,
    settings: Settings,
) -> None:
    """Returns when this start fits the task's rate limit; otherwise re-publishes the task for
    its slot and raises ``Ignore`` (or fails it: ``max_delay`` passed)."""
    request = task.request
    name = lock_name(task.name, options.keying, task.call_signature, args or (), kwargs or {})
    request_id = f"{task_id}.{int(request.retries or 0)}"
    try:
        limit = RateLimit(
            client_for(task.app, settings), name, options.reserved, namespace=settings.namespace
        )
        slot = limit.reserve(request_id, max_delay=options.max_delay, max_late=options.slack)
    except LockBackendError as exc:
        if lock_backend_error.receivers:
            lock_backend_error.send(
                sender=task, task_id=task_id, lock=name, error=exc, policy=settings.on_backend_error
            )
        backend_down(task, task_id, name, settings, task.lock_options or LockOptions(), exc)
        return
    if not slot.granted:
        lock_conflict.send(sender=task, task_id=task_id, lock=name, action="rate", holders=[])
        raise LockNotAcquired(
            f"task {task.name}[{task_id}]: rate limit {name!r} ({options.rate}) has no start "
            f"free for {slot.delay:.1f}s, past max_delay ({options.max_delay}s)",
            name=name,
        )
    if slot.delay <= _WAIT_IN_PLACE_S or request.is_eager:
        if slot.delay:
            time.sleep(slot.delay)
        return
    _publish_for_slot(task, task_id, name, options, slot.delay, request_id)


def _publish_for_slot(
    task: LockedTask,
    task_id: str,
    name: str,
    options: RateOptions,
    delay: float,
    request_id: str,
) -> None:
    request = task.request
    outcomes.rate_full(task.name, task_id, name, options.rate, delay)
    lock_conflict.send(sender=task, task_id=task_id, lock=name, action="rate", holders=[])
    headers = {**(request.headers or {}), RATE_HEADER: request_id}
    try:
        task.signature_from_request(request, countdown=delay, headers=headers).apply_async()
    except Exception as exc:
        # Not re-published: the message goes back to the broker rather than being lost.
        log.warning(
            "task %s[%s]: could not re-publish for its slot (%s); requeued", task.name, task_id, exc
        )
        raise Reject(exc, requeue=True) from exc
    raise Ignore()
