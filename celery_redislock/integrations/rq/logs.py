"""This package's log lines in an RQ worker's log: ``rq worker`` gives handlers to its own loggers
only, so another library's INFO line goes nowhere (a job skipped on its lock showed only RQ's
``Job OK``). In a process whose logging nobody configured, ours go to RQ's worker log handlers."""

from __future__ import annotations

import logging
import threading

__all__ = ["to_worker_log"]

_OURS = logging.getLogger("celery_redislock")
_routed = threading.Event()


def to_worker_log() -> None:
    """Routes this package's lines to RQ's worker log handlers, unless logging was configured
    (a root handler: the application's own) or RQ's was not set up (not in a worker). Cheap
    once done; a forked horse inherits it."""
    if _routed.is_set() or _OURS.hasHandlers():
        return
    worker_log = logging.getLogger("rq.worker")
    if not worker_log.handlers:
        return
    for handler in worker_log.handlers:
        _OURS.addHandler(handler)
    if _OURS.level == logging.NOTSET:
        _OURS.setLevel(worker_log.getEffectiveLevel())
    # As RQ does for its own: a root handler added later would print each line twice.
    _OURS.propagate = False
    _routed.set()
