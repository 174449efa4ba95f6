"""The RQ use cases: each enqueues a burst of jobs, waits for every one to end, and is judged on
what the jobs noted (never on what the producer hoped), as the Celery ones are."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import redis
from rq.job import Job

from celery_redislock.core.admin import describe_lock
from celery_redislock.integrations.rq import UniqueQueue, outcome_of, spec_of

from .._common.runs import Outcome, TaskRun, judge_runs, load_runs
from . import jobs
from .workers import start_workers, stop_workers, worker_name

__all__ = ["CASES", "FULL", "QUICK", "WORKERS", "load", "run_cases"]

Progress = Callable[[str, int, int], None]
"""Called as jobs end: (use case, done, of how many)."""

WORKERS = 4  # one job at a time each: three share the cap, a fourth waits in its line
ENDED = ("finished", "failed", "stopped", "canceled")


@dataclass(frozen=True)
class Size:
    """How many jobs each use case enqueues."""

    singleton: int
    api_calls: int


FULL = Size(singleton=60, api_calls=24)
QUICK = Size(singleton=20, api_calls=10)


def load(client: redis.Redis) -> list[TaskRun]:
    return load_runs(client, jobs.INTERVALS)


def _status(job: Job) -> str:
    status = job.get_status(refresh=True)
    return str(getattr(status, "value", status))


def _wait(
    queued: Sequence[Job], case: str, progress: Progress, timeout: float = 90
) -> dict[str, str]:
    """Waits until every job ended; returns job id -> status."""
    deadline = time.monotonic() + timeout
    while True:
        states = {j.id: _status(j) for j in queued}
        ended = sum(s in ENDED for s in states.values())
        progress(case, ended, len(states))
        if ended == len(states):
            return states
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{case}: {len(states) - ended} job(s) still not done after {timeout}s"
            )
        time.sleep(0.05)


def _runs(client: redis.Redis, case: str) -> list[TaskRun]:
    return [r for r in load(client) if r.case == case]


def singleton(queue: UniqueQueue, size: Size, progress: Progress) -> Outcome:
    """nightly_report(day), unique until finished, enqueued many times through UniqueQueue"""
    calls = [queue.enqueue(jobs.nightly_report, "2026-11-21") for _ in range(size.singleton)]
    burst_end = time.time()
    copies = list({c.id: c for c in calls}.values())
    outcome = Outcome(
        "rq-singleton", "nightly_report(day): unique until finished", len(calls), len(copies)
    )
    states = _wait(copies, outcome.case, progress)
    outcome.notes["not enqueued (duplicates)"] = len(calls) - len(copies)
    runs = _runs(queue.connection, outcome.case)
    judge_runs(outcome, runs, time.time(), 1)
    slow_burst = any(r.end is not None and r.end < burst_end for r in runs)
    # Each copy queued ran once. One is queued while the burst lasts; on a machine so busy that
    # the first copy finished before the last call, that call queues the next (until finished).
    outcome.checks["each queued copy ran once"] = outcome.ran == outcome.queued
    outcome.checks["the burst queued one copy"] = outcome.queued == 1 or slow_burst
    outcome.checks["the job finished"] = set(states.values()) == {"finished"}
    return outcome


def cap(queue: UniqueQueue, size: Size, progress: Progress) -> Outcome:
    """call_api(n) with limit=3 on 4 workers: at most three at once, the fourth waits"""
    calls = [queue.enqueue(jobs.call_api, i) for i in range(size.api_calls)]
    outcome = Outcome(
        "rq-cap", "call_api(n): at most 3 at once, fleet-wide", len(calls), len(calls)
    )
    states = _wait(calls, outcome.case, progress)
    judge_runs(outcome, _runs(queue.connection, outcome.case), time.time(), 3)
    outcome.skipped = sum(outcome_of(j) is not None for j in calls)
    outcome.checks["every call ran"] = outcome.ran == len(calls)
    outcome.checks["every job finished"] = set(states.values()) == {"finished"}
    outcome.checks["the cap was reached"] = outcome.max_together == 3
    return outcome


def recovery(queue: UniqueQueue, size: Size, progress: Progress) -> Outcome:
    """import_batch('nightly'): its work horse is SIGKILLed mid-run; a copy takes over

    As by the OOM killer: a copy waiting for the lock on another worker starts once the dead
    horse's worker (a LockWorker) has released its lease, long before the lease's ttl."""
    client = queue.connection
    case = "rq-recovery"
    first = queue.enqueue(jobs.import_batch, "nightly", 60, job_timeout=300)
    outcome = Outcome(case, "import_batch('nightly'): its work horse killed", 2, 2)
    deadline = time.monotonic() + 30
    while not _runs(client, case):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{case}: the first import did not start")
        time.sleep(0.02)
    (victim,) = _runs(client, case)
    second = queue.enqueue(jobs.import_batch, "nightly", 0.5)
    spec = spec_of(jobs.import_batch)
    assert spec is not None
    name = spec.lock_name(("nightly", 0.5), {})
    while not describe_lock(client, name, jobs.NAMESPACE).waiters:  # the copy stands in line
        if time.monotonic() > deadline:
            raise TimeoutError(f"{case}: the second import never waited for the lock")
        time.sleep(0.02)
    progress(case, 1, 2)
    killed_at = time.time()
    os.kill(victim.pid, signal.SIGKILL)
    states = _wait([first, second], case, progress)
    runs = _runs(client, case)
    successor = next(r for r in runs if r.task_id == second.id)
    outcome.notes["killed pid"] = victim.pid
    outcome.notes["recovery seconds"] = round(successor.start - killed_at, 3)
    judge_runs(outcome, runs, killed_at, 1)
    outcome.checks["the waiting copy took over within 5 s (ttl 10 s)"] = (
        0 < successor.start - killed_at < 5 and successor.worker != victim.worker
    )
    outcome.checks["the killed job failed, the copy finished"] = (
        states[first.id] == "failed" and states[second.id] == "finished"
    )
    return outcome


CASES = (singleton, cap, recovery)


def run_cases(
    url: str, quick: bool, log_dir: Path, progress: Progress, case_done: Callable[[], None]
) -> list[Outcome]:
    """Starts the RQ workers, runs every use case (printing a line as each begins, calling
    ``case_done`` as each ends), stops the workers; returns the outcomes."""
    client = redis.Redis.from_url(url)
    for key in client.scan_iter(match=f"{jobs.NAMESPACE}:*"):
        client.delete(key)
    queue = UniqueQueue(jobs.QUEUE, connection=client)
    queue.empty()  # type: ignore[no-untyped-call]  # jobs an interrupted run left queued
    names = [worker_name(i) for i in range(1, WORKERS + 1)]
    print(f"RQ: starting workers {', '.join(n.split('-')[0] for n in names)} "
          "(rq worker -w celery_redislock.integrations.rq.LockWorker)", flush=True)  # fmt: skip
    scale = {"TASKDEMO_SCALE": "0.5" if quick else "1"}
    workers = start_workers(url, log_dir, names, scale)
    outcomes = []
    try:
        for case in CASES:
            doc = (case.__doc__ or "").split("\n")[0]
            print(f"- rq-{case.__name__}: {doc}", flush=True)
            outcomes.append(case(queue, QUICK if quick else FULL, progress))
            case_done()
    finally:
        stop_workers(workers, names)
        client.close()
    return outcomes
