"""What the RQ tests read back: the spans the jobs noted, and waiting for jobs to end."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import redis
from rq.job import Job

ENDED = ("finished", "failed", "canceled", "stopped")


def spans(conn: redis.Redis, kind: str) -> list[dict[str, Any]]:
    return [json.loads(s) for s in conn.lrange(f"spans:{kind}", 0, -1)]


def started(conn: redis.Redis, kind: str) -> list[dict[str, Any]]:
    return [json.loads(s) for s in conn.lrange(f"started:{kind}", 0, -1)]


def most_at_once(spans: Iterable[tuple[float, float]]) -> int:
    """The most spans in progress at one instant (an end sorts before a start at one instant:
    a lock handed over is not held twice)."""
    level = most = 0
    for _, step in sorted(e for s, t in spans for e in ((s, 1), (t, -1))):
        level += step
        most = max(most, level)
    return most


def most_at_once_per_key(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    by_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        by_key[str(r["key"])].append((r["start"], r["end"]))
    return {key: most_at_once(s) for key, s in by_key.items()}


def status(job: Job) -> str:
    return str(getattr(job.get_status(refresh=True), "value", job.get_status()))


def wait_ended(jobs: Iterable[Job], timeout: float = 60) -> list[str]:
    """Polls until every job ended; returns their statuses (fails naming the ones left)."""
    jobs = list(jobs)
    deadline = time.monotonic() + timeout
    while True:
        states = [status(j) for j in jobs]
        if all(s in ENDED for s in states):
            return states
        assert time.monotonic() < deadline, f"jobs not ended after {timeout}s: {states}"
        time.sleep(0.05)
