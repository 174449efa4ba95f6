"""Verdicts (a check per invariant, an outcome per scenario) and how the demo prints them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .intervals import Interval, summary_ms

Relation = Literal["==", "<=", ">="]


@dataclass(frozen=True, slots=True)
class Check:
    """One invariant: ``observed relation allowed`` must hold."""

    key: str
    invariant: str
    observed: float
    allowed: float
    relation: Relation
    unit: str = ""

    @property
    def passed(self) -> bool:
        if self.relation == "==":
            return self.observed == self.allowed
        if self.relation == "<=":
            return self.observed <= self.allowed
        return self.observed >= self.allowed

    def text(self) -> str:
        observed, allowed = num(self.observed, self.unit), num(self.allowed, self.unit)
        return f"{self.invariant}: {observed} {self.relation} {allowed}"

    def as_json(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "observed": finite(self.observed),
            "allowed": finite(self.allowed),
            "relation": self.relation,
            "unit": self.unit,
            "passed": self.passed,
        }


def finite(value: float) -> float | None:
    """JSON has no infinity: an unmeasured value (no lease was ever taken) is null."""
    return value if math.isfinite(value) else None


def num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "none"
    text = str(value) if isinstance(value, int) else f"{value:.1f}"
    return f"{text} {unit}" if unit else text


@dataclass
class Outcome:
    """A scenario's verdicts and the numbers behind them."""

    name: str
    title: str
    checks: list[Check]
    stats: dict[str, Any]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "passed": self.passed,
            "checks": {c.key: c.as_json() for c in self.checks},
            "stats": self.stats,
        }


# -- printing -----------------------------------------------------------------------------------


def say(text: str = "") -> None:
    print(text, flush=True)


def holder_table(intervals: Sequence[Interval]) -> None:
    """One line per holder process: leases taken, fences, time held."""
    say(
        f"  {'pid':>7}  {'mode':<5}  {'leases':>6}  {'first fence':>16}  {'last fence':>16}"
        f"  {'held ms mean/max':>16}"
    )
    for pid in sorted({i.pid for i in intervals}):
        for mode in ("read", "write"):
            mine = sorted(
                (i for i in intervals if i.pid == pid and i.mode == mode),
                key=lambda i: i.t_acquired,
            )
            if mine:
                held = [i.held_ms for i in mine]
                say(
                    f"  {pid:>7}  {mode:<5}  {len(mine):>6}  {mine[0].fence:>16}"
                    f"  {mine[-1].fence:>16}  {statistics.fmean(held):>7.1f} /{max(held):>7.1f}"
                )


def print_checks(outcome: Outcome) -> None:
    for check in outcome.checks:
        say(f"  {'PASS' if check.passed else 'FAIL'}  {check.text()}")


def handoff_line(handoffs: Sequence[float]) -> str:
    s = summary_ms(handoffs)
    return (
        f"handoff (release -> next holder acquires): mean {s['mean']:.2f} ms, "
        f"p99 {s['p99']:.2f} ms, max {s['max']:.2f} ms over {s['count']} handoffs"
    )


def print_summary(summary: dict[str, Any]) -> None:
    say()
    say("Summary")
    for name, scenario in summary["scenarios"].items():
        verdict = "PASS" if scenario["passed"] else "FAIL"
        details = ", ".join(
            f"{key} {num(c['observed'], c['unit'])} {c['relation']} {num(c['allowed'], c['unit'])}"
            for key, c in scenario["checks"].items()
            if key != "workers" or not c["passed"]
        )
        say(f"  {verdict}  {name:<10}  {details}")
    failed = [n for n, s in summary["scenarios"].items() if not s["passed"]]
    total = len(summary["scenarios"])
    result = f"all {total} scenarios passed"
    if failed:
        result = f"{len(failed)} of {total} scenarios FAILED: {', '.join(failed)}"
    say(f"{result} in {summary['seconds']:.1f} s")
