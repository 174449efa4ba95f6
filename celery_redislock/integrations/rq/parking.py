"""``on_conflict="queue"`` for RQ, in the horse: a job that finds its lock taken parks in the
lock's task line (core/line.py) and leaves the worker. It returns RQ's ``Retry`` so that RQ
keeps it, neither finished nor failed, in the scheduled registry, due only long after its wait
could have ended (a fallback that needs RQ's scheduler); whoever frees the lock moves it to
its queue at once (:class:`.line.PutBack`), and it claims the lock handed to it as it starts.

Why a ``Retry``: what a job returns is all RQ lets it decide (a return value finishes it, an
exception fails it, a ``Retry`` keeps it), and a ``Retry`` with a delay parks it the same way
on RQ 2.1 and 3.0: status ``scheduled``, off the queue, its result not written.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NoReturn

from ...core import outcomes
from ...core.lease import Lease
from ...core.line import Parked, park
from ...core.lock import Lock
from ...errors import LineFull, LockNotAcquired
from ._compat import Retry, retry_after
from .line import LINE_META, line_of, payload_of

if TYPE_CHECKING:
    from .running import _Run

__all__ = ["expired", "line_full", "parked", "take_in_line", "wait_ended"]

# The fallback: a parked job nobody puts back (its line lost with the lock Redis, no sweeper
# running) is run by RQ's scheduler this long after its wait and hand-over window would have
# ended; it then ends as expired.
FALLBACK_MARGIN_S = 60.0


def wait_ended(line: dict[str, Any] | None) -> bool:
    """Whether the job's wait in line is over without the lock: published as expired, or run
    by RQ's fallback after its wait's end."""
    if line is None:
        return False
    state = line.get("state")
    return state == "expired" or (state == "parked" and time.time() > float(line.get("until", 0)))


def take_in_line(run: _Run, lock: Lock, line: dict[str, Any] | None) -> Lease | Parked:
    """Takes the lease (free, or handed to this job's entry) or parks the job. Raises as
    :func:`celery_redislock.core.line.park` does."""
    assert run.job is not None and run.spec.lock is not None
    options = run.spec.lock
    return park(
        lock,
        payload_of(run.job, lock),
        token=line["token"] if line is not None else None,
        owner=run.job_id,
        info={"task_id": run.job_id, "task": run.spec.name},
        job=run.job_id,
        max_wait=options.max_wait,
        max_waiting=options.max_waiting,
    )


def parked(run: _Run, lock: Lock, place: Parked) -> Retry:
    """The job waits in line: its place and outcome go in its meta, a unique job keeps its
    queued claim for as long as it may wait, and RQ keeps it scheduled."""
    job, options = run.job, run.spec.lock
    assert job is not None and options is not None
    holders = run.holder_ids(lock)
    outcomes.parked(run.spec.name, run.job_id, lock.name, place.parked, holders)
    window = run.settings.line_handover_window
    now = time.time()
    before = line_of(job)
    job.meta[LINE_META] = {
        "token": place.token,
        "state": "parked",
        "until": now + options.max_wait,
        "since": before.get("since", now) if before is not None else now,
    }
    run.mark("queued", lock.name, holders)
    run.signal_conflict(lock.name, "queue", holders)
    run.keep_claim(options.max_wait + window)
    return retry_after(job, options.max_wait + window + FALLBACK_MARGIN_S)


def expired(run: _Run, lock: Lock) -> NoReturn:
    """Its wait passed ``max_wait``: the job fails with :class:`LockNotAcquired`, not run."""
    job, options = run.job, run.spec.lock
    assert job is not None and options is not None
    outcomes.line_expired(run.spec.name, run.job_id, lock.name, options.max_wait)
    holders = run.holder_ids(lock)
    job.meta.pop(LINE_META, None)  # an RQ retry of this failure starts afresh
    run.mark("expired", lock.name, holders)
    run.signal_conflict(lock.name, "expired", holders)
    run.end_claim()
    raise LockNotAcquired(
        f"job {run.spec.name}[{run.job_id}]: waited in the task line of lock {lock.name!r} "
        f"longer than max_wait ({options.max_wait:g}s); not run",
        name=lock.name,
        timeout=options.max_wait,
    )


def line_full(run: _Run, lock: Lock, exc: LineFull) -> NoReturn:
    """The line holds ``max_waiting`` parked jobs: the job fails with :class:`LineFull`."""
    holders = run.holder_ids(lock)
    outcomes.line_full(run.spec.name, run.job_id, lock.name, exc.parked)
    if run.job is not None:
        run.job.meta.pop(LINE_META, None)
    run.mark("full", lock.name, holders)
    run.signal_conflict(lock.name, "full", holders)
    run.end_claim()
    raise exc
