"""What a run does when its lock is held: ``on_conflict`` (skip, retry, wait's timeout,
raise, queue: parked in the lock's task line), another delivery of the same task (wait for it,
or drop a copy whose job finished), and Redis failing (``redislock_on_backend_error``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NoReturn, cast

from celery.exceptions import Ignore, Reject, Retry

from ...core import outcomes
from ...core.backoff import conflict_delay, first_delivery_delay
from ...core.claims import claim_holder_action
from ...core.line import Parked
from ...core.lock import Lock
from ...core.options import ConflictAction, LockOptions
from ...errors import LineFull, LockBackendError, LockNotAcquired
from .claiming import end_claim, keep_claim
from .ending import store_skipped
from .publish import CONFLICTS_HEADER, REDELIVERY_HEADER
from .settings import Settings, client_for, settings_for
from .signals import lock_conflict

if TYPE_CHECKING:
    from .task import LockedTask

__all__ = [
    "await_first_delivery",
    "backend_down",
    "conflict",
    "drop_finished",
    "line_expired",
    "line_full",
    "parked",
]

log = logging.getLogger(__name__)


def _holder_ids(lock: Lock) -> list[str]:
    try:
        return [h.info.get("task_id", "?") for h in lock.holders()]
    except LockBackendError:
        return []


def drop_finished(task: LockedTask, task_id: str, lock: Lock) -> NoReturn:
    """This delivery's job is recorded as finished: its message was delivered again after it
    ran (the ack was lost with a worker). It is not run twice; the first run's result stands."""
    outcomes.dropped(task.name, task_id, lock.name)
    lock_conflict.send(sender=task, task_id=task_id, lock=lock.name, action="drop", holders=[])
    raise Ignore()


def await_first_delivery(task: LockedTask, task_id: str, lock: Lock, expires_in: float) -> NoReturn:
    """Another delivery of this very task holds the lease (the acquire script said so, in the
    same step that refused it): it still runs (visibility timeout, RabbitMQ requeue), or its
    worker died and the lease has yet to lapse. Which, nobody can tell yet, so this copy is
    neither run beside it nor dropped: it comes back once that lease may have lapsed. Then it is
    dropped if the first delivery finished, and run if it did not."""
    request = task.request
    if request.is_eager:
        raise LockNotAcquired(
            f"task {task.name}[{task_id}] (eager): another delivery holds lock {lock.name!r}",
            name=lock.name,
        )
    waits = int((request.headers or {}).get(REDELIVERY_HEADER, 0) or 0)
    # Look again when the lease would lapse if its holder is dead, or sooner, as a live holder
    # may finish any moment: after a third of the ttl, doubling while it keeps running.
    countdown = first_delivery_delay(lock.ttl, expires_in, waits)
    outcomes.awaits_first(task.name, task_id, lock.name, countdown)
    lock_conflict.send(
        sender=task, task_id=task_id, lock=lock.name, action="await", holders=[task_id]
    )
    # The same job (retries and conflict count unchanged), so its finish record applies.
    headers = {**(request.headers or {}), REDELIVERY_HEADER: waits + 1}
    try:
        task.signature_from_request(request, countdown=countdown, headers=headers).apply_async()
    except Exception as exc:
        # Not re-published: this message must not be acknowledged as done (nobody would run
        # the task if the first delivery died). Back to the broker with it.
        log.warning(
            "task %s[%s]: could not re-publish the waiting copy (%s); requeued",
            task.name,
            task_id,
            exc,
        )
        raise Reject(exc, requeue=True) from exc
    # Ignore, not Retry: a RETRY state stored now could land after the first delivery's result.
    raise Ignore()


def conflict(
    task: LockedTask,
    task_id: str,
    lock: Lock,
    action: ConflictAction,
    options: LockOptions,
    call: tuple[Any, Any],
) -> NoReturn:
    holders = _holder_ids(lock)
    held_by = outcomes.held_by(holders)
    unique = task.unique_options
    if unique is not None and unique.queued and not task.request.is_eager:
        settings = settings_for(task.app)
        was = action
        action = cast(
            ConflictAction,
            claim_holder_action(
                client_for(task.app, settings),
                settings.namespace,
                lock.name,
                task_id,
                action,
                running_counts=unique.running_counts,
            ),
        )
        if action != was:
            held_by += ", and this copy holds the unique claim"
    lock_conflict.send(sender=task, task_id=task_id, lock=lock.name, action=action, holders=holders)
    if action == "skip":
        outcomes.skipped(task.name, task_id, lock.name, holders)
        store_skipped(task, task_id, lock.name, holders)
        end_claim(task, task_id, *call)  # the job is over (other endings: task_postrun)
        raise Ignore()
    if action == "retry":
        _retry(task, task_id, options, lock.name, f"lock {lock.name!r} is held by {held_by}")
    waited = f" after waiting {options.timeout}s" if action == "wait" else ""
    raise LockNotAcquired(
        f"task {task.name}[{task_id}]: lock {lock.name!r} is held by {held_by}{waited}",
        name=lock.name,
        timeout=options.timeout if action == "wait" else None,
    )


def parked(
    task: LockedTask,
    task_id: str,
    lock: Lock,
    place: Parked,
    options: LockOptions,
    call: tuple[Any, Any],
    settings: Settings,
) -> NoReturn:
    """The task waits in the lock's line as data; this delivery ends (its message is acked).
    A unique task's queued claim is kept for as long as it may wait."""
    holders = _holder_ids(lock)
    outcomes.parked(task.name, task_id, lock.name, place.parked, holders)
    lock_conflict.send(
        sender=task, task_id=task_id, lock=lock.name, action="queue", holders=holders
    )
    unique = task.unique_options
    if unique is not None and unique.queued:
        allowance = unique.allowance or settings.queue_allowance
        keep_claim(
            task,
            task_id,
            call,
            lifetime=options.max_wait + settings.line_handover_window + allowance,
        )
    raise Ignore()


def line_expired(
    task: LockedTask, task_id: str, lock: Lock, options: LockOptions, call: tuple[Any, Any]
) -> NoReturn:
    """Published from the line because its wait passed ``max_wait``: it fails, not run."""
    outcomes.line_expired(task.name, task_id, lock.name, options.max_wait)
    lock_conflict.send(
        sender=task, task_id=task_id, lock=lock.name, action="expired", holders=_holder_ids(lock)
    )
    raise LockNotAcquired(
        f"task {task.name}[{task_id}]: waited in the task line of lock {lock.name!r} longer "
        f"than max_wait ({options.max_wait}s); not run",
        name=lock.name,
        timeout=options.max_wait,
    )


def line_full(task: LockedTask, task_id: str, lock: Lock, exc: LineFull) -> NoReturn:
    """The line holds ``max_waiting`` parked tasks: this one fails with :class:`LineFull`."""
    holders = _holder_ids(lock)
    outcomes.line_full(task.name, task_id, lock.name, exc.parked)
    lock_conflict.send(sender=task, task_id=task_id, lock=lock.name, action="full", holders=holders)
    raise exc


def _retry(task: LockedTask, task_id: str, options: LockOptions, name: str, why: str) -> NoReturn:
    request = task.request
    conflicts = int((request.headers or {}).get(CONFLICTS_HEADER, 0) or 0)
    countdown = conflict_delay(options.countdown, conflicts)
    outcomes.retries(task.name, task_id, countdown, why)
    if options.count_retries:
        # Past the task's own max_retries, Celery raises ``exc``: a LockNotAcquired naming the lock.
        exc = LockNotAcquired(f"task {task.name}[{task_id}]: {why}", name=name)
        raise task.retry(countdown=countdown, exc=exc)
    if options.max_retries is not None and conflicts >= options.max_retries:
        raise LockNotAcquired(
            f"task {task.name}[{task_id}]: gave up after {conflicts} conflict retries: {why}",
            name=name,
        )
    if request.is_eager:
        raise LockNotAcquired(f"task {task.name}[{task_id}] (eager): {why}", name=name)
    headers = {**(request.headers or {}), CONFLICTS_HEADER: conflicts + 1}
    signature = task.signature_from_request(request, countdown=countdown, headers=headers)
    signature.apply_async()
    raise Retry(why, when=countdown)


def backend_down(
    task: LockedTask,
    task_id: str,
    name: str,
    settings: Settings,
    options: LockOptions,
    exc: LockBackendError,
) -> None:
    policy = settings.on_backend_error
    if policy == "run":
        outcomes.runs_unlocked(task.name, task_id, name, exc)
        return
    if policy == "retry":
        _retry(task, task_id, options, name, f"Redis for lock {name!r} failed: {exc}")
    raise exc
