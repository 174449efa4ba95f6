"""A run whose process died (a Celery pool child, an RQ work horse): the worker's parent
releases the lease it held at once, matched by task id, host and the dead process's pid (never a
lease of another delivery or another process)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence

from ..lock import Lock

__all__ = ["release_dead"]

log = logging.getLogger(__name__)

_HOST = socket.gethostname()


def release_dead(
    locks_of: Callable[[], Sequence[Lock]], what: str, task_id: str, pid: int, process: str
) -> list[str]:
    """Releases what the dead ``process`` (``"child"``, ``"horse"``) ``pid`` held for the run
    ``task_id`` in each of the run's locks (``what``: ``"task name[id]"``, for the log);
    returns the released tokens. Never raises: what it cannot release lapses within its ttl.

    >>> release_dead(lambda: [lock], "task sync[9b1c]", "9b1c", 4242, "child")   # doctest: +SKIP
    ['t-1']
    """
    released: list[str] = []
    try:
        locks = locks_of()
    except Exception as exc:  # the task's code could not be imported here, or its arguments
        _cannot(what, process, pid, exc)
        return []
    for lock in locks:
        try:
            freed = lock.release_where(task_id=task_id, host=_HOST, pid=str(pid))
        except Exception as exc:  # Redis
            _cannot(what, process, pid, exc)
            continue
        if freed:
            log.info("lock %r released: %s %d running %s died", lock.name, process, pid, what)
        released += freed
    return released


def _cannot(what: str, process: str, pid: int, exc: BaseException) -> None:
    log.warning(
        "%s: could not release the lease of dead %s %d (it lapses within its ttl): %s",
        what,
        process,
        pid,
        exc,
    )
