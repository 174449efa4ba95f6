"""Enqueue-time uniqueness for RQ: a ``Queue`` whose every way in (``enqueue``,
``enqueue_call``, ``enqueue_job``, ``enqueue_many``, ``enqueue_at``/``enqueue_in``, dependents
released later) claims a unique job's key before the job is queued."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from rq import Queue
from rq.exceptions import NoSuchJobError

from ...core.claims import Claim, ClaimKind, publish_claimed
from ...errors import DuplicateTask, LockBackendError
from ._compat import Job
from .job import JobSpec, spec_of
from .running import republished
from .settings import client_for
from .signals import lock_conflict

__all__ = ["UniqueQueue"]

log = logging.getLogger(__name__)

# Past a year it is no claim but a mistake; Redis must not be handed a number it cannot take.
_MAX_CLAIM_S = 365 * 86400.0


class UniqueQueue(Queue):
    """An RQ ``Queue`` that keeps a ``@locked(unique=...)`` job from being queued twice: a
    duplicate call returns the job already queued or running (``on_duplicate="existing"``),
    raises :class:`DuplicateTask` (``"raise"``), or replaces the queued one (``"replace"``).
    Jobs without ``unique=`` pass through unchanged.

    Use it wherever jobs are enqueued (``UniqueQueue("default", connection=r)``, or
    ``@job("default", queue_class=UniqueQueue)``). RQ's scheduler moves due jobs with a plain
    ``Queue``: a scheduled job is checked when it is scheduled, not again when it is due.

    >>> q = UniqueQueue("default", connection=redis.Redis())   # doctest: +SKIP
    >>> first = q.enqueue(nightly_report, day="2026-11-22")   # doctest: +SKIP
    >>> q.enqueue(nightly_report, day="2026-11-22").id == first.id   # doctest: +SKIP
    True
    """

    def _enqueue_job(self, job: Job, *args: Any, **kwargs: Any) -> Job:
        spec = spec_of(job.func) if job.func_name else None
        if spec is None or spec.unique is None or not spec.unique.queued:
            return super()._enqueue_job(job, *args, **kwargs)
        return self._claim_and(
            job, spec, 0.0, lambda: super(UniqueQueue, self)._enqueue_job(job, *args, **kwargs)
        )

    def schedule_job(self, job: Job, datetime: dt.datetime, *args: Any, **kwargs: Any) -> Job:
        spec = spec_of(job.func) if job.func_name else None
        if spec is None or spec.unique is None or not spec.unique.queued:
            return super().schedule_job(job, datetime, *args, **kwargs)
        # A naive time is local time to RQ's scheduled registry, and to astimezone().
        delay = max(0.0, (datetime.astimezone() - dt.datetime.now(dt.UTC)).total_seconds())
        return self._claim_and(
            job,
            spec,
            delay,
            lambda: super(UniqueQueue, self).schedule_job(job, datetime, *args, **kwargs),
        )

    def _claim_and(self, job: Job, spec: JobSpec, delay: float, enqueue: Any) -> Job:
        unique = spec.unique
        assert unique is not None
        settings = spec.settings
        if settings.disabled:
            return enqueue()  # type: ignore[no-any-return]
        client = client_for(settings, self.connection)
        name = spec.unique_name(job.args or (), job.kwargs or {})
        action = unique.on_duplicate or settings.on_duplicate
        kind = (
            ClaimKind.REPUBLISH
            if republished(job)
            else ClaimKind.REPLACE
            if action == "replace"
            else ClaimKind.NEW
        )
        life = min(delay + (unique.allowance or settings.queue_allowance), _MAX_CLAIM_S)
        if job.ttl is not None and job.ttl > 0:
            life = min(life, delay + float(job.ttl))  # RQ drops a job not started within its ttl
        what = f"job {spec.name}[{job.id}]"
        try:
            found, result = publish_claimed(
                client,
                settings.namespace,
                name,
                task_id=job.id,
                lifetime=life,
                kind=kind,
                running_counts=unique.running_counts,
                window=settings.unique_publish_window,
                publish=enqueue,
                what=what,
            )
        except LockBackendError as exc:
            if settings.on_backend_error != "run":
                raise
            log.error("%s enqueued WITHOUT unique key %r: %s", what, name, exc)
            return enqueue()  # type: ignore[no-any-return]
        if found.duplicate:
            _signal(spec, job.id, name, "raise" if action == "raise" else "existing", found)
            return self._duplicate(spec, name, job, found, action)
        if found.replaced and found.holder:
            log.info("%s replaces %s under unique key %r", what, found.holder, name)
            _signal(spec, job.id, name, "replace", found)
            self._cancel(found.holder)
        assert result is not None
        return result  # type: ignore[no-any-return]

    def _existing(self, job_id: str) -> Job:
        """The copy that holds the key. It may not be saved yet (queued in the same
        ``enqueue_many`` pipeline): then a job of that id, to be read later."""
        try:
            return self.job_class.fetch(
                job_id, connection=self.connection, serializer=self.serializer
            )
        except NoSuchJobError:
            return self.job_class(job_id, connection=self.connection, serializer=self.serializer)

    def _duplicate(self, spec: JobSpec, name: str, job: Job, found: Claim, action: str) -> Job:
        state = "running" if found.running else "queued"
        log.info(
            "job %s[%s] not enqueued: %s is %s under unique key %r",
            spec.name,
            job.id,
            found.holder,
            state,
            name,
        )
        if action == "raise":
            raise DuplicateTask(
                f"job {spec.name}: a copy ({found.holder}) is already {state} under unique "
                f"key {name!r}",
                name=name,
                task_id=found.holder,
                expires_in=found.ms_left / 1000,
                state=state,
            )
        return self._existing(found.holder)

    def _cancel(self, job_id: str) -> None:
        """Takes the replaced copy off the queue; if it starts anyway, it finds itself
        superseded and does not run."""
        try:
            old = self.job_class.fetch(
                job_id, connection=self.connection, serializer=self.serializer
            )
            self.remove(old)
            old.cancel()
        except Exception as exc:  # the superseded check at its start is the guarantee
            log.info(
                "replaced job %s: could not cancel it (%s); it skips itself if it starts",
                job_id,
                exc,
            )


def _signal(spec: JobSpec, job_id: str, name: str, action: str, found: Claim) -> None:
    if lock_conflict.receivers:
        lock_conflict.send(
            sender=spec.name,
            task_id=job_id,
            lock=name,
            action=action,
            holders=[found.holder],
            stage="enqueue",
        )
