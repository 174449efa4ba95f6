"""The jobs of the RQ benchmark (``rq_overhead.py``); its workers import them from here.

``plain``, ``floor``, ``floor_renewer`` and ``locked`` do the same one ``INCR``; ``locked`` takes a
lease on a lock of its own (``rqbench:<run>:<i>``: distinct per call, so no call ever conflicts);
``floor`` takes no lock but makes the two round trips any lock held where the job runs cannot do
without, one ``PING`` before its body and one after it. ``floor_renewer`` does the same and also
starts a thread that wakes every second, once per process, as a lease's renewer is started
where the job runs: in a forked work horse, once per job (a lease must be renewed by the
process that runs the job: its worker may die while it runs, and RQ then runs the job again
while the orphaned horse still does). ``hold`` is the long locked job of the recovery
measurement: it notes its pid and start time, then sleeps.
"""

from __future__ import annotations

import _thread
import json
import os
import threading
import time
from typing import Any

from rq import get_current_job

from celery_redislock.integrations.rq import locked

TTL_S = 5.0  # the lease ttl of ``hold`` (the default is 15 s)


def _connection() -> Any:
    job = get_current_job()
    assert job is not None, "run by an RQ worker"
    return job.connection


def done_key(run: str, variant: str) -> str:
    return f"rqbench:{run}:done:{variant}"


def events_key(run: str) -> str:
    return f"rqbench:{run}:events"


def plain(run: str, i: int) -> None:
    _connection().incr(done_key(run, "plain"))


def floor(run: str, i: int) -> None:
    connection = _connection()
    connection.ping()  # where a lock takes its lease
    connection.incr(done_key(run, "floor"))
    connection.ping()  # where it gives it back


_renewer_pid = 0  # the process that started a renewing thread


def _idle() -> None:
    # Waits as the heartbeat's thread does with nothing due: on a condition, waking each second.
    wake = threading.Condition()
    with wake:
        while True:
            wake.wait(1.0)


def _start_renewer() -> None:
    """A thread of this process's own, started at its first job (a bare thread, as ours)."""
    global _renewer_pid
    if _renewer_pid != os.getpid():
        _renewer_pid = os.getpid()
        _thread.start_new_thread(_idle, ())


def floor_renewer(run: str, i: int) -> None:
    connection = _connection()
    connection.ping()  # where a lock takes its lease
    _start_renewer()  # where it registers the lease to be renewed
    connection.incr(done_key(run, "floor_renewer"))
    connection.ping()  # where it gives it back


@locked(lock="rqbench:{run}:{i}")
def locked_noop(run: str, i: int) -> None:
    _connection().incr(done_key(run, "locked"))


@locked(
    lock={"key": "rqbench:{run}:hold:{key}", "ttl": TTL_S, "on_conflict": "wait", "timeout": 120}
)
def hold(run: str, key: str, tag: str, seconds: float) -> None:
    """Notes ``{"tag", "pid", "t"}`` (its horse's pid, its start) once it holds the lease."""
    event = {"tag": tag, "pid": os.getpid(), "t": time.time()}
    _connection().rpush(events_key(run), json.dumps(event))
    time.sleep(seconds)
