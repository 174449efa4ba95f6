"""A live demonstration of the lock core: four worker processes contend for real Redis locks.

``python -m demos.core`` (``make demo-core``; about half a minute, ``--quick``: under 15 s) runs
five scenarios, one after another, on the Redis of
:func:`celery_redislock.contrib.redis_server.redis_url` (``REDIS_URL``, else a redis-server
started for the run and stopped at its end):

1. mutex       4 processes do a non-atomic GET, sleep, SET of one counter under a mutex: the
               final counter shows no update was lost; fences grow with every acquisition.
2. cap         a write lock with ``limit=3``: never more than 3 holders at once.
3. read/write  3 reader processes share the lock while 1 writer runs alone, and the writer gets
               in although readers keep coming.
4. fair        ``fair=True``: acquisitions are spread evenly over the processes (a run with
               ``fair=False`` is shown beside it for comparison).
5. crash       a holder of a renewed 1 s lease is SIGKILLed; a process blocked on the lock gets
               it about a ttl later, with a larger fence.

Every worker logs its leases as intervals (pid, mode, fence, and ``time.monotonic_ns()`` when
it asked, got and gave back the lease) and pushes them to a Redis list; the parent checks each
scenario's invariants on them, prints a report and exits 1 if one failed. ``--json PATH`` writes
the verdicts. Ctrl-C stops the workers, then the Redis server if the demo started it.

The modules: ``settings`` (how much work, and the limits judged by), ``workers`` (the worker
processes), ``fleet`` (the parent's side of them), ``intervals`` (leases as intervals, and the
maths the judges do on them, over :mod:`demos._common.spans`), ``scenarios`` (the five
scenarios), ``judges`` (their invariants), ``report`` (verdicts and printing) and ``cli`` (the
command line).
"""

from .cli import main
from .settings import FULL, QUICK, Settings

__all__ = ["FULL", "QUICK", "Settings", "main"]
