"""How a locked run ends in the process that ran it: the leases this process holds, given back
as the body ends (or, for an ``acks_late`` delivery, after its result is stored, with the
record that it finished), at a retry, and at process shutdown; and the ``SKIPPED`` state."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from ...core.heartbeat import Heartbeat
from ...core.lease import Lease
from ...errors import LockBackendError, LockNotOwned
from .settings import settings_for
from .signals import lock_released

if TYPE_CHECKING:
    from .task import LockedTask

__all__ = [
    "HELD",
    "SKIPPED",
    "end_run",
    "held_lease",
    "release",
    "release_all_held",
    "release_at_body_end",
    "release_held",
    "store_skipped",
]

log = logging.getLogger(__name__)

SKIPPED = "SKIPPED"
"""The result state of a task run that was skipped because its lock was held."""

REQUEST_ATTR = "_redislock_lease"
# (lock, job) of a run that took its lease: recorded as finished when the run ends for good.
FINISH_ATTR = "_redislock_finish"


class _Held:
    """The leases this process's tasks hold now, for release at process shutdown."""

    def __init__(self) -> None:
        self.leases: dict[str, Lease] = {}
        # token -> (the task that took it, time.monotonic() when it did): for lock_released.
        self.taken: dict[str, tuple[Any, float]] = {}
        self.guard = threading.Lock()

    def add(self, lease: Lease, task: Any = None, at: float | None = None) -> None:
        with self.guard:
            self.leases[lease.token] = lease
            self.taken[lease.token] = (task, time.monotonic() if at is None else at)

    def discard(self, lease: Lease) -> tuple[Any, float] | None:
        """Forgets ``lease``; returns who took it and when (``None`` if not held here)."""
        with self.guard:
            self.leases.pop(lease.token, None)
            return self.taken.pop(lease.token, None)

    def drain(self) -> list[Lease]:
        with self.guard:
            out = list(self.leases.values())
            self.leases.clear()
            return out


HELD = _Held()


def _reset_after_fork() -> None:
    # The parent's leases are the parent's; this process holds none yet. Emptied in place:
    # other modules hold a reference to HELD (rebinding it left them adding to a stale copy).
    HELD.__init__()  # type: ignore[misc]


os.register_at_fork(after_in_child=_reset_after_fork)


def end_run(task: LockedTask, state: str | None) -> None:
    """The run has ended (``task_postrun``: its result is stored): gives back the lease if it is
    still held and, for an ``acks_late`` delivery that ended for good, records the job as
    finished in the same step, so a redelivery of its message finds either the lease or the
    record, never neither. A retry (its new message carries the job on) or a requeued rejection
    is not an end. Never raises."""
    done = getattr(task.request, FINISH_ATTR, None)
    setattr(task.request, FINISH_ATTR, None)
    job = done[1] if done is not None and state in ("SUCCESS", "FAILURE", "IGNORED") else None
    keep = settings_for(task.app).completion_ttl if job is not None else None
    lease = held_lease(task)
    if lease is not None:
        setattr(task.request, REQUEST_ATTR, None)
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
    if getattr(task.request, FINISH_ATTR, None) is None:
        release_held(task)


def held_lease(task: LockedTask) -> Lease | None:
    lease = getattr(task.request, REQUEST_ATTR, None)
    return lease if isinstance(lease, Lease) else None


def release_held(task: LockedTask) -> None:
    """Gives back the lease the current run holds (if any) before the run has ended (a retry
    about to be published, a superseded copy): not an end of the job. Never raises."""
    setattr(task.request, FINISH_ATTR, None)
    lease = held_lease(task)
    if lease is None:
        return
    setattr(task.request, REQUEST_ATTR, None)
    release(lease)


def release(lease: Lease, *, finish_job: str | None = None, keep: float | None = None) -> None:
    Heartbeat.current().unregister(lease)
    taken = HELD.discard(lease)
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
    else:
        if taken is not None and lock_released.receivers:  # (no cost without receivers)
            task, at = taken
            lock_released.send(
                sender=task,
                task_id=lease.owner,
                lock=lease.name,
                lease=lease,
                held=time.monotonic() - at,
            )


def release_all_held() -> None:
    """Releases every lease this process's tasks hold (worker process shutdown)."""
    for lease in HELD.drain():
        release(lease)


def store_skipped(task: LockedTask, task_id: str, name: str, holders: list[str]) -> None:
    if task.ignore_result or task.request.is_eager:
        return
    # Without a result backend (NotImplementedError) the log line and the signal remain.
    with contextlib.suppress(NotImplementedError):
        task.backend.store_result(
            task_id, {"lock": name, "holders": holders}, SKIPPED, request=task.request
        )
