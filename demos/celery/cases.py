"""The use cases: each fires a burst of calls, waits for every run, and is judged on what the
tasks noted (never on what the producer hoped)."""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
from celery.result import AsyncResult

from celery_redislock import lock_for

from .._common.runs import Outcome, judge_runs
from .._common.spans import most_at_once, overlapping_pairs
from . import app as tasks
from .runs import TaskRun, actions, load, spans

Progress = Callable[[str, int, int], None]
"""Called as calls are sent and runs end: (use case, done, of how many)."""


@dataclass(frozen=True)
class Size:
    """How many calls each use case sends."""

    singleton: int
    customers: int
    per_customer: int
    api_calls: int
    reads: int
    writes: int
    postings: int


FULL = Size(
    singleton=60, customers=5, per_customer=8, api_calls=24, reads=16, writes=4, postings=16
)
QUICK = Size(singleton=20, customers=3, per_customer=4, api_calls=10, reads=8, writes=2, postings=8)


def _wait(results: list[AsyncResult], case: str, progress: Progress, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    pending = {r.id: r for r in results}
    while pending:
        pending = {i: r for i, r in pending.items() if not r.ready()}
        progress(case, len(results) - len(pending), len(results))
        if time.monotonic() > deadline:
            raise TimeoutError(f"{case}: {len(pending)} task(s) still not done after {timeout}s")
        time.sleep(0.05)


def _judge(
    outcome: Outcome, runs: list[TaskRun], client: redis.Redis, now: float, allowed: int
) -> Outcome:
    counted = actions(client)
    outcome.skipped = counted.get(f"{outcome.case}:skip", 0)
    outcome.retried = counted.get(f"{outcome.case}:retry", 0)
    return judge_runs(outcome, runs, now, allowed)


def singleton(client: redis.Redis, size: Size, progress: Progress) -> Outcome:
    """nightly_report(day), unique until finished, enqueued many times at once"""
    calls = [tasks.nightly_report.delay("2026-11-21") for _ in range(size.singleton)]
    burst_end = time.time()
    copies = list({c.id: c for c in calls}.values())
    outcome = Outcome(
        "singleton", "nightly_report(day): unique until finished", len(calls), len(copies)
    )
    _wait(copies, outcome.case, progress)
    outcome.notes["not published (duplicates)"] = actions(client).get("singleton:existing", 0)
    runs = load(client)
    _judge(outcome, runs, client, time.time(), 1)
    slow_burst = any(
        r.case == outcome.case and r.end is not None and r.end < burst_end for r in runs
    )
    # Each copy queued ran once. One is queued while the burst lasts; on a machine so busy that
    # the first copy finished before the last call, that call queues the next (until finished).
    outcome.checks["each queued copy ran once"] = outcome.ran == outcome.queued
    outcome.checks["the burst queued one copy"] = outcome.queued == 1 or slow_burst
    return outcome


def per_customer(client: redis.Redis, size: Size, progress: Progress) -> Outcome:
    """sync_customer(id) over a handful of customers: one at a time per customer"""
    calls = [
        tasks.sync_customer.delay(i % size.customers)
        for i in range(size.customers * size.per_customer)
    ]
    outcome = Outcome(
        "per-customer", f"sync_customer(id) over {size.customers} customers", len(calls), len(calls)
    )
    _wait(calls, outcome.case, progress)
    runs = load(client)
    _judge(outcome, runs, client, time.time(), 1)
    customers = [r for r in runs if r.case == outcome.case]
    outcome.notes["customers in progress at once (max)"] = most_at_once(
        spans(customers, time.time())
    )
    outcome.checks["every call ran"] = outcome.ran == len(calls)
    return outcome


def cap(client: redis.Redis, size: Size, progress: Progress) -> Outcome:
    """call_api(n) with limit=3: at most three at once across both workers"""
    calls = [tasks.call_api.delay(i) for i in range(size.api_calls)]
    outcome = Outcome("cap", "call_api(n): at most 3 at once, fleet-wide", len(calls), len(calls))
    _wait(calls, outcome.case, progress)
    _judge(outcome, load(client), client, time.time(), 3)
    outcome.checks["every call ran"] = outcome.ran == len(calls)
    outcome.checks["the cap was reached"] = outcome.max_together == 3
    return outcome


def read_write(client: redis.Redis, size: Size, progress: Progress) -> Outcome:
    """read_cache('eu') readers share; rebuild_cache('eu') runs alone"""
    calls: list[AsyncResult] = []
    per_write = max(1, size.reads // size.writes)
    for i in range(size.reads):
        calls.append(tasks.read_cache.delay("eu"))
        if i % per_write == per_write - 1:
            calls.append(tasks.rebuild_cache.delay("eu"))
    outcome = Outcome("read-write", "read_cache / rebuild_cache('eu')", len(calls), len(calls))
    _wait(calls, outcome.case, progress)
    now = time.time()
    runs = [r for r in load(client) if r.case == outcome.case]
    readers = [r for r in runs if r.key.startswith("read:")]
    writers = [r for r in runs if r.key.startswith("write:")]
    _judge(outcome, runs, client, now, 1)
    outcome.max_together = most_at_once(spans(writers, now))  # the exclusive side
    outcome.checks["never more than allowed at once"] = outcome.max_together <= 1
    outcome.notes["readers at once (max)"] = most_at_once(spans(readers, now))
    outcome.notes["reader beside a writer"] = overlapping_pairs(
        spans(readers, now), spans(writers, now)
    )
    outcome.checks["every call ran"] = outcome.ran == len(calls)
    outcome.checks["readers shared"] = outcome.notes["readers at once (max)"] > 1
    outcome.checks["no reader beside a writer"] = outcome.notes["reader beside a writer"] == 0
    return outcome


def line(client: redis.Redis, size: Size, progress: Progress) -> Outcome:
    """post_ledger('acme', n): a burst on one key drains through the lock's task line

    on_conflict="queue": each call that finds the lock taken waits in Redis (no worker slot,
    no retry) and is published again the moment the lock frees, in the order it joined."""
    calls = [tasks.post_ledger.delay("acme", n) for n in range(size.postings)]
    outcome = Outcome("line", "post_ledger('acme'): one at a time, in line", len(calls), len(calls))
    _wait(calls, outcome.case, progress)
    now = time.time()
    runs = sorted((r for r in load(client) if r.case == outcome.case), key=lambda r: r.start)
    _judge(outcome, runs, client, now, 1)
    parked = actions(client).get("line:queue", 0)
    idle = [b.start - a.until(now) for a, b in itertools.pairwise(runs)]
    outcome.notes["waited in line"] = parked
    outcome.notes["idle between runs, max ms"] = round(max(idle, default=0) * 1000, 1)
    outcome.checks["every call ran"] = outcome.ran == len(calls)
    outcome.checks["no conflict retry"] = outcome.retried == 0
    outcome.checks["tasks waited in line"] = parked > 0
    return outcome


def recovery(client: redis.Redis, size: Size, progress: Progress) -> Outcome:
    """import_batch('nightly'): its worker process is SIGKILLed mid-run; a copy takes over

    As by the OOM killer: a copy waiting for the lock starts once the worker's parent has
    released the dead process's lease."""
    first = tasks.import_batch.delay("nightly", 60)
    outcome = Outcome("recovery", "import_batch('nightly'): its worker process killed", 2, 2)
    deadline = time.monotonic() + 30
    while not [r for r in load(client) if r.case == "recovery"]:
        if time.monotonic() > deadline:
            raise TimeoutError("recovery: the first import did not start")
        time.sleep(0.02)
    (victim,) = [r for r in load(client) if r.case == "recovery"]
    second = tasks.import_batch.delay("nightly", 0.5)
    lock = lock_for(tasks.import_batch, ("nightly", 0.5))
    while not client.zcard(lock.keys.all[2]):  # the copy stands in the lock's line
        if time.monotonic() > deadline:
            raise TimeoutError("recovery: the second import never waited for the lock")
        time.sleep(0.02)
    progress(outcome.case, 1, 2)
    killed_at = time.time()
    os.kill(victim.pid, signal.SIGKILL)
    _wait([second], outcome.case, progress)
    runs = [r for r in load(client) if r.case == "recovery"]
    successor = next(r for r in runs if r.task_id == second.id)
    outcome.notes["killed pid"] = victim.pid
    outcome.notes["recovery seconds"] = round(successor.start - killed_at, 3)
    _judge(outcome, runs, client, killed_at, 1)
    outcome.checks["the waiting copy took over within 5 s"] = (
        0 < successor.start - killed_at < 5 and first.id != second.id
    )
    return outcome


CASES = (singleton, per_customer, cap, read_write, line, recovery)
