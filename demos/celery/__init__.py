"""The main demo: real Celery, then RQ, workers run locked and unique tasks under bursts of calls.

``python -m demos.celery`` (``make demo``; about a minute, ``--quick``: about half) runs on
``REDIS_URL``, else on a redis-server it starts and stops. Use cases, one after another:

1. singleton     ``nightly_report(day)``, ``unique="until_finished"``, enqueued many times:
                 queued once, run once.
2. per-customer  ``sync_customer(id)`` over a handful of customers: never two at once for one
                 customer, customers side by side.
3. cap           ``call_api(n)`` with ``limit=3``: at most three at once across both workers;
                 the rest park in the lock's task line.
4. read-write    cache readers share, a rebuild runs alone.
5. line          ``post_ledger('acme', n)``: a burst on one key drains through the lock's task
                 line, one at a time, in order.
6. recovery      the pool process running a long import is SIGKILLed; a copy waiting for the
                 lock takes over as soon as the worker's parent releases the dead one's lease.

Then the same singleton, cap and recovery (a work horse SIGKILLed) on four RQ workers
(:mod:`demos.rq`). Every run notes where and when it ran and its fence; the demo judges each
use case on those notes, prints a summary, draws ``demo-timeline.png`` (with matplotlib: the
runs, and what the locks kept from running) and exits 1 if a use case failed; ``--write-docs``
(``make demo-docs``) writes the summary and the picture into ``docs/``. Ctrl-C stops every
worker process, then the Redis server if the demo started it.

Modules: ``app`` (the Celery app and its tasks; ``celery -A demos.celery.app worker``),
``workers`` (the worker processes, as :class:`demos._common.processes.Children`), ``cases`` (the
use cases and their judging), ``runs`` (what the tasks noted, as spans), ``timeline`` (the
picture) and ``cli``.
"""

from .cli import main

__all__ = ["main"]
