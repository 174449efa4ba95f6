"""Job functions for the RQ tests: each notes in the job's own Redis when it started (with its
pid) and, as it ends, its span, so a test judges exclusion on what ran."""

from __future__ import annotations

import json
import os
import time

import rqsignals  # noqa: F401  (connects the test receivers in every worker and horse)
from rq import get_current_job

from celery_redislock.integrations.rq import locked

# A job that holds its lock until the test says stop (``stop:<key>``), at most this long.
HOLD_LIMIT_S = 60.0


def _run(kind: str, key: object, seconds: float = 0.0, *, until_stopped: bool = False) -> str:
    job = get_current_job()
    assert job is not None
    conn = job.connection
    start = time.time()
    conn.rpush(f"started:{kind}", json.dumps({"job": job.id, "key": key, "pid": os.getpid()}))
    if until_stopped:
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not conn.exists(f"stop:{key}") and time.monotonic() < deadline:
            time.sleep(0.01)
    else:
        time.sleep(seconds)
    conn.rpush(
        f"spans:{kind}",
        json.dumps({"job": job.id, "key": key, "start": start, "end": time.time()}),
    )
    return "ran"


@locked(lock={"key": "x:{key}", "on_conflict": "wait", "timeout": 120})
def exclusive(key: str, seconds: float = 0.05) -> str:
    return _run("exclusive", key, seconds)


@locked(lock={"key": "r:{key}", "on_conflict": "retry", "countdown": 0.5})
def exclusive_retry(key: str, seconds: float = 0.2) -> str:
    return _run("exclusive_retry", key, seconds)


@locked(lock={"key": "s:{key}", "on_conflict": "skip"})
def exclusive_skip(key: str) -> str:
    return _run("exclusive_skip", key)


@locked(lock={"key": "r:{key}", "on_conflict": "raise"})
def exclusive_raise(key: str) -> str:
    return _run("exclusive_raise", key)


@locked(lock={"key": "cap", "limit": 2, "on_conflict": "wait", "timeout": 120})
def capped(i: int, seconds: float = 0.3) -> str:
    return _run("capped", "cap", seconds)


@locked(lock={"key": "rw:{key}", "mode": "read", "on_conflict": "wait", "timeout": 120})
def reader(key: str, seconds: float = 0.3, hold: bool = False) -> str:
    return _run("reader", key, seconds, until_stopped=hold)


@locked(lock={"key": "rw:{key}", "mode": "write", "on_conflict": "wait", "timeout": 120})
def writer(key: str, seconds: float = 0.3) -> str:
    return _run("writer", key, seconds)


@locked(unique="until_finished")
def report(day: str, seconds: float = 0.5) -> str:
    return _run("report", day, seconds)


@locked(unique={"lifecycle": "until_started", "on_duplicate": "raise"})
def refresh(day: str) -> str:
    return _run("refresh", day)


@locked(lock={"key": "h:{key}", "on_conflict": "wait", "timeout": 120, "ttl": 6})
def hold(key: str) -> str:
    return _run("hold", key, until_stopped=True)


@locked(lock={"key": "h:{key}", "on_conflict": "retry", "countdown": 0.5, "ttl": 3})
def hold_retry(key: str) -> str:
    return _run("hold_retry", key, until_stopped=True)


@locked(unique={"key": "digest:{day}", "on_duplicate": "replace"})
def digest(day: str, seconds: float = 0.0) -> str:
    return _run("digest", day, seconds)


@locked(unique="until_finished")
def flaky(day: str) -> str:
    """Fails on its first run, then runs."""
    job = get_current_job()
    assert job is not None
    if job.connection.incr(f"runs:flaky:{day}") == 1:
        raise RuntimeError("first run fails")
    return _run("flaky", day)


# The task line (on_conflict="queue"): all on lock "q:<key>", so a test may mix them on one key.


@locked(lock={"key": "q:{key}", "on_conflict": "queue"})
def in_line(key: str, seconds: float = 0.05, hold: bool = False) -> str:
    return _run("in_line", key, seconds, until_stopped=hold)


@locked(lock={"key": "q:{key}", "on_conflict": "queue", "ttl": 3})
def in_line_short_ttl(key: str, hold: bool = False) -> str:
    return _run("in_line", key, until_stopped=hold)


@locked(lock={"key": "q:{key}", "on_conflict": "queue", "max_wait": 1})
def impatient(key: str) -> str:
    return _run("impatient", key)


@locked(lock={"key": "q:{key}", "on_conflict": "queue", "max_waiting": 2})
def short_line(key: str) -> str:
    return _run("in_line", key)


# A queued claim of 1 s past the enqueue: a job parked longer holds it only by keeping it.
@locked(
    lock={"key": "q:{key}", "on_conflict": "queue"},
    unique={"lifecycle": "until_started", "allowance": 1},
)
def unique_in_line(key: str) -> str:
    return _run("in_line", key)


@locked(lock={"key": "qcap", "limit": 3, "on_conflict": "queue"})
def capped_in_line(i: int, seconds: float = 0.3, hold: bool = False) -> str:
    return _run("capped_in_line", "qcap", seconds, until_stopped=hold)


@locked(rate="1/1.2s")
def rated(n: int) -> str:
    """At most 1 start per 1.2 s, fleet-wide (waited for in the horse, or back via Retry)."""
    return _run("rated", "rate", 0.0)


@locked(rate={"rate": "1/4s", "max_delay": 1})
def rated_impatient() -> str:
    return _run("rated_impatient", "rate", 0.0)
