"""Enqueue-time uniqueness for RQ: a ``Queue`` whose every way in (``enqueue``,
``enqueue_call``, ``enqueue_job``, ``enqueue_many``, ``enqueue_at``/``enqueue_in``, dependents
released later) claims a unique job's key before the job is queued."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from rq import Queue, get_current_job
from rq.command import send_stop_job_command
from rq.exceptions import NoSuchJobError

from ...core.confirmations import confirmations
from ...core.run.send import Duplicate, Sender, send_unique
from ._compat import Job
from .debounce import keep_deferred, payload
from .job import spec_of
from .running import republished
from .settings import client_for
from .signals import lock_conflict

__all__ = ["UniqueQueue"]

log = logging.getLogger(__name__)


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
        return self._claim_and(
            job, 0.0, lambda: super(UniqueQueue, self)._enqueue_job(job, *args, **kwargs)
        )

    def schedule_job(self, job: Job, datetime: dt.datetime, *args: Any, **kwargs: Any) -> Job:
        # A naive time is local time to RQ's scheduled registry, and to astimezone().
        delay = max(0.0, (datetime.astimezone() - dt.datetime.now(dt.UTC)).total_seconds())
        return self._claim_and(
            job,
            delay,
            lambda: super(UniqueQueue, self).schedule_job(job, datetime, *args, **kwargs),
        )

    def _claim_and(self, job: Job, delay: float, enqueue: Any) -> Job:
        spec = spec_of(job.func) if job.func_name else None
        unique = spec.unique if spec is not None else None
        if spec is None or unique is None or not unique.at_send or spec.settings.disabled:
            return enqueue()  # type: ignore[no-any-return]
        settings = spec.settings
        debounced = unique.debounced and not republished(job)
        if debounced:
            keep_deferred(job)  # saved first: a pending call must never name a missing job
        sent = send_unique(
            spec,
            unique,
            job.id,
            (job.args or (), job.kwargs or {}),
            delay=delay,
            # RQ drops a job not started within its ttl.
            expires_in=delay + float(job.ttl) if job.ttl is not None and job.ttl > 0 else None,
            republish=republished(job),
            in_canvas=False,
            settings=settings,
            client=client_for(settings, self.connection),
            by=Sender("job", "enqueued", "enqueue", lock_conflict, spec.name),
            publish=enqueue,
            cancel=self._cancel,
            stop=self._stop,
            encode=lambda: payload(job, self.serializer),
        )
        if get_current_job() is not None:
            # In a work horse, which ends with os._exit (no exit handler runs): confirmed now.
            confirmations.flush()
        if isinstance(sent, Duplicate):
            if debounced and sent.holder != job.id:
                job.delete()  # folded into the pending job: this one is never enqueued
            return self._existing(sent.holder)
        return sent.result  # type: ignore[no-any-return]

    def _existing(self, job_id: str) -> Job:
        """The copy that holds the key. It may not be saved yet (queued in the same
        ``enqueue_many`` pipeline): then a job of that id, to be read later."""
        try:
            return self.job_class.fetch(
                job_id, connection=self.connection, serializer=self.serializer
            )
        except NoSuchJobError:
            return self.job_class(job_id, connection=self.connection, serializer=self.serializer)

    def _stop(self, job_id: str) -> None:
        """Stops the running copy (``on_duplicate="cancel"``): its worker kills the horse,
        which releases its lease as any dead horse's; the job ends ``stopped``."""
        try:
            send_stop_job_command(self.connection, job_id, serializer=self.serializer)
        except Exception as exc:  # it ended meanwhile: nothing to stop
            log.info("cancelled job %s: could not stop it (%s); it may have ended", job_id, exc)

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
