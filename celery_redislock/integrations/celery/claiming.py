"""A unique task's queued claim, from the worker's side: given up as the run starts (a copy
that was superseded meanwhile does not run), kept across a retry, given up when a job ends
without running."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore

from ...core import outcomes
from ...core.claims import ClaimKind, claim, release_claim
from ...core.naming import lock_name
from ...errors import LockBackendError, LockConfigError
from .ending import held_lease, release_held, store_skipped
from .publish import CONFLICTS_HEADER, REDELIVERY_HEADER
from .settings import Settings, client_for, settings_for
from .signals import lock_conflict

if TYPE_CHECKING:
    from .task import LockedTask

__all__ = ["end_claim", "keep_claim", "keep_claim_for_retry", "start_claim"]

log = logging.getLogger(__name__)


def _republished(request: Any) -> bool:
    headers = request.headers or {}
    return bool(request.retries) or CONFLICTS_HEADER in headers or REDELIVERY_HEADER in headers


def start_claim(task: LockedTask, task_id: str, name: str, settings: Settings) -> None:
    # The run lease (if any) is held by now, so a unique-until-finished job is never free
    # in between: a producer sees it queued, then running.
    try:
        holder = release_claim(client_for(task.app, settings), settings.namespace, name, task_id)
    except LockBackendError as exc:
        log.warning("unique key %r: could not release as task %s started: %s", name, task_id, exc)
        return
    if holder is None or _republished(task.request):
        return  # a retry runs even though a newer copy was queued after it started
    # This copy was replaced (its revoke may still be on its way, or was lost), or it outlived
    # its claim and a newer copy was queued. One of them runs: the newer.
    release_held(task)
    outcomes.superseded(task.name, task_id, holder, name)
    lock_conflict.send(
        sender=task, task_id=task_id, lock=name, action="superseded", holders=[holder]
    )
    store_skipped(task, task_id, name, [holder])
    raise Ignore()


def end_claim(task: LockedTask, task_id: str, args: Any, kwargs: Any) -> None:
    """Gives up the queued claim ``task_id`` may hold (it was revoked, skipped or failed before
    it started); never raises."""
    unique = task.unique_options
    if unique is None or not unique.queued:
        return
    try:
        name = lock_name(task.name, unique.keying, task.call_signature, args or (), kwargs or {})
        settings = settings_for(task.app)
        release_claim(client_for(task.app, settings), settings.namespace, name, task_id)
    except (LockBackendError, LockConfigError) as exc:
        log.warning("task %s[%s]: could not release its unique key: %s", task.name, task_id, exc)


def keep_claim(task: LockedTask, task_id: str, call: tuple[Any, Any], *, lifetime: float) -> None:
    """Extends the queued claim of ``task_id`` to ``lifetime`` seconds (a task parked in its
    lock's line stays queued as far as duplicates are concerned); never raises."""
    unique = task.unique_options
    if unique is None or not unique.queued:
        return
    args, kwargs = call
    try:
        name = lock_name(task.name, unique.keying, task.call_signature, args or (), kwargs or {})
        settings = settings_for(task.app)
        claim(
            client_for(task.app, settings),
            settings.namespace,
            name,
            task_id=task_id,
            lifetime=lifetime,
            kind=ClaimKind.REPUBLISH,
            running_counts=unique.running_counts,
        )
    except (LockBackendError, LockConfigError) as exc:
        log.warning("task %s[%s]: could not keep its unique key: %s", task.name, task_id, exc)


def keep_claim_for_retry(task: LockedTask) -> None:
    """Claims the key as queued for a job unique until it finishes that is about to retry,
    before its run lease goes (its retry's publish then extends the claim)."""
    unique = task.unique_options
    lease = held_lease(task)
    if unique is None or not unique.running_counts or lease is None or task.request.is_eager:
        return
    settings = settings_for(task.app)
    allowance = unique.allowance or settings.queue_allowance
    try:
        claim(
            client_for(task.app, settings),
            settings.namespace,
            lease.name,
            task_id=task.request.id,
            lifetime=allowance,
            kind=ClaimKind.REPUBLISH,
            running_counts=True,
        )
    except LockBackendError as exc:
        log.warning("unique key %r: could not keep it across a retry: %s", lease.name, exc)
