"""Job functions for the RQ tests: each notes in the job's own Redis when it started (with its
pid) and, as it ends, its span, so a test judges exclusion on what ran."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import redis
import rq
import rqsignals  # noqa: F401  (connects the test receivers in every worker and horse)
from rq import get_current_job

from celery_redislock.integrations.rq import LockWorker, locked

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


def enqueue_report(day: str) -> str:
    """Enqueues ``report(day)`` through a ``UniqueQueue`` from inside a work horse."""
    from celery_redislock.integrations.rq import UniqueQueue

    job = get_current_job()
    assert job is not None
    return str(UniqueQueue("later", connection=job.connection).enqueue(report, day).id)


@locked(unique={"lifecycle": "until_started", "on_duplicate": "raise"})
def refresh(day: str) -> str:
    return _run("refresh", day)


@locked(lock={"key": "h:{key}", "on_conflict": "wait", "timeout": 120, "ttl": 6})
def hold(key: str) -> str:
    return _run("hold", key, until_stopped=True)


# hold with a ttl long enough that its lease cannot lapse before a parent on a busy machine
# handles its horse's death: a release logged then is the parent's, not a lapse's.
@locked(lock={"key": "h:{key}", "on_conflict": "wait", "timeout": 120, "ttl": 30})
def hold_long(key: str) -> str:
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


def pid() -> int:
    """A plain job (no lock): the pid of the horse that ran it."""
    return os.getpid()


# -- a worker whose sweeper is inside RQ's connection pool as the worker forks a horse ----------


class _Held:
    """Coordinates, in a worker's main process, the sweeper thread and the fork of a horse."""

    def __init__(self, conn: redis.Redis) -> None:
        self.notes = conn  # a client of its own: the sweeper's pool is held meanwhile
        self.fork_wanted = threading.Event()
        self.holding = threading.Event()
        self.forked = threading.Event()
        self.done = False

    def before_fork(self) -> None:
        # Registered after the fork guard's hook: runs first, before the fork waits, if it does.
        if not self.done and self.notes.exists("fork:note"):
            self.fork_wanted.set()
            self.holding.wait(30)

    def after_fork_in_parent(self) -> None:
        if self.fork_wanted.is_set() and not self.forked.is_set():
            self.forked.set()
            self.notes.rpush("fork:events", "forked")

    def fork_waits(self) -> bool:
        """Whether the main thread waits in the fork guard (a fork under way)."""
        frame = sys._current_frames().get(threading.main_thread().ident or 0)
        while frame is not None:
            if frame.f_code.co_name == "_before_fork" and "forkguard" in frame.f_code.co_filename:
                return True
            frame = frame.f_back
        return False

    def hold_across_the_fork(self, pool: redis.ConnectionPool) -> None:
        """In the sweeper's call (under the fork guard): waits for a horse's fork, and holds
        the pool (as redis-py does for an instant in each call) until that fork either waits
        for the sweeper or happened."""
        if self.done or not self.notes.exists("fork:note"):
            return
        if not self.fork_wanted.wait(30):
            return
        self.done = True
        with pool._lock:  # type: ignore[attr-defined]
            self.holding.set()
            deadline = time.monotonic() + 30
            # Until the fork waits for this thread (the guard), or was made (no guard).
            while not (self.forked.is_set() or self.fork_waits()):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)
            waits = self.fork_waits()
        self.notes.rpush("fork:events", *(["fork waits"] if waits else []), "released")


class _SweeperClient:
    """The sweeper's client, each of its task line sweeps first held across a horse's fork."""

    def __init__(self, client: redis.Redis, held: _Held) -> None:
        self._client, self._held = client, held

    def hgetall(self, key: Any) -> Any:
        self._held.hold_across_the_fork(self._client.connection_pool)
        return self._client.hgetall(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class ForkNotingWorker(LockWorker):
    """A ``LockWorker`` whose sweeper, once the key ``fork:note`` exists, holds RQ's connection
    pool in its sweep (under the fork guard) when the worker forks a horse: a horse forked
    meanwhile would inherit the pool taken. ``fork:events`` says in what order things went."""

    def _redislock_sweeper(self, settings: Any) -> Any:
        sweeper = super()._redislock_sweeper(settings)
        if sweeper is not None:
            held = _Held(
                redis.Redis(
                    connection_pool=redis.ConnectionPool(
                        **self.connection.connection_pool.connection_kwargs
                    )
                )
            )
            os.register_at_fork(before=held.before_fork, after_in_parent=held.after_fork_in_parent)
            sweeper.client = _SweeperClient(sweeper.client, held)
        return sweeper


class PlainWorker(rq.Worker):
    """RQ's own ``Worker``, with this module (and so the package) imported before it forks its
    horses: a horse then starts its job at once. Imported in the horse instead, the package
    took more than a 2 s job timeout on a busy machine, and the job timed out before it began."""
