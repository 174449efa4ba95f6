"""What the tasks noted: each run of a task, as a span in time, and the conflicts counted."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import redis

from .._common.spans import Span
from .app import ACTIONS, INTERVALS


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

    def until(self, default: float) -> float:
        return self.end if self.end is not None else default

    def span(self, now: float) -> Span:
        """From start to end; a run killed midway lasts until ``now``."""
        return (self.start, self.until(now))


def load(client: redis.Redis) -> list[TaskRun]:
    return [TaskRun(**json.loads(raw)) for raw in client.lrange(INTERVALS, 0, -1)]


def actions(client: redis.Redis) -> dict[str, int]:
    """``"<case>:<action>"`` -> how many times a conflict ended so."""
    raw = client.hgetall(ACTIONS)
    return {(k.decode() if isinstance(k, bytes) else str(k)): int(v) for k, v in raw.items()}


def spans(runs: Iterable[TaskRun], now: float) -> list[Span]:
    return [r.span(now) for r in runs]


def by_key(runs: Iterable[TaskRun]) -> dict[str, list[TaskRun]]:
    out: dict[str, list[TaskRun]] = defaultdict(list)
    for run in runs:
        out[run.key].append(run)
    return dict(out)
