"""Exclusion under load with real workers: 2 workers x 2 prefork children = 4 processes."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from celery import group
from helpers import wait_for
from workers import Worker

from celery_redislock import lock_for


def _run_all(lockapp: ModuleType, calls: Any, timeout: float, runs: dict[str, int]) -> None:
    """Runs the group and waits until every member succeeded, reading each result's state
    from the backend (Celery 5.3's result consumer can miss a group member's message when the
    first get() of a process subscribes late, and then waits for ever).

    A member may be left ``RETRY`` although its retry ran to success: Celery publishes a retry
    before it stores the retried delivery's state, and its backend reads, then writes (a
    ``SUCCESS`` stored in between is overwritten). So once each key of ``runs`` saw that many
    runs end, a member in ``RETRY`` counts as done: the runs are what the tests judge."""
    result = group(calls).apply_async()
    deadline = time.monotonic() + timeout

    def all_ran() -> bool:
        return all(
            len(_seen(lockapp, key)) == count and int(lockapp.r.get(f"active:{key}") or 0) == 0
            for key, count in runs.items()
        )

    while True:
        states = [r.state for r in result.results]
        if all(state == "SUCCESS" for state in states):
            return
        if set(states) <= {"SUCCESS", "RETRY"} and all_ran():
            return
        assert time.monotonic() < deadline, f"not all succeeded: {sorted(set(states))}"
        time.sleep(0.1)


def _seen(lockapp: ModuleType, key: str) -> list[int]:
    return [int(v) for v in lockapp.r.lrange(f"seen:{key}", 0, -1)]


@pytest.fixture
def four_processes(workers: Callable[..., Worker]) -> None:
    workers(name="w1")
    workers(name="w2")


@pytest.mark.slow  # about 4 s on 2 quiet cores
@pytest.mark.usefixtures("four_processes")
def test_read_modify_write_loses_no_update(lockapp: ModuleType) -> None:
    keys = [f"k{i}" for i in range(10)]
    calls = [key for key in keys for _ in range(20)]
    random.Random(7).shuffle(calls)
    _run_all(lockapp, [lockapp.increment.s(key) for key in calls], 240, dict.fromkeys(keys, 20))
    for key in keys:
        assert int(lockapp.r.get(f"counter:{key}")) == 20, key  # no lost update
        seen = _seen(lockapp, key)
        assert len(seen) == 20
        assert max(seen) == 1, f"{key}: runs overlapped: {seen}"
        lock = lock_for(lockapp.increment, (key,))
        wait_for(lambda: not lock.locked(), f"lock of {key} given back", 30)  # noqa: B023


@pytest.mark.usefixtures("four_processes")
def test_limit_caps_concurrency_and_reaches_it(lockapp: ModuleType) -> None:
    _run_all(lockapp, [lockapp.capped.s(i) for i in range(30)], 120, {"cap": 30})
    seen = _seen(lockapp, "cap")
    assert len(seen) == 30
    assert max(seen) == 3, seen  # never more than 3, and 3 reached (4 processes compete)


@pytest.mark.slow  # about 3 s on 2 quiet cores
@pytest.mark.usefixtures("four_processes")
def test_readers_share_and_a_writer_runs_alone(lockapp: ModuleType) -> None:
    calls = [lockapp.read.s("db") for _ in range(24)] + [lockapp.write.s("db") for _ in range(6)]
    random.Random(3).shuffle(calls)
    _run_all(lockapp, calls, 120, {"read:db": 24, "write:db": 6})
    readers_seen = _seen(lockapp, "read:db")
    writers_seen = _seen(lockapp, "write:db")
    assert len(readers_seen) == 24 and len(writers_seen) == 6
    assert max(readers_seen) > 1, "readers never overlapped"
    assert max(writers_seen) == 1
    # Beside each writer's entry: no reader was active; beside each reader's: no writer.
    for entry in lockapp.r.lrange("beside:write:db", 0, -1):
        assert entry == b"read:db=0", entry
    for entry in lockapp.r.lrange("beside:read:db", 0, -1):
        assert entry == b"write:db=0", entry
