"""An RQ job enqueued again and again, queued and run once at a time.

``@locked(unique="until_finished")`` with ``UniqueQueue``: from the moment ``nightly_report(day)``
is enqueued until it has finished, enqueuing it again returns the job already queued or running
instead of queuing a second one. A copy enqueued around ``UniqueQueue`` (a plain ``Queue``, as
RQ's own scheduler uses) still never runs beside it: the job's lease, taken in the work horse,
makes that copy end as ``SKIPPED``.

What it does: enqueues the report 10 times and starts a burst worker; while the report runs, it
enqueues it 10 more times, and once through a plain ``Queue`` for a second burst worker. Once
that copy has ended, the report may finish (a real one would simply take long); then the report
is enqueued once more, now that it is free, and a burst worker runs it. It prints what was
queued, what ran (from the intervals the job noted in Redis) and how each call ended.

Run: python examples/rq_singleton.py   (REDIS_URL, else a throwaway redis-server; starts
                                        ``rq worker --burst -w ...LockWorker`` processes)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import redis
from rq import Queue, get_current_job

from celery_redislock.contrib.redis_server import redis_url
from celery_redislock.integrations.rq import SKIPPED, Settings, UniqueQueue, locked, outcome_of

NAME = "rq_singleton"
DAY = "2026-11-22"
RUNS = f"{NAME}:runs"  # the intervals the report noted, one JSON [start, end] per run
WATCHED = f"{NAME}:watched"  # set by the producer: the report may finish


@locked(unique="until_finished", settings=Settings(namespace=NAME))
def nightly_report(day: str) -> str:
    """Builds the report (a wait: until the producer has watched it, at least 0.5 s, at most
    30 s), noting when it ran."""
    job = get_current_job()
    assert job is not None
    start = time.time()
    time.sleep(0.5)
    while not job.connection.exists(WATCHED) and time.time() < start + 30:
        time.sleep(0.05)
    job.connection.rpush(RUNS, json.dumps([start, time.time()]))  # still holding its lease
    return f"report {day}"


def burst_workers(url: str, count: int) -> list[subprocess.Popen[bytes]]:
    """``rq worker --burst`` as a user types it: each leaves once the queue is empty."""
    command = [
        sys.executable, "-m", "rq.cli", "worker", "--burst", "--url", url,
        "--worker-class", "celery_redislock.integrations.rq.LockWorker",
        "--path", str(Path(__file__).parent), "--logging_level", "WARNING", NAME,
    ]  # fmt: skip
    return [subprocess.Popen(command) for _ in range(count)]


def finish(workers: list[subprocess.Popen[bytes]], timeout: float = 60) -> None:
    try:
        for worker in workers:
            if worker.wait(timeout) != 0:
                raise RuntimeError(f"worker exited {worker.returncode}")
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()


def wait_status(job_id: str, client: redis.Redis, *statuses: str) -> None:
    deadline = time.monotonic() + 30
    while client.hget(f"rq:job:{job_id}", "status") not in {s.encode() for s in statuses}:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} is not {' or '.join(statuses)}")
        time.sleep(0.02)


def most_at_once(runs: list[list[float]]) -> int:
    edges = sorted(e for start, end in runs for e in ((start, 1), (end, -1)))
    level = most = 0
    for _, step in edges:
        level += step
        most = max(most, level)
    return most


def main() -> int:
    with redis_url() as url:
        client = redis.Redis.from_url(url)
        client.delete(NAME, *client.scan_iter(match=f"{NAME}:*"))  # what an earlier run left
        unique = UniqueQueue(NAME, connection=client)

        queued = [unique.enqueue(nightly_report, DAY) for _ in range(10)]
        workers = burst_workers(url, 1)
        try:
            wait_status(queued[0].id, client, "started")
            running = [unique.enqueue(nightly_report, DAY) for _ in range(10)]
            around = Queue(NAME, connection=client).enqueue(nightly_report, DAY)
            workers += burst_workers(url, 1)
            wait_status(around.id, client, "finished", "failed")
            client.set(WATCHED, 1)
        finally:
            finish(workers)
        later = unique.enqueue(nightly_report, DAY)  # free again: a new job
        finish(burst_workers(url, 1))

        calls = [*queued, *running, later]
        jobs = {job.id: job for job in calls}
        around.refresh()
        skipped = outcome_of(around)
        runs = [json.loads(raw) for raw in client.lrange(RUNS, 0, -1)]
        finished = [j.get_status(refresh=True) == "finished" for j in jobs.values()]
        print(f"enqueue calls through UniqueQueue: {len(calls)}")
        print(f"jobs queued: {len(jobs)}")
        print(f"refused while queued: {sum(j.id == queued[0].id for j in queued[1:])}")
        print(f"refused while running: {sum(j.id == queued[0].id for j in running)}")
        by_report = skipped is not None and skipped["holders"] == [queued[0].id]
        held_by = "the running report" if by_report else f"{skipped}"
        print(f"copy around UniqueQueue: {around.return_value()}, its lock held by {held_by}")
        print(f"report runs: {len(runs)}")
        print(f"max running at once: {most_at_once(runs)}")
        held = (
            len(jobs) == 2
            and all(finished)
            and len(runs) == 2
            and most_at_once(runs) == 1
            and around.return_value() == SKIPPED
            and by_report
            and skipped is not None
            and skipped["outcome"] == "skipped"
        )
        print("invariant: " + ("held" if held else "BROKEN"))
        client.close()
        return 0 if held else 1


if __name__ == "__main__":
    # RQ names a job by its import path: enqueue this file's job as ``rq_singleton.*``, the name
    # a worker imports, not as ``__main__.*``.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rq_singleton

    sys.exit(rq_singleton.main())
