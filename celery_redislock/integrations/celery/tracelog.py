"""Celery's line for a task that raised ``Ignore`` ("Task NAME[ID] ignored"), left out for the
runs we answered with ``Ignore`` (parked, skipped, sent back for a rate slot, dropped): our own
line has said what happened, and Celery's after it reads as if something else had. A task body
that raises ``Ignore`` itself keeps Celery's line.

Celery writes that line in the thread that raised (its tracer, just after ``before_start``), so
the run's id is kept per thread until then, and a filter on Celery's trace logger drops that one
line.
"""

from __future__ import annotations

import logging
import threading

from ._compat import TRACE_LOGGER, ignored_line_of

__all__ = ["answered_with_ignore"]


class _Answered(threading.local):
    task_id: str | None = None


_answered = _Answered()


def _keep(record: logging.LogRecord) -> bool:
    """False for Celery's "ignored" line of the run this thread just answered."""
    task_id = _answered.task_id
    if task_id is None or ignored_line_of(record) != task_id:
        return True
    _answered.task_id = None
    return False


_filter_added = False
_guard = threading.Lock()


def answered_with_ignore(task_id: str) -> None:
    """The run ``task_id`` is answered with ``Ignore`` in this thread, after its own line:
    Celery's "ignored" line for it is left out."""
    global _filter_added
    if not _filter_added:
        with _guard:
            if not _filter_added:
                # Once per process (a forked pool child inherits it); Celery's log setup
                # replaces handlers, never a logger's filters.
                logging.getLogger(TRACE_LOGGER).addFilter(_keep)
                _filter_added = True
    _answered.task_id = task_id
