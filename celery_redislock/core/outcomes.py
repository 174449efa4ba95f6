"""The log line of each way a locked run can end other than by running, worded once for every
framework: a Celery task and an RQ job that end the same way log the same line (this module's
logger, the same level, the same words; only the names and ids differ). An outcome logged in
one framework and not the other, or in other words, is what this module prevents.

Each function logs one line for the run ``name[run_id]`` (a Celery task's name and id, an RQ
job's function path and id); "task" is the word for both.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

__all__ = [
    "awaits_first",
    "dropped",
    "held_by",
    "lease_lost",
    "line_expired",
    "line_full",
    "parked",
    "rate_full",
    "retries",
    "runs_unlocked",
    "skipped",
    "superseded",
]

log = logging.getLogger(__name__)


def held_by(holders: Sequence[str]) -> str:
    """Who holds a lock, as the lines say it (no holder left: it was just released)."""
    return ", ".join(holders) or "a task that just finished"


def skipped(name: str, run_id: str, lock: str, holders: Sequence[str]) -> None:
    """``on_conflict="skip"``: the run ends ``SKIPPED`` without running (INFO)."""
    log.info("task %s[%s] skipped: lock %r is held by %s", name, run_id, lock, held_by(holders))


def superseded(name: str, run_id: str, holder: str, key: str) -> None:
    """A unique copy replaced (or outlived) under its key ends ``SKIPPED`` (INFO)."""
    log.info("task %s[%s] skipped: superseded by %s under unique key %r", name, run_id, holder, key)


def retries(name: str, run_id: str, delay: float, why: str) -> None:
    """The run comes back in ``delay`` seconds: ``on_conflict="retry"``, or the lock Redis
    failing under ``on_backend_error="retry"`` (INFO)."""
    log.info("task %s[%s] retries in %.1fs: %s", name, run_id, delay, why)


def dropped(name: str, run_id: str, lock: str) -> None:
    """A copy of a run that already finished (a redelivery after a lost ack) is not run (INFO)."""
    log.info(
        "task %s[%s] dropped: a copy of it already ran to its end under lock %r",
        name,
        run_id,
        lock,
    )


def awaits_first(name: str, run_id: str, lock: str, delay: float) -> None:
    """Another copy of this very run holds the lease: this one looks again later (INFO)."""
    log.info(
        "task %s[%s]: another copy of it holds lock %r (running, or its worker died); this one "
        "looks again in %.1fs",
        name,
        run_id,
        lock,
        delay,
    )


def parked(name: str, run_id: str, lock: str, waiting: int, holders: Sequence[str]) -> None:
    """``on_conflict="queue"``: the run waits in the lock's task line (INFO)."""
    log.info(
        "task %s[%s] parked in the task line of lock %r (%d waiting): held by %s",
        name,
        run_id,
        lock,
        waiting,
        held_by(holders),
    )


def line_expired(name: str, run_id: str, lock: str, max_wait: float) -> None:
    """It waited in the task line past ``max_wait``: it fails without running (WARNING)."""
    log.warning(
        "task %s[%s] not run: it waited in the task line of lock %r longer than max_wait (%gs)",
        name,
        run_id,
        lock,
        max_wait,
    )


def line_full(name: str, run_id: str, lock: str, waiting: int) -> None:
    """The task line holds ``max_waiting``: it fails without running (WARNING)."""
    log.warning(
        "task %s[%s] not run: the task line of lock %r is full (%d parked)",
        name,
        run_id,
        lock,
        waiting,
    )


def rate_full(name: str, run_id: str, limit: str, rate: object, delay: float) -> None:
    """The rate limit has no start free now: the run comes back for its slot (INFO)."""
    log.info(
        "task %s[%s]: rate limit %r (%s) is full; it comes back for its slot in %.2fs",
        name,
        run_id,
        limit,
        rate,
        delay,
    )


def runs_unlocked(name: str, run_id: str, lock: str, error: BaseException) -> None:
    """``on_backend_error="run"``: the lock Redis failed and the run goes on without its lock
    (ERROR: duplicates may run)."""
    log.error("task %s[%s] runs WITHOUT lock %r: Redis failed: %s", name, run_id, lock, error)


def lease_lost(name: str, run_id: str, lock: str, error: BaseException | None) -> None:
    """The heartbeat found the run's lease lost; the run goes on (ERROR)."""
    log.error(
        "task %s[%s]: lease on lock %r lost%s; the task goes on without it",
        name,
        run_id,
        lock,
        f" ({error})" if error else "",
    )
