"""What workers log, a lease as an interval, and the maths the judges do on intervals (how many
held at once: :mod:`demos._common.spans`)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass
from itertools import pairwise

from .._common.spans import Span

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Interval:
    """One lease as its holder saw it. Times are ``time.monotonic_ns()``, one clock per host."""

    mode: str
    pid: int
    fence: int
    t_requested: int
    t_acquired: int
    t_released: int

    @property
    def held_ms(self) -> float:
        return (self.t_released - self.t_acquired) / NS_PER_MS

    @property
    def waited_ms(self) -> float:
        return (self.t_acquired - self.t_requested) / NS_PER_MS

    @property
    def span(self) -> Span:
        """While the lease was held."""
        return (self.t_acquired, self.t_released)


def dump(intervals: Iterable[Interval]) -> str:
    return json.dumps([astuple(i) for i in intervals])


def load(blob: bytes | str) -> list[Interval]:
    return [Interval(*row) for row in json.loads(blob)]


def spans(intervals: Iterable[Interval]) -> list[Span]:
    return [i.span for i in intervals]


def handoffs_ms(intervals: Iterable[Interval]) -> list[float]:
    """Release of one holder to the acquisition by the next, for an exclusive lock."""
    ordered = sorted(intervals, key=lambda i: i.t_acquired)
    return [(b.t_acquired - a.t_released) / NS_PER_MS for a, b in pairwise(ordered)]


def fence_regressions(intervals: Iterable[Interval]) -> int:
    """Acquisitions (of an exclusive lock, in time order) whose fence is not above the last."""
    ordered = sorted(intervals, key=lambda i: i.t_acquired)
    return sum(1 for a, b in pairwise(ordered) if b.fence <= a.fence)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summary_ms(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"count": 0, "mean": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "count": len(values),
        "mean": round(statistics.fmean(values), 3),
        "p99": round(percentile(values, 99), 3),
        "max": round(max(values), 3),
    }
