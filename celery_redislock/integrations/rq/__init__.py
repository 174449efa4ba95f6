"""The RQ integration: the ``lock=``, ``unique=`` and ``rate=`` options of Celery tasks, for RQ
jobs. Enqueue through :class:`UniqueQueue`; run ``-w celery_redislock.integrations.rq.LockWorker``
to free a killed horse's leases at once and sweep the task lines. The signals have Celery's names.

>>> from celery_redislock.integrations.rq import locked, UniqueQueue
>>> @locked(lock="sync:{customer_id}", unique="until_finished")
... def sync_customer(customer_id: int) -> None: ...
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
