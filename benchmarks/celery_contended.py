"""Contended Celery workload: the task line (``on_conflict="queue"``) beside ``retry`` and
``wait``, in one run, on one Redis (a throwaway ``redis-server`` unless ``--url``).

Two workloads, each run once per conflict action on a fresh worker (prefork, 4 children):

* ``keys``: 60 calls over 4 keys (drawn at random, the same draw for every action), each run
  50 ms, exclusive per key;
* ``cap``: 24 calls under one cap of 3, each run 50 ms;
* ``slow``: one 1 s run on one key, then 40 calls of 50 ms: every fourth on that key, the rest
  over 6 other keys (what blocked waiters cost the other keys).

The same task body for every action (``benchmarks/contended_app.py``): it records when it
started and ended. Reported per action:

* extra deliveries per completed task: conflict retries (``retry``), hand-overs from the line
  (``queue``: one per task that parked, by design) — every delivery is a broker message;
* the delay from a run's end to the next start under the same lock (mean and p99: how long a
  freed lock stays idle while work waits for it);
* the drain time (first publish to last end) against the ideal schedule (the busiest key's work
  back to back; for the cap, 24 x 50 ms / 3), as a ratio.

A hand-over is a message published to the task's queue: it waits there behind whatever is
queued before it, so in a burst the first hand-overs wait behind the burst's own messages.

Run from the repository root::

    python benchmarks/celery_contended.py [--json out.json] [--quick] [--url redis://...]
        [--load N]

It takes about a minute (``--quick``: 15 calls per workload).
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from common import (
    Load,
    Target,
    add_load_option,
    base_parser,
    delete_keys,
    print_targets,
    redis_target,
    section,
)

HERE = Path(__file__).resolve().parent
WORK_S = 0.05
ACTIONS = ("retry", "wait", "queue")
WORKER_CMD = [
    "-m", "celery", "-A", "contended_app", "worker", "-P", "prefork", "-c", "4",
    "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "warning",
]  # fmt: skip


@dataclass
class Outcome:
    action: str
    workload: str
    tasks: int
    deliveries: int
    gaps_ms: list[float]
    drain_s: float
    ideal_s: float

    @property
    def extra_per_task(self) -> float:
        return (self.deliveries - self.tasks) / self.tasks

    @property
    def p99_ms(self) -> float:
        ordered = sorted(self.gaps_ms)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.gaps_ms) if self.gaps_ms else 0.0


def _gaps(runs: list[tuple[float, float]], holders: int) -> list[float]:
    """For each start that had to wait for a lock (all but the first ``holders``), the ms since
    the latest end before it: how long the freed lock stayed idle."""
    runs = sorted(runs)
    ends = sorted(end for _, end in runs)
    gaps = []
    for start, _ in runs[holders:]:
        before = [e for e in ends if e <= start]
        if before:
            gaps.append((start - before[-1]) * 1000)
    return gaps


def measure(url: str, run: str, logdir: Path, action: str, workload: str, calls: int) -> Outcome:
    os.environ.update(CONTENDED_URL=url, CONTENDED_RUN=run)
    sys.path.insert(0, str(HERE))
    import contended_app

    r = redis.Redis.from_url(url)
    capped = workload == "cap"
    task = contended_app.TASKS[(action, capped)]
    kind = f"{action}-cap" if capped else action
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    }
    log = logdir / f"worker-{kind}.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, *WORKER_CMD], env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        _ready(r, task)
        r.delete(f"{run}:deliveries:{task.name}")
        plan = _plan(workload, calls)
        keys = sorted({key for key, _ in plan})
        began = time.time()
        results = [task.delay(key, seconds) for key, seconds in plan]
        deadline = time.monotonic() + 300
        while not all(res.ready() for res in results):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{kind}: not drained in 300 s (see {log})")
            time.sleep(0.01)
        failed = [res.id for res in results if res.state != "SUCCESS"]
        if failed:
            raise RuntimeError(f"{kind}: {len(failed)} tasks did not succeed (see {log})")
        runs: dict[str, list[tuple[float, float]]] = {}
        for key in keys:
            raw = r.lrange(f"{run}:runs:{kind}:{key}", 0, -1)
            runs[key] = [(float(a), float(b)) for a, b in (x.split() for x in raw)]
        drain = max(end for rs in runs.values() for _, end in rs) - began
        holders = 3 if capped else 1
        gaps = [g for rs in runs.values() for g in _gaps(rs, holders)]
        work: dict[str, float] = {}
        for key, seconds in plan:
            work[key] = work.get(key, 0.0) + seconds
        ideal = sum(work.values()) / 3 if capped else max(work.values())
        deliveries = int(r.get(f"{run}:deliveries:{task.name}") or 0)
        return Outcome(action, workload, calls, deliveries, gaps, drain, ideal)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def _plan(workload: str, calls: int) -> list[tuple[str, float]]:
    """The calls of a workload: (key, seconds of work), in publish order."""
    draw = random.Random(7)  # the same keys, in the same order, for every action
    if workload == "cap":
        return [("cap", WORK_S)] * calls
    if workload == "keys":
        return [(draw.choice([f"k{i}" for i in range(4)]), WORK_S) for _ in range(calls)]
    # "slow": one long run on one key, then calls on it mixed with calls on 6 other keys.
    plan = [("slow", 1.0)]
    for i in range(calls - 1):
        plan.append(("slow", WORK_S) if i % 4 == 0 else (f"o{draw.randrange(6)}", WORK_S))
    return plan


def _ready(r: redis.Redis, task: Any) -> None:
    """Waits until the worker runs a task (a warm-up call on a key of its own)."""
    probe = task.delay("warm-up", 0.0)
    deadline = time.monotonic() + 60
    while not probe.ready():
        if time.monotonic() > deadline:
            raise RuntimeError("the worker did not start")
        time.sleep(0.02)


def report(outcomes: Sequence[Outcome]) -> None:
    titles = {
        "keys": "60 calls over 4 keys, 50 ms each",
        "cap": "24 calls under a cap of 3, 50 ms each",
        "slow": "a 1 s run on one key, then 40 calls: a quarter on it, the rest over 6 others",
    }
    for workload, title in titles.items():
        rows = [o for o in outcomes if o.workload == workload]
        section(title)
        print(
            f"  {'action':<8} {'tasks':>5} {'extra deliveries/task':>22} {'idle mean ms':>13} "
            f"{'idle p99 ms':>12} {'drain s':>8} {'ideal s':>8} {'drain/ideal':>12}"
        )
        for o in rows:
            print(
                f"  {o.action:<8} {o.tasks:>5} {o.extra_per_task:>22.2f} {o.mean_ms:>13.1f} "
                f"{o.p99_ms:>12.1f} {o.drain_s:>8.2f} {o.ideal_s:>8.2f} "
                f"{o.drain_s / o.ideal_s:>11.2f}x"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = base_parser(__doc__ or "", "15 calls per workload")
    add_load_option(parser)
    args = parser.parse_args(argv)
    began = time.perf_counter()
    run = f"contended-{uuid.uuid4().hex[:8]}"
    outcomes: list[Outcome] = []
    with redis_target(args.url or os.environ.get("REDIS_URL")) as (url, origin):
        print(
            f"Contended Celery workload on Redis at {url} ({origin}); {os.cpu_count()} CPU(s)"
            + (f"; {args.load} CPU-burning process(es) throughout" if args.load else "")
        )
        r = redis.Redis.from_url(url)
        with tempfile.TemporaryDirectory() as tmp, Load(args.load):
            for workload, calls in (("keys", 60), ("cap", 24), ("slow", 41)):
                for action in ACTIONS:
                    n = 15 if args.quick else calls
                    outcomes.append(measure(url, run, Path(tmp), action, workload, n))
        if args.url:
            delete_keys(r, run)
    report(outcomes)
    line = [o for o in outcomes if o.action == "queue"]
    checks = []
    for o in line:
        # The line's only extra delivery is the hand-over of a task that parked (at most 1).
        checks.append(
            Target(f"queue ({o.workload}): extra deliveries per task", o.extra_per_task, 1.0)
        )
        checks.append(
            Target(f"queue ({o.workload}): end to next start, p99", o.p99_ms, 20, unit=" ms")
        )
        checks.append(Target(f"queue ({o.workload}): drain / ideal", o.drain_s / o.ideal_s, 1.1))
    print_targets(checks, began)
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "action": o.action,
                        "workload": o.workload,
                        "tasks": o.tasks,
                        "extra_deliveries_per_task": o.extra_per_task,
                        "idle_mean_ms": o.mean_ms,
                        "idle_p99_ms": o.p99_ms,
                        "drain_s": o.drain_s,
                        "ideal_s": o.ideal_s,
                    }
                    for o in outcomes
                ],
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
