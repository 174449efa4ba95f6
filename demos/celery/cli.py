"""The command line: ``python -m demos.celery [--quick] [--json P] [--png P] [--write-docs]``."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis

from celery_redislock.contrib.redis_server import redis_url

from .._common.processes import sigterm_as_interrupt

WORKERS = ("demo1", "demo2")
CONCURRENCY = 2

DOCS = Path(__file__).resolve().parents[2] / "docs"
"""The checkout's docs: ``--write-docs`` writes the sample output into ``examples.md``,
between the two markers, and the picture beside it."""
SAMPLE_PAGE, SAMPLE_PNG = DOCS / "examples.md", DOCS / "demo-timeline.png"
BEGIN = "<!-- demo output: written by python -m demos.celery --write-docs -->"
END = "<!-- end of demo output -->"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m demos.celery",
        description="Two Celery workers run locked and unique tasks under bursts of calls; "
        "what ran, where and beside what is checked, summarised and drawn.",
    )
    parser.add_argument("--quick", action="store_true", help="fewer calls, shorter tasks")
    parser.add_argument("--json", metavar="PATH", type=Path, help="write the summary here")
    parser.add_argument(
        "--png", metavar="PATH", type=Path, default=Path("demo-timeline.png"),
        help="the timeline picture (default: %(default)s; needs matplotlib)",
    )  # fmt: skip
    parser.add_argument(
        "--write-docs", action="store_true",
        help=f"if every use case held, write the summary into {SAMPLE_PAGE.name} (between its "
        f"markers) and the picture to {SAMPLE_PNG.relative_to(DOCS.parent)} (not with --quick)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.write_docs:
        if args.quick:
            parser.error("--write-docs writes what the full demo shows: not with --quick")
        args.png = SAMPLE_PNG
    return args


class _Progress:
    """One line per use case, rewritten in place on a terminal."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last: tuple[str, int, int] | None = None

    def __call__(self, case: str, done: int, total: int) -> None:
        if self.tty and (case, done, total) != self.last:
            print(f"\r  {case:<13} {done:>3}/{total} done", end="", flush=True)
        self.last = (case, done, total)

    def end(self) -> None:
        if self.tty:
            print("\r" + " " * 40 + "\r", end="", flush=True)


# What each column of the summary counts: printed under it, and in docs/examples.md's table.
LEGEND = (
    ("sent", "calls made by the producer (delay(), or enqueue() on RQ)"),
    (
        "queued",
        "messages published to the broker (RQ: jobs put on the queue); "
        "a unique task's duplicate calls are not",
    ),
    ("ran", "runs of the task's body, as each run noted itself"),
    ("skipped", 'runs that found the lock held and did not run (on_conflict="skip")'),
    (
        "retried",
        'runs that found the lock held and were published again for later (on_conflict="retry"); '
        "one call may retry several times",
    ),
    (
        "max at once (allowed)",
        "the most runs holding one lock at the same time (read-write: writers), "
        "and how many the lock allows (1, or its limit)",
    ),
    (
        "fences",
        "distinct fences handed to the runs: as many as ran means each run held a lease of its own",
    ),
    ("verdict", "ok when every check of the use case held, else the checks that failed"),
)


def legend_lines() -> list[str]:
    """The legend as printed: a line per column of the summary."""
    return [f"  {column}: {meaning}" for column, meaning in LEGEND]


def summary_lines(outcomes: Sequence[Any]) -> list[str]:
    """The summary as printed: a line per use case, then its notes."""
    head = f"  {'use case':<13} {'sent':>5} {'queued':>6} {'ran':>5} {'skipped':>7} "
    lines = [head + f"{'retried':>7}  {'max at once (allowed)':>21} {'fences':>6}  verdict"]
    for o in outcomes:
        together = f"{o.max_together} ({o.allowed})"
        verdict = (
            "ok" if o.passed else "FAILED: " + ", ".join(k for k, v in o.checks.items() if not v)
        )
        lines.append(
            f"  {o.case:<13} {o.sent:>5} {o.queued:>6} {o.ran:>5} {o.skipped:>7} {o.retried:>7}  "
            f"{together:>21} {o.fences:>6}  {verdict}"
        )
    for o in outcomes:
        lines += [f"  {o.case}: {name}: {value}" for name, value in o.notes.items()]
    return lines


def write_sample(page: Path, lines: Sequence[str]) -> None:
    """Puts ``lines`` in a ``text`` block between the page's markers, in place of what was
    there."""
    text = page.read_text()
    block = "\n".join([BEGIN, "", "```text", *lines, "```", "", END])
    found = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
    if len(found.findall(text)) != 1:
        raise ValueError(f"{page}: expected the markers {BEGIN!r} ... {END!r} once")
    page.write_text(found.sub(lambda _: block, text))


def run(url: str, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    # The app module reads REDIS_URL as it is imported: import it only now.
    os.environ["REDIS_URL"] = url
    scale = "0.5" if args.quick else "1"
    os.environ["TASKDEMO_SCALE"] = scale
    from .._common.runs import load_events
    from ..rq.cases import load as load_rq
    from ..rq.cases import run_cases as run_rq_cases
    from ..rq.jobs import EVENTS as RQ_EVENTS
    from .app import EVENTS
    from .cases import CASES, FULL, QUICK
    from .runs import load
    from .timeline import draw, panels
    from .workers import start_workers

    client = redis.Redis.from_url(url)
    for key in client.scan_iter(match="taskdemo:*"):
        client.delete(key)
    started = time.monotonic()
    print(f"celery-redislock demo on Redis at {url}: starting workers {', '.join(WORKERS)} "
          f"(prefork, {CONCURRENCY} processes each)")  # fmt: skip
    workers = start_workers(url, log_dir, WORKERS, CONCURRENCY, {"TASKDEMO_SCALE": scale})
    try:
        progress = _Progress()
        outcomes = []
        for case in CASES:
            print(f"- {case.__name__.replace('_', '-')}: {(case.__doc__ or '').split(chr(10))[0]}")
            outcomes.append(case(client, QUICK if args.quick else FULL, progress))
            progress.end()
    finally:
        workers.stop()
    # The same use cases on RQ, judged alike and drawn in the same picture.
    outcomes += run_rq_cases(url, args.quick, log_dir, progress, progress.end)
    print()
    lines = summary_lines(outcomes)
    print("\n".join(lines))
    # After a blank line: the legend is not part of the summary drawn into the picture.
    print("\n" + "\n".join(legend_lines()))
    runs = [*load(client), *load_rq(client)]
    events = [*load_events(client, EVENTS), *load_events(client, RQ_EVENTS)]
    cases = [o.case for o in outcomes]
    allowed = {o.case: o.allowed for o in outcomes}
    shown = panels(runs, events, cases, _kill_times(runs, outcomes), allowed)
    drawn = draw(shown, args.png, "\n".join(lines))
    print(f"\ntimeline: {args.png}" if drawn else "\ntimeline: skipped (pip install matplotlib)")
    passed = all(o.passed for o in outcomes)
    if args.write_docs and drawn and passed:
        write_sample(SAMPLE_PAGE, lines)
        print(f"sample output: {SAMPLE_PAGE}")
    elif args.write_docs:
        print("docs not written: " + ("a use case failed" if drawn else "no picture"))

    return {
        "passed": passed,
        "seconds": round(time.monotonic() - started, 1),
        "workers": list(WORKERS),
        "timeline": str(args.png) if drawn else None,
        "drawn": {p.case: p.counts() for p in shown},
        "cases": {o.case: {**asdict(o), "passed": o.passed} for o in outcomes},
    }


def _kill_times(runs: Sequence[Any], outcomes: Sequence[Any]) -> dict[str, float]:
    """Use case -> when its run was killed: the start of the copy that took over, less the
    recovery time."""
    found = {}
    for outcome in outcomes:
        seconds = outcome.notes.get("recovery seconds")
        successor = [r for r in runs if r.case == outcome.case and r.end is not None]
        if successor and seconds is not None:
            found[outcome.case] = float(successor[0].start - seconds)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the demo; 0 if every use case held, 1 if one failed, 130 if interrupted."""
    args = _parse(argv)
    sigterm_as_interrupt()
    try:
        with tempfile.TemporaryDirectory(prefix="taskdemo-") as logs, redis_url() as url:
            summary = run(url, args, Path(logs))
    except KeyboardInterrupt:
        print("\ninterrupted: every worker stopped, and the Redis server if started here",
              file=sys.stderr)  # fmt: skip
        return 130
    print("\nall use cases held" if summary["passed"] else "\nA USE CASE FAILED (see above)")
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if summary["passed"] else 1
