"""Time spans ``(start, end)`` and the one sweep over them: how many were in progress at once.

Both demos and the examples judge exclusion by it. Any unit works (nanoseconds of
``time.monotonic_ns()`` or seconds of ``time.time()``) as long as one list uses one clock. A
span ending at the instant another starts does not overlap it: a lock handed over is not held
twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

Span = tuple[float, float]

__all__ = ["Span", "most_at_once", "overlapping_pairs", "time_at_level"]


def _edges(spans: Iterable[Span]) -> list[tuple[float, int]]:
    # At one instant an end (-1) sorts before a start (+1).
    return sorted(edge for start, end in spans for edge in ((start, 1), (end, -1)))


def most_at_once(spans: Iterable[Span]) -> int:
    """The most spans in progress at one instant."""
    level = most = 0
    for _, step in _edges(spans):
        level += step
        most = max(most, level)
    return most


def time_at_level(spans: Iterable[Span]) -> dict[int, float]:
    """Share of the time from the first start to the last end spent with k spans in progress,
    for each k."""
    spent: dict[int, float] = {}
    level = 0
    for (t0, step), (t1, _) in pairwise(_edges(spans)):
        level += step
        spent[level] = spent.get(level, 0) + t1 - t0
    total = sum(spent.values()) or 1
    return {k: spent[k] / total for k in sorted(spent)}


def overlapping_pairs(a: Iterable[Span], b: Iterable[Span]) -> int:
    """How many pairs, one span from each group, were in progress at the same time."""
    others = list(b)
    return sum(1 for x0, x1 in a for y0, y1 in others if x0 < y1 and y0 < x1)
