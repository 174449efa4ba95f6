"""Debounced RQ jobs (``unique={"lifecycle": "debounce", ...}``, core/debounce.py): the first
call's job is saved, not enqueued, with status ``deferred``; every call's arguments are kept in
Redis (the latest win), and a worker's sweeper enqueues the job with them once it is due. A job
whose status is no longer ``deferred`` was enqueued already: it is not enqueued twice."""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from typing import Any

import redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import JobStatus
from rq.serializers import resolve_serializer

from ._compat import Job

__all__ = ["debounce_publisher", "keep_deferred", "payload"]

log = logging.getLogger(__name__)


def keep_deferred(job: Job) -> None:
    """Saves a debounced call's job without enqueuing it (a sweeper enqueues it when due)."""
    job.set_status(JobStatus.DEFERRED, pipeline=None)
    job.save()


def payload(job: Job, serializer: Any) -> str:
    """The job's arguments, as kept until the job is enqueued (the latest call's win)."""
    raw = resolve_serializer(serializer).dumps((job.args, job.kwargs))
    return base64.b64encode(raw).decode()


def debounce_publisher(connection: redis.Redis, serializer: Any) -> Callable[[str, str], None]:
    """Enqueues a debounced job that is due (a sweeper's), with the arguments kept for it."""
    loads = resolve_serializer(serializer).loads

    def enqueue_pending(job_id: str, kept: str) -> None:
        try:
            job = Job.fetch(job_id, connection=connection, serializer=serializer)
        except NoSuchJobError:
            log.warning("debounced job %s was deleted before it was due: not enqueued", job_id)
            return
        if job.get_status() != JobStatus.DEFERRED:
            return  # enqueued already (this publish's confirmation was lost)
        name = job.func_name  # (read first: RQ rebuilds the job's data from all four parts)
        job.args, job.kwargs = loads(base64.b64decode(kept))
        with connection.pipeline() as unsent:
            # In memory only (RQ would not enqueue a deferred job); the enqueue below writes
            # the job and its new status at once, so a crash before it leaves it deferred.
            job.set_status(JobStatus.QUEUED, pipeline=unsent)
        Queue(job.origin, connection=connection, serializer=serializer).enqueue_job(job)
        log.info("job %s[%s]: debounced call enqueued", name, job_id)

    return enqueue_pending
