"""The RQ integration: the same ``lock=`` and ``unique=`` options as on Celery tasks, for RQ
jobs, on the same lock core.

>>> from celery_redislock.integrations.rq import locked, UniqueQueue
>>> @locked(lock="sync:{customer_id}", unique="until_finished")
... def sync_customer(customer_id: int) -> None: ...

Enqueue through :class:`UniqueQueue` for enqueue-time uniqueness; run workers with
``-w celery_redislock.integrations.rq.LockWorker`` to free a killed horse's leases at once and
to sweep the task lines of ``on_conflict="queue"``.

Its ``__all__`` is the public RQ API. The signals here are RQ's (a small signal class of this
package), with the names and arguments of Celery's in
:mod:`celery_redislock.integrations.celery`.
"""

from .job import JobSpec, lock_for, locked, spec_of
from .queue import UniqueQueue
from .running import SKIPPED, outcome_of
from .settings import Settings
from .signals import lock_acquired, lock_backend_error, lock_conflict, lock_lost, lock_released
from .worker import LockSpawnWorker, LockWorker

__all__ = [
    "SKIPPED",
    "JobSpec",
    "LockSpawnWorker",
    "LockWorker",
    "Settings",
    "UniqueQueue",
    "lock_acquired",
    "lock_backend_error",
    "lock_conflict",
    "lock_for",
    "lock_lost",
    "lock_released",
    "locked",
    "outcome_of",
    "spec_of",
]
