"""What a locked job does in the process that runs it (RQ's work horse): take the lease or act
on the conflict, give up the queued unique claim, run, and give the lease back however the call
ends (the horse leaves with ``os._exit``: ``atexit`` never runs, so the ``finally`` here is the
release)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...core import outcomes
from ...core.backoff import conflict_delay, first_delivery_delay
from ...core.claims import ClaimKind, claim, claim_holder_action, release_claim
from ...core.heartbeat import Heartbeat
from ...core.lease import Lease, RedisClient
from ...core.line import Parked
from ...core.lock import Lock
from ...errors import (
    JobFinished,
    LineFull,
    LockBackendError,
    LockConfigError,
    LockNotAcquired,
    LockNotOwned,
)
from . import parking
from ._compat import Job, Retry, current_job, retries_left, retry_after, save_meta
from .line import LINE_META, PutBack, line_of
from .logs import to_worker_log
from .rate import take_rate_slot
from .settings import Settings, client_for
from .signals import lock_acquired, lock_backend_error, lock_conflict, lock_lost, lock_released

if TYPE_CHECKING:
    from .job import JobSpec

__all__ = ["OUTCOME_META", "SKIPPED", "outcome_of", "republished", "run"]

log = logging.getLogger(__name__)

SKIPPED = "SKIPPED"
"""What a job returns when it did not run because of its lock: ``on_conflict="skip"``, a copy
superseded under its unique key, or a copy of a run that already finished. The job's
``meta["redislock"]`` says which (see :func:`outcome_of`)."""

OUTCOME_META = "redislock"
_CONFLICTS_META = "redislock_conflicts"
_WAITS_META = "redislock_waits"
# RQ's default job timeout; the parent kills a horse 60 s past its job's timeout.
_RQ_DEFAULT_TIMEOUT = 180
_KILL_GRACE = 60


def outcome_of(job: Job) -> dict[str, Any] | None:
    """Why a job did not run (``{"outcome": "skipped" | "superseded" | "finished" | "expired"
    | "full", "lock": ..., "holders": [...]}``; ``"queued"`` while it waits in the lock's task
    line), or ``None`` if it ran.

    >>> outcome_of(job)   # doctest: +SKIP
    {'outcome': 'skipped', 'lock': 'sync:42', 'holders': ['9b1c…']}
    """
    value = (job.meta or {}).get(OUTCOME_META)
    return value if isinstance(value, dict) else None


def republished(job: Job) -> bool:
    """Whether ``job`` runs again (an RQ retry, a conflict retry, a wait for its first copy)
    rather than for the first time."""
    meta = job.meta or {}
    return (
        bool(job.number_of_retries)
        or _CONFLICTS_META in meta
        or _WAITS_META in meta
        or LINE_META in meta
    )


class _Run:
    """One call of a locked job, in the process that runs it."""

    def __init__(self, spec: JobSpec, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        self.spec = spec
        self.args = args
        self.kwargs = kwargs
        self.job = current_job()
        self.settings: Settings = spec.settings
        self.job_id = self.job.id if self.job is not None else uuid.uuid4().hex
        connection = self.job.connection if self.job is not None else None
        self.client: RedisClient = client_for(self.settings, connection)
        self.lease: Lease | None = None
        self.taken = 0.0

    # -- the lease ---------------------------------------------------------------------------

    def take(self) -> object:
        """Takes the lease (``None``: go on and run) or returns what the job returns instead:
        ``SKIPPED`` or a ``Retry``. Raises for ``raise``, ``wait`` past its timeout, and a
        backend error under the ``fail`` policy."""
        spec, options = self.spec, self.spec.lock
        assert options is not None
        action = options.on_conflict or self.settings.on_conflict
        name = spec.lock_name(self.args, self.kwargs)
        job = self.job
        put_back = None
        if job is not None:  # its release hands the lock on to parked jobs, and puts them back
            put_back = PutBack(
                job.connection, job.serializer, self.client, self.settings.line_handover_window
            )
        lock = spec.make_lock(self.client, name, self.settings, put_back)
        # A job that waited in the task line goes on through it, whatever its lock says now.
        line = line_of(job) if job is not None else None
        in_line = job is not None and (action == "queue" or line is not None)
        if in_line and parking.wait_ended(line):
            parking.expired(self, lock)
        asked = time.monotonic()
        try:
            if in_line:
                got = parking.take_in_line(self, lock, line)
            else:
                got = lock.acquire(
                    blocking=action == "wait",
                    timeout=options.timeout if action == "wait" else None,
                    owner=self.job_id,
                    reentrant=False,  # a second copy of a running job is a conflict
                    info={"task_id": self.job_id, "task": spec.name},
                    job=self.job_id if job is not None else None,
                )
        except JobFinished:
            outcomes.dropped(spec.name, self.job_id, name)
            self.mark("finished", name, [self.job_id])
            self.signal_conflict(name, "drop", [self.job_id])
            return SKIPPED
        except LineFull as exc:
            parking.line_full(self, lock, exc)
        except LockNotAcquired as exc:
            if exc.owner_expires_in is not None and job is not None:
                return self.await_first_copy(lock, exc.owner_expires_in)
            return self.conflict(lock, action)
        except LockBackendError as exc:
            return self.backend_down(name, exc)
        if isinstance(got, Parked):
            return parking.parked(self, lock, got)
        self.lease = got
        waited = 0.0
        if line is not None:  # the time in line counts as waiting
            waited = max(0.0, time.time() - float(line.get("since", time.time())))
            self.left_line()
        Heartbeat.current().register(self.lease, on_lost=self.on_lost, max_hold=self.max_hold())
        self.taken = time.monotonic()
        if lock_acquired.receivers:
            lock_acquired.send(
                sender=spec.name,
                task_id=self.job_id,
                lock=name,
                lease=self.lease,
                waited=waited + self.taken - asked,
            )
        return None

    def left_line(self) -> None:
        """The job took the lease after waiting in line: its place and "queued" outcome go."""
        assert self.job is not None
        meta = self.job.meta
        changed = meta.pop(LINE_META, None) is not None
        outcome = meta.get(OUTCOME_META)
        if isinstance(outcome, dict) and outcome.get("outcome") == "queued":
            del meta[OUTCOME_META]
            changed = True
        if changed:
            try:
                save_meta(self.job)
            except Exception as exc:  # informative only; the job runs
                log.warning(
                    "job %s[%s]: could not update its meta: %s", self.spec.name, self.job_id, exc
                )

    def max_hold(self) -> float | None:
        assert self.spec.lock is not None
        if self.spec.lock.max_hold is not None:
            return self.spec.lock.max_hold
        if self.job is None:
            return None
        timeout = self.job.timeout or _RQ_DEFAULT_TIMEOUT
        return None if timeout == -1 else float(timeout) + _KILL_GRACE

    def on_lost(self, lost: Lease, error: BaseException | None) -> None:
        outcomes.lease_lost(self.spec.name, self.job_id, lost.name, error)
        if lock_lost.receivers:
            lock_lost.send(sender=self.spec.name, task_id=self.job_id, lease=lost, error=error)

    def release(self, finished: bool) -> None:
        """Gives the lease back; for a run that finished, records it so in the same step (a
        copy of this job requeued meanwhile is then dropped, not run twice). Never raises."""
        lease, self.lease = self.lease, None
        if lease is None:
            return
        Heartbeat.current().unregister(lease)
        job = self.job_id if finished and self.job is not None else None
        try:
            lease.release(finish_job=job, keep=self.settings.completion_ttl if job else None)
        except LockNotOwned:
            log.warning(
                "job %s[%s]: its lease on lock %r had lapsed before the job ended",
                self.spec.name,
                self.job_id,
                lease.name,
            )
        except LockBackendError as exc:
            log.warning(
                "job %s[%s]: could not release lock %r (it lapses within its ttl): %s",
                self.spec.name,
                self.job_id,
                lease.name,
                exc,
            )
        if lock_released.receivers:
            lock_released.send(
                sender=self.spec.name,
                task_id=self.job_id,
                lock=lease.name,
                lease=lease,
                held=time.monotonic() - self.taken,
            )

    # -- not running now ---------------------------------------------------------------------

    def await_first_copy(self, lock: Lock, expires_in: float) -> Retry:
        """Another copy of this very job holds the lease: RQ requeued it while the first one
        still runs (its worker was killed, the horse lives on) or died. Neither run beside it
        nor dropped: look again when that lease may have lapsed."""
        assert self.job is not None
        waits = self.bump(_WAITS_META)
        delay = first_delivery_delay(lock.ttl, expires_in, waits)
        outcomes.awaits_first(self.spec.name, self.job_id, lock.name, max(1, round(delay)))
        self.keep_claim(delay)
        self.signal_conflict(lock.name, "await", [self.job_id])
        return retry_after(self.job, delay)

    def signal_conflict(self, name: str, action: str, holders: list[str]) -> None:
        if lock_conflict.receivers:
            lock_conflict.send(
                sender=self.spec.name,
                task_id=self.job_id,
                lock=name,
                action=action,
                holders=holders,
            )

    def conflict(self, lock: Lock, action: str) -> object:
        spec, options = self.spec, self.spec.lock
        assert options is not None
        holders = self.holder_ids(lock)
        held_by = outcomes.held_by(holders)
        unique = spec.unique
        if unique is not None and unique.queued and self.job is not None:
            was = action
            action = claim_holder_action(
                self.client,
                self.settings.namespace,
                lock.name,
                self.job_id,
                action,
                running_counts=unique.running_counts,
            )
            if action != was:
                held_by += ", and this copy holds the unique claim"
        why = f"lock {lock.name!r} is held by {held_by}"
        self.signal_conflict(lock.name, action, holders)
        if action == "skip":
            outcomes.skipped(spec.name, self.job_id, lock.name, holders)
            self.mark("skipped", lock.name, holders)
            self.end_claim()
            return SKIPPED
        if action == "retry" and self.job is not None and not options.count_retries:
            conflicts = int((self.job.meta or {}).get(_CONFLICTS_META, 0))
            limit = options.max_retries
            if limit is None:
                limit = self.settings.max_conflict_retries
            if conflicts < limit:
                self.bump(_CONFLICTS_META)
                delay = conflict_delay(options.countdown, conflicts)
                retry = retry_after(self.job, delay)
                outcomes.retries(spec.name, self.job_id, retry.intervals[0], why)
                self.keep_claim(delay)
                return retry
            why = f"gave up after {conflicts} conflict retries: {why}"
        waited = f" after waiting {options.timeout}s" if action == "wait" else ""
        self.end_claim()
        raise LockNotAcquired(
            f"job {spec.name}[{self.job_id}]: {why}{waited}",
            name=lock.name,
            timeout=options.timeout if action == "wait" else None,
        )

    def backend_down(self, name: str, exc: LockBackendError) -> object:
        policy = self.settings.on_backend_error
        if lock_backend_error.receivers:
            lock_backend_error.send(
                sender=self.spec.name, task_id=self.job_id, lock=name, error=exc, policy=policy
            )
        if policy == "run":
            outcomes.runs_unlocked(self.spec.name, self.job_id, name, exc)
            return None
        if policy == "retry" and self.job is not None:
            assert self.spec.lock is not None
            conflicts = self.bump(_CONFLICTS_META)
            retry = retry_after(self.job, conflict_delay(self.spec.lock.countdown, conflicts))
            why = f"Redis for lock {name!r} failed: {exc}"
            outcomes.retries(self.spec.name, self.job_id, retry.intervals[0], why)
            return retry
        self.end_claim()
        raise exc

    def holder_ids(self, lock: Lock) -> list[str]:
        try:
            return [str(h.info.get("task_id", h.token)) for h in lock.holders()]
        except LockBackendError:
            return []

    def bump(self, field: str) -> int:
        """Counts one more in the job's meta; returns the count before."""
        assert self.job is not None
        before = int((self.job.meta or {}).get(field, 0))
        self.job.meta[field] = before + 1
        save_meta(self.job)
        return before

    def mark(self, outcome: str, name: str, holders: list[str]) -> None:
        """Records in the job's meta why it did not run (RQ stores what it returns, SKIPPED)."""
        if self.job is None:
            return
        self.job.meta[OUTCOME_META] = {"outcome": outcome, "lock": name, "holders": holders}
        try:
            save_meta(self.job)
        except Exception as exc:  # the outcome is informative; the job's ending must not fail
            log.warning(
                "job %s[%s]: could not record its outcome: %s", self.spec.name, self.job_id, exc
            )

    # -- the queued unique claim ---------------------------------------------------------------

    def unique_name(self) -> str:
        unique, lease = self.spec.unique, self.lease
        assert unique is not None
        options = self.spec.lock
        if (
            lease is not None
            and options is not None
            and (unique.keying.key, unique.keying.scope) == (options.key, options.scope)
        ):
            return lease.name
        return self.spec.unique_name(self.args, self.kwargs)

    def start_claim(self) -> str | None:
        """Gives up the claim this job's enqueue made, now that it runs (with its lease held, so
        a job unique until finished is never free in between). Returns the id of the job that
        superseded this one (it then does not run), or ``None``."""
        if self.spec.unique is None or not self.spec.unique.queued or self.job is None:
            return None
        name = self.unique_name()
        try:
            holder = release_claim(self.client, self.settings.namespace, name, self.job_id)
        except LockBackendError as exc:
            log.warning(
                "unique key %r: could not release as job %s started: %s", name, self.job_id, exc
            )
            return None
        meta = self.job.meta or {}
        if (
            holder is None
            or self.job.number_of_retries
            or _CONFLICTS_META in meta
            or _WAITS_META in meta
        ):
            return None  # a retry runs even though a newer copy was enqueued after it started
        outcomes.superseded(self.spec.name, self.job_id, holder, name)
        self.mark("superseded", name, [holder])
        self.signal_conflict(name, "superseded", [holder])
        return holder

    def end_claim(self) -> None:
        """The job ends without running: its queued claim goes (never raises)."""
        unique = self.spec.unique
        if unique is None or not unique.queued or self.job is None:
            return
        try:
            release_claim(self.client, self.settings.namespace, self.unique_name(), self.job_id)
        except (LockBackendError, LockConfigError) as exc:
            log.warning(
                "job %s[%s]: could not release its unique key: %s", self.spec.name, self.job_id, exc
            )

    def keep_claim(self, delay: float) -> None:
        """The job will run later (a retry): it holds its unique key meanwhile, as if queued."""
        unique = self.spec.unique
        if unique is None or not unique.queued or self.job is None:
            return
        try:
            claim(
                self.client,
                self.settings.namespace,
                self.unique_name(),
                task_id=self.job_id,
                lifetime=delay + (unique.allowance or self.settings.queue_allowance),
                kind=ClaimKind.REPUBLISH,
                running_counts=unique.running_counts,
            )
        except (LockBackendError, LockConfigError) as exc:
            log.warning(
                "job %s[%s]: could not keep its unique key across a retry: %s",
                self.spec.name,
                self.job_id,
                exc,
            )


_said_disabled = False


def _say_disabled() -> None:
    global _said_disabled
    if not _said_disabled:
        _said_disabled = True
        log.error(
            "celery_redislock is DISABLED (REDISLOCK_DISABLED or Settings(disabled=True)): "
            "jobs run without their locks and unique claims"
        )


def run(
    spec: JobSpec, fun: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """Runs one call of a locked job: see the module's docstring."""
    to_worker_log()  # (a plain rq Worker: its horse's first job; cheap after)
    if spec.settings.disabled:
        _say_disabled()
        return fun(*args, **kwargs)
    call = _Run(spec, args, kwargs)
    if spec.rate is not None:
        instead = take_rate_slot(call)
        if instead is not None:
            return instead
    if spec.lock is not None:
        instead = call.take()
        if instead is not None:
            return instead
    finished = False
    try:
        if call.start_claim() is not None:
            return SKIPPED
        result = fun(*args, **kwargs)
        finished = not isinstance(result, Retry)  # the job's own Retry: it runs again
        return result
    finally:
        unique = spec.unique
        retrying = not finished and call.job is not None and retries_left(call.job) > 0
        if retrying and unique is not None and unique.running_counts:
            call.keep_claim(0.0)  # RQ retries the failed job: still a duplicate meanwhile
        call.release(finished)
