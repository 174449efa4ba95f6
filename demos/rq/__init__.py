"""The RQ part of the main demo: the same use cases on real RQ workers, judged and drawn beside
the Celery ones (``python -m demos.celery`` runs it after the Celery cases).

Four ``rq worker -w celery_redislock.integrations.rq.LockWorker`` processes (one job at a time
each) on the demo's Redis; jobs enqueued through ``UniqueQueue``:

1. rq-singleton  ``nightly_report(day)``, ``unique="until_finished"``, enqueued many times:
                 queued once, run once.
2. rq-cap        ``call_api(n)`` with ``limit=3`` and ``on_conflict="wait"``: three at once,
                 the fourth worker's job waits in the lock's line.
3. rq-recovery   the work horse running a long import is SIGKILLed; a copy waiting on another
                 worker takes over as soon as the dead horse's worker releases its lease.

Modules: ``jobs`` (the job functions), ``workers`` (the worker processes), ``cases`` (the use
cases and their judging).
"""

from .cases import run_cases

__all__ = ["run_cases"]
