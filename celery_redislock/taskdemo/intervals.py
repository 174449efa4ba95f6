"""What the tasks noted, as intervals, and the numbers the summary judges."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import redis

from .app import ACTIONS, INTERVALS


@dataclass(frozen=True, slots=True)
class Run:
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


def load(client: redis.Redis) -> list[Run]:
    return [Run(**json.loads(raw)) for raw in client.lrange(INTERVALS, 0, -1)]


def actions(client: redis.Redis) -> dict[str, int]:
    """``"<case>:<action>"`` -> how many times a conflict ended so."""
    raw = client.hgetall(ACTIONS)
    return {(k.decode() if isinstance(k, bytes) else str(k)): int(v) for k, v in raw.items()}


def most_at_once(spans: Iterable[tuple[float, float]]) -> int:
    """The most intervals in progress at one instant (one ending as another starts: not both)."""
    # At one instant an end (-1) sorts before a start (+1).
    events = sorted(event for start, end in spans for event in ((start, 1), (end, -1)))
    most = current = 0
    for _, step in events:
        current += step
        most = max(most, current)
    return most


def max_together(runs: Iterable[Run], now: float) -> int:
    """The most runs in progress at one instant (a killed run lasts until ``now``)."""
    return most_at_once((r.start, r.until(now)) for r in runs)


def overlaps(a: Iterable[Run], b: Iterable[Run], now: float) -> int:
    """How many pairs of runs, one from each group, were in progress at the same time."""
    others = list(b)
    return sum(1 for x in a for y in others if x.start < y.until(now) and y.start < x.until(now))


def by_key(runs: Iterable[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        out[run.key].append(run)
    return dict(out)
