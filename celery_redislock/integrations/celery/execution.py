"""What a locked task does as it starts, in the process that runs it: take the lease (acting on
a conflict), have the heartbeat keep it, give up the queued claim; and ``lock_for``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ...core import outcomes
from ...core.heartbeat import Heartbeat
from ...core.lease import Lease, RedisClient
from ...core.line import Parked, line_token, park
from ...core.lock import Lock
from ...core.naming import lock_name
from ...core.options import ConflictAction, LockOptions
from ...core.redlock import lock_factory
from ...errors import (
    JobFinished,
    LineFull,
    LockBackendError,
    LockConfigError,
    LockNotAcquired,
)
from .claiming import start_claim
from .conflicts import (
    await_first_delivery,
    backend_down,
    conflict,
    drop_finished,
    line_expired,
    line_full,
    parked,
)
from .ending import FINISH_ATTR, HELD, REQUEST_ATTR
from .kind import is_locked_task
from .line import LINE_EXPIRED_HEADER, LINE_HEADER, handover_for, payload_of, waited_in_line
from .publish import CONFLICTS_HEADER
from .rate import take_rate_slot
from .settings import Settings, client_for, settings_for
from .signals import lock_acquired, lock_backend_error, lock_lost

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from celery import Task

    from .task import LockedTask

__all__ = ["acquire_for", "lock_for", "make_lock"]

# task name -> (settings, client, options, handover, a lock made with them): every call of a
# task makes a lock with the same settings under its own name, which then need not be checked
# again (a worker's settings are read once; elsewhere a changed setting is a new Settings).
_made: dict[str, tuple[Settings, RedisClient, LockOptions, object, Lock]] = {}


def make_lock(task: LockedTask, settings: Settings, client: RedisClient, name: str) -> Lock:
    options = task.lock_options
    assert options is not None
    handover = handover_for(task.app)
    made = _made.get(task.name)
    if (
        made is not None
        and made[0] is settings
        and made[1] is client
        and made[2] is options
        and made[3] is handover
    ):
        return made[4]._renamed(name)
    lock = lock_factory(
        settings.redlock_urls or client,
        name,
        ttl=options.ttl or settings.ttl,
        mode=options.mode,
        limit=options.limit,
        namespace=settings.namespace,
        fence_keep=settings.fence_keep,
        handover=handover,
        handover_window=settings.line_handover_window,
    )
    if type(lock) is Lock and len(_made) < 4096:  # (a RedLock is made in full each time)
        _made[task.name] = (settings, client, options, handover, lock)
    return lock


def lock_for(
    task: LockedTask | Task,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
) -> Lock:
    """The lock a call of ``task`` with these arguments takes (same key derivation as the run).
    A task that declares no ``lock=`` (nor a ``unique=`` that implies one) raises
    :class:`LockConfigError`.

    >>> lock_for(sync_customer, (42,)).holders()   # doctest: +SKIP
    """
    if not is_locked_task(task) or task.lock_options is None:
        raise LockConfigError(f"task {getattr(task, 'name', task)!r} has no lock option")
    name = lock_name(task.name, task.lock_options, task.call_signature, args, kwargs or {})
    settings = settings_for(task.app)
    return make_lock(task, settings, client_for(task.app, settings), name)


def _max_hold(task: LockedTask, options: LockOptions) -> float | None:
    if options.max_hold is not None:
        return options.max_hold
    limits = task.request.timelimit or (None, None)  # this call's own time_limit, if given
    hard = limits[0] or task.time_limit
    if not hard:
        hard = settings_for(task.app).task_time_limit
    return float(hard) if hard else None


def acquire_for(task: LockedTask, task_id: str, args: Any, kwargs: Any) -> None:
    """Takes the task's lease before it runs, or acts on the conflict (raising Ignore, Retry,
    or an error, which the worker honours because this runs inside ``before_start``); then
    gives up the claim a unique task's message held on its key while queued."""
    options = task.lock_options
    unique = task.unique_options
    settings = settings_for(task.app)
    if settings.disabled:
        return  # the kill switch: no lock, no claim (logged as the worker starts)
    if task.rate_options is not None:
        take_rate_slot(task, task_id, args, kwargs, task.rate_options, settings)
    name = None
    if options is not None:
        name = lock_name(task.name, options, task.call_signature, args, kwargs)
        _take_lease(task, task_id, args, kwargs, name, options, settings)
    if unique is not None and unique.queued and not task.request.is_eager:
        # (an eager call was never checked at publish, so it is not checked here either)
        keying = unique.keying
        same_key = options is not None and (keying.key, keying.scope) == (
            options.key,
            options.scope,
        )
        if name is None or not same_key:
            name = lock_name(task.name, keying, task.call_signature, args, kwargs)
        start_claim(task, task_id, name, settings)


def _job(task: LockedTask, task_id: str) -> str | None:
    """This delivery's job: the task id, its retry and its conflict re-publish. Only an
    ``acks_late`` message can be delivered again after it ran (its ack lost with its worker),
    so only such a job is recorded as finished."""
    request = task.request
    headers = request.headers or {}
    token = headers.get(LINE_HEADER)
    if token and not request.is_eager:
        # Published from the task line: the hand-over may be published twice (its publisher
        # died before confirming it), so this job is always recorded as finished.
        return f"{task_id}.{int(request.retries or 0)}.{token}"
    if not task.acks_late or request.is_eager:
        return None
    conflicts = int(headers.get(CONFLICTS_HEADER, 0) or 0)
    return f"{task_id}.{int(request.retries or 0)}.{conflicts}"


def _take_lease(
    task: LockedTask,
    task_id: str,
    args: Any,
    kwargs: Any,
    name: str,
    options: LockOptions,
    settings: Settings,
) -> None:
    action: ConflictAction = options.on_conflict or settings.on_conflict
    job = _job(task, task_id)
    started = time.monotonic()
    headers = task.request.headers or {}
    token = headers.get(LINE_HEADER)
    info = {"task_id": task_id, "task": task.name}
    try:
        lock = make_lock(task, settings, client_for(task.app, settings), name)
        got: Lease | Parked | None = None
        if token and headers.get(LINE_EXPIRED_HEADER):
            pass  # its wait in line ended: it ends too (below)
        elif (action == "queue" or token) and not task.request.is_eager:
            fresh = token or line_token()
            got = park(
                lock,
                payload_of(task, fresh),
                token=fresh,
                owner=task_id,
                info=info,
                job=job,
                max_wait=options.max_wait,
                max_waiting=options.max_waiting,
            )
        else:
            # owner = task id, not re-entrant: a second delivery of a running task is a
            # conflict.
            got = lock.acquire(
                blocking=action == "wait",
                timeout=options.timeout if action == "wait" else None,
                owner=task_id,
                reentrant=False,
                info=info,
                job=job,
            )
    except JobFinished:
        drop_finished(task, task_id, lock)
    except LineFull as exc:
        line_full(task, task_id, lock, exc)
    except LockNotAcquired as exc:
        if exc.owner_expires_in is not None:  # another delivery of this very task holds it
            await_first_delivery(task, task_id, lock, exc.owner_expires_in)
        conflict(task, task_id, lock, action, options, (args, kwargs))
    except LockBackendError as exc:
        if lock_backend_error.receivers:
            lock_backend_error.send(
                sender=task,
                task_id=task_id,
                lock=name,
                error=exc,
                policy=settings.on_backend_error,
            )
        backend_down(task, task_id, name, settings, options, exc)
        return
    if got is None:
        line_expired(task, task_id, lock, options, (args, kwargs))
    if isinstance(got, Parked):
        parked(task, task_id, lock, got, options, (args, kwargs), settings)
    lease = got
    taken = time.monotonic()
    HELD.add(lease, task, taken)
    setattr(task.request, REQUEST_ATTR, lease)
    if job is not None:
        setattr(task.request, FINISH_ATTR, (lock, job))

    def on_lost(lost: Lease, error: BaseException | None) -> None:
        outcomes.lease_lost(task.name, task_id, lost.name, error)
        lock_lost.send(sender=task, task_id=task_id, lease=lost, error=error)

    Heartbeat.current().register(lease, on_lost=on_lost, max_hold=_max_hold(task, options))
    if lock_acquired.receivers:  # (no cost without receivers)
        waited = taken - started + (waited_in_line(headers) if token else 0.0)
        lock_acquired.send(sender=task, task_id=task_id, lock=name, lease=lease, waited=waited)
