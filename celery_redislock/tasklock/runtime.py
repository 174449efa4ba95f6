"""What a locked task does in the process that runs it: take the lease, act on a conflict,
keep the lease alive, give it back."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
from typing import TYPE_CHECKING, Any, NoReturn

from celery.exceptions import Ignore, Reject, Retry

from ..errors import (
    JobFinished,
    LockBackendError,
    LockConfigError,
    LockNotAcquired,
    LockNotOwned,
)
from ..lock import Lease, Lock, RedisClient
from ..renewal import Renewer
from .enqueue import CONFLICTS_HEADER, REDELIVERY_HEADER
from .keyname import lock_name
from .options import ConflictAction, LockOptions
from .settings import Settings, client_for, settings_for
from .signals import lock_conflict, lock_lost
from .unique import claim, release_claim

if TYPE_CHECKING:
    from .task import LockedTask

__all__ = ["SKIPPED", "acquire_for", "lock_for", "release_held"]

log = logging.getLogger("celery_redislock")

SKIPPED = "SKIPPED"
"""The result state of a task run that was skipped because its lock was held."""

_REQUEST_ATTR = "_redislock_lease"
# (lock, job) of a run that took its lease: recorded as finished when the run ends for good.
_FINISH_ATTR = "_redislock_finish"
_MAX_BACKOFF_DOUBLINGS = 5


class _Held:
    """The leases this process's tasks hold now, for release at process shutdown."""

    def __init__(self) -> None:
        self.leases: dict[str, Lease] = {}
        self.guard = threading.Lock()

    def add(self, lease: Lease) -> None:
        with self.guard:
            self.leases[lease.token] = lease

    def discard(self, lease: Lease) -> None:
        with self.guard:
            self.leases.pop(lease.token, None)

    def drain(self) -> list[Lease]:
        with self.guard:
            out = list(self.leases.values())
            self.leases.clear()
            return out


HELD = _Held()


def _reset_after_fork() -> None:
    global HELD
    HELD = _Held()  # the parent's leases are the parent's; this process holds none yet


os.register_at_fork(after_in_child=_reset_after_fork)


def make_lock(task: LockedTask, settings: Settings, client: RedisClient, name: str) -> Lock:
    options = task.lock_options
    assert options is not None
    return Lock(
        client,
        name,
        ttl=options.ttl or settings.ttl,
        mode=options.mode,
        limit=options.limit,
        namespace=settings.namespace,
        fence_keep=settings.fence_keep,
    )


def lock_for(task: Any, args: Any = (), kwargs: Any = None) -> Lock:
    """The lock a call of ``task`` with these arguments takes (same key derivation as the run).

    >>> lock_for(sync_customer, (42,)).holders()   # doctest: +SKIP
    """
    from .task import LockedTask

    if not isinstance(task, LockedTask) or task.lock_options is None:
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
        _start_claim(task, task_id, name, settings)


def _job(task: LockedTask, task_id: str) -> str | None:
    """This delivery's job: the task id, its retry and its conflict re-publish. Only an
    ``acks_late`` message can be delivered again after it ran (its ack lost with its worker),
    so only such a job is recorded as finished."""
    request = task.request
    if not task.acks_late or request.is_eager:
        return None
    conflicts = int((request.headers or {}).get(CONFLICTS_HEADER, 0) or 0)
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
    try:
        lock = make_lock(task, settings, client_for(task.app, settings), name)
        # owner = task id, not re-entrant: a second delivery of a running task is a conflict.
        lease = lock.acquire(
            blocking=action == "wait",
            timeout=options.timeout if action == "wait" else None,
            owner=task_id,
            reentrant=False,
            info={"task_id": task_id, "task": task.name},
            job=job,
        )
    except JobFinished:
        _drop_finished(task, task_id, lock)
    except LockNotAcquired as exc:
        if exc.owner_expires_in is not None:  # another delivery of this very task holds it
            _await_first_delivery(task, task_id, lock, exc.owner_expires_in)
        _conflict(task, task_id, lock, action, options, (args, kwargs))
    except LockBackendError as exc:
        _backend_down(task, task_id, name, settings, options, exc)
        return
    HELD.add(lease)
    setattr(task.request, _REQUEST_ATTR, lease)
    if job is not None:
        setattr(task.request, _FINISH_ATTR, (lock, job))

    def on_lost(lost: Lease, error: BaseException | None) -> None:
        log.error(
            "task %s[%s]: lease on lock %r lost%s; the task goes on without it",
            task.name,
            task_id,
            lost.name,
            f" ({error})" if error else "",
        )
        lock_lost.send(sender=task, task_id=task_id, lease=lost, error=error)

    Renewer.current().register(lease, on_lost=on_lost, max_hold=_max_hold(task, options))


def _republished(request: Any) -> bool:
    headers = request.headers or {}
    return bool(request.retries) or CONFLICTS_HEADER in headers or REDELIVERY_HEADER in headers


def _start_claim(task: LockedTask, task_id: str, name: str, settings: Settings) -> None:
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
    log.info(
        "task %s[%s] skipped: superseded by %s under unique key %r",
        task.name,
        task_id,
        holder,
        name,
    )
    lock_conflict.send(
        sender=task, task_id=task_id, lock=name, action="superseded", holders=[holder]
    )
    _store_skipped(task, task_id, name, [holder])
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
            task.request.id,
            allowance,
            "r",
            True,
        )
    except LockBackendError as exc:
        log.warning("unique key %r: could not keep it across a retry: %s", lease.name, exc)


def end_run(task: LockedTask, state: str | None) -> None:
    """The run has ended (``task_postrun``: its result is stored): gives back the lease if it is
    still held and, for an ``acks_late`` delivery that ended for good, records the job as
    finished in the same step, so a redelivery of its message finds either the lease or the
    record, never neither. A retry (its new message carries the job on) or a requeued rejection
    is not an end. Never raises."""
    done = getattr(task.request, _FINISH_ATTR, None)
    setattr(task.request, _FINISH_ATTR, None)
    job = done[1] if done is not None and state in ("SUCCESS", "FAILURE", "IGNORED") else None
    keep = settings_for(task.app).completion_ttl if job is not None else None
    lease = held_lease(task)
    if lease is not None:
        setattr(task.request, _REQUEST_ATTR, None)
        release(lease, finish_job=job, keep=keep)
        return
    if done is None or job is None:
        return
    try:
        done[0].finish_job(job, keep=keep)
    except LockBackendError as exc:
        log.warning(
            "task %s[%s]: could not record that it finished (a redelivery of its message "
            "would run it again): %s",
            task.name,
            task.request.id,
            exc,
        )


def release_at_body_end(task: LockedTask) -> None:
    """As the body ends: gives the lease back at once, so that whoever waits on the result
    finds the lock free; except for an ``acks_late`` delivery, whose lease is given back after
    its result is stored, together with the record that it finished (:func:`end_run`)."""
    if getattr(task.request, _FINISH_ATTR, None) is None:
        release_held(task)


def held_lease(task: LockedTask) -> Lease | None:
    lease = getattr(task.request, _REQUEST_ATTR, None)
    return lease if isinstance(lease, Lease) else None


def release_held(task: LockedTask) -> None:
    """Gives back the lease the current run holds (if any) before the run has ended (a retry
    about to be published, a superseded copy): not an end of the job. Never raises."""
    setattr(task.request, _FINISH_ATTR, None)
    lease = held_lease(task)
    if lease is None:
        return
    setattr(task.request, _REQUEST_ATTR, None)
    release(lease)


def release(lease: Lease, *, finish_job: str | None = None, keep: float | None = None) -> None:
    Renewer.current().unregister(lease)
    HELD.discard(lease)
    if lease.released:
        return
    try:
        lease.release(finish_job=finish_job, keep=keep)
    except LockBackendError as exc:
        log.warning("lock %r: release failed, the lease lapses within its ttl: %s", lease.name, exc)
    except LockNotOwned as exc:  # expired or removed (LockLost): nothing left to give back
        log.warning("lock %r: lease was no longer held at release: %s", lease.name, exc)
    except Exception:  # never mask how the task itself ended
        log.exception("lock %r: release failed, the lease lapses within its ttl", lease.name)


def release_all_held() -> None:
    """Releases every lease this process's tasks hold (worker process shutdown)."""
    for lease in HELD.drain():
        release(lease)


# -- conflicts ---------------------------------------------------------------------------------


def _holder_ids(lock: Lock) -> list[str]:
    try:
        return [h.info.get("task_id", "?") for h in lock.holders()]
    except LockBackendError:
        return []


def _drop_finished(task: LockedTask, task_id: str, lock: Lock) -> NoReturn:
    """This delivery's job is recorded as finished: its message was delivered again after it
    ran (the ack was lost with a worker). It is not run twice; the first run's result stands."""
    log.info(
        "task %s[%s]: this delivery already ran to its end under lock %r; dropped",
        task.name,
        task_id,
        lock.name,
    )
    lock_conflict.send(sender=task, task_id=task_id, lock=lock.name, action="drop", holders=[])
    raise Ignore()


def _await_first_delivery(
    task: LockedTask, task_id: str, lock: Lock, expires_in: float
) -> NoReturn:
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
    backoff = lock.ttl / 3 * 2 ** min(waits, _MAX_BACKOFF_DOUBLINGS)
    countdown = min(max(expires_in, 0.0), backoff) + random.uniform(0.1, 0.5)
    log.info(
        "task %s[%s]: another delivery of this task holds lock %r (running, or its worker "
        "died); this one looks again in %.1fs",
        task.name,
        task_id,
        lock.name,
        countdown,
    )
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


def _conflict(
    task: LockedTask,
    task_id: str,
    lock: Lock,
    action: ConflictAction,
    options: LockOptions,
    call: tuple[Any, Any],
) -> NoReturn:
    holders = _holder_ids(lock)
    held_by = ", ".join(holders) or "a task that just finished"
    lock_conflict.send(sender=task, task_id=task_id, lock=lock.name, action=action, holders=holders)
    if action == "skip":
        log.info(
            "task %s[%s] skipped: lock %r is held by %s", task.name, task_id, lock.name, held_by
        )
        _store_skipped(task, task_id, lock.name, holders)
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


def _store_skipped(task: LockedTask, task_id: str, name: str, holders: list[str]) -> None:
    if task.ignore_result or task.request.is_eager:
        return
    # Without a result backend (NotImplementedError) the log line and the signal remain.
    with contextlib.suppress(NotImplementedError):
        task.backend.store_result(
            task_id, {"lock": name, "holders": holders}, SKIPPED, request=task.request
        )


def _retry(task: LockedTask, task_id: str, options: LockOptions, name: str, why: str) -> NoReturn:
    request = task.request
    conflicts = int((request.headers or {}).get(CONFLICTS_HEADER, 0) or 0)
    base = options.countdown * 2 ** min(conflicts, _MAX_BACKOFF_DOUBLINGS)
    countdown = random.uniform(base / 2, base)  # jitter: duplicates do not come back together
    log.info("task %s[%s] retries in %.1fs: %s", task.name, task_id, countdown, why)
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


def _backend_down(
    task: LockedTask,
    task_id: str,
    name: str,
    settings: Settings,
    options: LockOptions,
    exc: LockBackendError,
) -> None:
    policy = settings.on_backend_error
    if policy == "run":
        log.error(
            "task %s[%s] runs WITHOUT lock %r: Redis failed: %s", task.name, task_id, name, exc
        )
        return
    if policy == "retry":
        _retry(task, task_id, options, name, f"Redis for lock {name!r} failed: {exc}")
    raise exc
