"""Every use of RQ's API that differs between the RQ versions we support (2.1 and 3.0 checked):
keep them here, each with what it relies on."""

from __future__ import annotations

from typing import Any

from rq.job import Job, Retry
from rq.worker import Worker

from ...errors import LockConfigError

try:
    from rq.worker import SpawnWorker
except ImportError:  # RQ 2.1: SpawnWorker came in 2.2

    class SpawnWorker(Worker):  # type: ignore[no-redef]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise LockConfigError("SpawnWorker needs RQ 2.2 or newer")


__all__ = [
    "Job",
    "Retry",
    "SpawnWorker",
    "Worker",
    "enqueue_again",
    "retry_after",
    "save_meta",
]


def retry_after(job: Job, seconds: float) -> Retry:
    """A ``Retry`` the worker honours once more, ``seconds`` from now (whole seconds, at least
    one: RQ 2.x refuses a float interval). The worker fails a job whose ``number_of_retries``
    reached ``max``, so ``max`` is one past the retries it has had (which count RQ's own
    retries after failures too). A delayed retry needs the RQ scheduler (``--with-scheduler``)."""
    done = int(job.number_of_retries or 0)
    return Retry(max=done + 1, interval=max(1, round(seconds)))


def save_meta(job: Job) -> None:
    """Writes ``job.meta`` to its job hash (RQ's ``save_meta`` is untyped)."""
    job.save_meta()  # type: ignore[no-untyped-call]


def enqueue_again(queue: Any, job: Job, pipeline: Any) -> None:
    """Queues ``job`` (taken out of the scheduled registry) at the front of ``queue``, on
    ``pipeline``, as RQ's scheduler queues a due job. A job under RQ 3.0's ``rate_limit=`` goes
    through its rate limit registry, as the scheduler sends it."""
    if getattr(job, "has_rate_limit", False):  # RQ >= 3.0
        queue._enqueue_rate_limited_job(job, pipeline=pipeline, at_front=True)
    else:
        queue._enqueue_job(job, pipeline=pipeline, at_front=True)
