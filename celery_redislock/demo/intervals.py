"""What workers log, a lease as an interval, and the maths the judges do on intervals."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass
from itertools import pairwise

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


def dump(intervals: Iterable[Interval]) -> str:
    return json.dumps([astuple(i) for i in intervals])


def load(blob: bytes | str) -> list[Interval]:
    return [Interval(*row) for row in json.loads(blob)]


def max_concurrency(intervals: Iterable[Interval]) -> int:
    """The most intervals open at one instant (one that ends as another starts: no overlap)."""
    edges = sorted(e for i in intervals for e in ((i.t_acquired, 1), (i.t_released, -1)))
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def overlapping_pairs(a: Sequence[Interval], b: Sequence[Interval]) -> int:
    return sum(
        1 for x in a for y in b if x.t_acquired < y.t_released and y.t_acquired < x.t_released
    )


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


def time_at_level(intervals: Sequence[Interval]) -> dict[int, float]:
    """Share of the scenario's time spent with k holders, for each k."""
    edges = sorted(e for i in intervals for e in ((i.t_acquired, 1), (i.t_released, -1)))
    spent: Counter[int] = Counter()
    level = 0
    for (t0, step), (t1, _) in pairwise(edges):
        level += step
        spent[level] += t1 - t0
    total = sum(spent.values()) or 1
    return {k: spent[k] / total for k in sorted(spent)}


def summary_ms(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"count": 0, "mean": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "count": len(values),
        "mean": round(statistics.fmean(values), 3),
        "p99": round(percentile(values, 99), 3),
        "max": round(max(values), 3),
    }
