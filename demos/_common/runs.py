"""What the task demo's jobs note and how a use case is summed up, for Celery and RQ alike:
:class:`TaskRun` (one run, as a span in time), :class:`Event` (a call kept from running, or
a lease taken after a wait), :class:`Outcome` (a use case's figures and checks) and
:func:`judge_runs` (the checks every use case makes on its runs)."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from .spans import Span, most_at_once

__all__ = [
    "Event",
    "Outcome",
    "TaskRun",
    "by_key",
    "judge_runs",
    "load_events",
    "load_runs",
    "note_event",
    "spans",
]


@dataclass(frozen=True, slots=True)
class TaskRun:
    """One run of a task: where, with which fence, from when to when (``end`` None: killed)."""

    case: str
    key: str
    worker: str
    pid: int
    fence: int | None
    task_id: str
    start: float
    end: float | None
    horse: bool = False
    """Ran in a process forked for this one job (an RQ work horse): a new pid every run."""

    def until(self, default: float) -> float:
        return self.end if self.end is not None else default

    def span(self, now: float) -> Span:
        """From start to end; a run killed midway lasts until ``now``."""
        return (self.start, self.until(now))

    @property
    def process(self) -> str:
        """Who ran it, as the timeline colours it: a pool process, or an RQ worker's horses."""
        return f"{self.worker} (a horse per job)" if self.horse else f"{self.worker} pid {self.pid}"


@dataclass(frozen=True, slots=True)
class Event:
    """What the lock did to a call, from the ``lock_conflict`` and ``lock_acquired`` signals.

    ``action`` is the conflict's (``existing``: a unique call refused as it was published;
    ``queue``: parked in the lock's task line; ``retry``, ``skip``...), or ``acquired``: the
    lease was taken at ``at`` after ``waited`` seconds (in the lock's line, or parked in its
    task line since the task first parked)."""

    case: str
    action: str
    task_id: str
    at: float
    waited: float = 0.0


def note_event(client: redis.Redis, key: str, case: str, action: str, task_id: str,
               waited: float = 0.0) -> None:  # fmt: skip
    """Appends an :class:`Event` happening now to the list ``key``."""
    event = Event(case, action, task_id, time.time(), waited)
    client.rpush(key, json.dumps(asdict(event)))


def load_events(client: redis.Redis, key: str) -> list[Event]:
    """The events noted on the list ``key``."""
    return [Event(**json.loads(raw)) for raw in client.lrange(key, 0, -1)]


@dataclass
class Outcome:
    """A use case's figures, as the summary prints them."""

    case: str
    title: str
    sent: int
    queued: int
    ran: int = 0
    skipped: int = 0
    retried: int = 0
    max_together: int = 0
    allowed: int = 1
    fences: int = 0
    checks: dict[str, bool] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(self.checks.values())


def load_runs(client: redis.Redis, key: str) -> list[TaskRun]:
    """The runs noted (as JSON) on the list ``key``."""
    return [TaskRun(**json.loads(raw)) for raw in client.lrange(key, 0, -1)]


def spans(runs: Iterable[TaskRun], now: float) -> list[Span]:
    return [r.span(now) for r in runs]


def by_key(runs: Iterable[TaskRun]) -> dict[str, list[TaskRun]]:
    out: dict[str, list[TaskRun]] = defaultdict(list)
    for run in runs:
        out[run.key].append(run)
    return dict(out)


def judge_runs(outcome: Outcome, runs: list[TaskRun], now: float, allowed: int) -> Outcome:
    """Counts the use case's runs, the most that ran at once per key (against ``allowed``) and
    their distinct fences."""
    mine = [r for r in runs if r.case == outcome.case]
    outcome.ran = len(mine)
    outcome.allowed = allowed
    outcome.max_together = max(
        (most_at_once(spans(rs, now)) for rs in by_key(mine).values()), default=0
    )
    fences = [r.fence for r in mine if r.fence is not None]
    outcome.fences = len(set(fences))
    outcome.checks["never more than allowed at once"] = outcome.max_together <= allowed
    outcome.checks["every run got a fence of its own"] = len(set(fences)) == len(mine)
    return outcome
