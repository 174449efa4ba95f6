"""``celery -A app redislock ...`` run as a subprocess against a real worker holding a lock:
``list`` and ``show`` show the holder and its waiter, ``release --dry-run`` frees nothing,
``release --task-id`` frees it and the waiting copy starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from helpers import stop, wait_for, wait_started
from workers import TESTS, Worker

from celery_redislock import lock_for
from celery_redislock.contrib.redis_server import RedisServer


def celery(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "cliapp", "redislock", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
        cwd=TESTS,
    )


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


@pytest.fixture
def cliapp(lockapp: ModuleType) -> ModuleType:
    import cliapp as module

    return module


@pytest.mark.slow
def test_show_and_release_a_running_tasks_lock(
    lockapp: ModuleType, cliapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    worker = workers(app="cliapp", concurrency=2)
    holder = lockapp.hold.delay("cli", 120)
    wait_started(lockapp, "cli")
    lock = lock_for(lockapp.hold, ("cli",))
    waiting = cliapp.waits_long.delay("cli")
    wait_for(lambda: lock.client.zcard(lock.keys.all[2]) >= 1, "the copy waits in line", 30)
    pid = int(lockapp.r.hget("pid", holder.id))

    listed = celery("list", "hold:*")
    assert listed.returncode == 0, listed.stderr
    row = listed.stdout.splitlines()[1].split()
    assert row[:3] == ["hold:cli", "write", "1"] and row[-3:] == ["1", "-", "-"]  # 1 waiter

    shown = celery("show", "hold:cli")
    assert shown.returncode == 0, shown.stderr
    assert f"task lockapp.hold[{holder.id}]" in shown.stdout
    assert f"pid {pid}" in shown.stdout
    assert f"waiter 1: task cliapp.waits_long[{waiting.id}]" in shown.stdout
    detail = as_json(celery("show", "hold:cli", "--json"))
    (held,) = detail["holders"]
    assert held["task_id"] == holder.id and held["pid"] == pid and held["task"] == "lockapp.hold"
    assert held["fence"] == lock.holders()[0].fence and held["held_for"] >= 0
    assert [w["task_id"] for w in detail["waiters"]] == [waiting.id]

    dry = celery("release", "hold:cli", "--task-id", holder.id, "--dry-run")
    assert dry.returncode == 0 and "would free lock 'hold:cli'" in dry.stdout, dry.stderr
    assert [h.info["task_id"] for h in lock.holders()] == [holder.id]
    assert not lockapp.r.exists("started:waited:cli")

    freed = celery("release", "hold:cli", "--task-id", holder.id)
    assert freed.returncode == 0, freed.stderr
    assert f"freed lock 'hold:cli': task lockapp.hold[{holder.id}]" in freed.stdout
    assert waiting.get(timeout=60) == "ran"
    assert wait_started(lockapp, "waited:cli") == [waiting.id]
    # The first holder still runs: its heartbeat found its lease lost (logged at ERROR).
    wait_for(lambda: "lost" in worker.log(), "the holder's worker notes the lost lease", 30)
    stop(lockapp, "cli")
    holder.get(timeout=30)
    assert celery("release", "hold:cli", "--task-id", holder.id).returncode == 1


def test_unique_claims_through_celery(
    lockapp: ModuleType, cliapp: ModuleType, celery_server: RedisServer
) -> None:
    # Nothing held: nothing matched (the app's Redis and namespace are the ones read).
    assert celery("list").returncode == 1
    lockapp.r.set("redislock:{report}:queued", "t-1", px=60_000)
    (entry,) = as_json(celery("unique", "--json"))
    assert entry["name"] == "report" and entry["task_id"] == "t-1"
    freed = as_json(celery("release-claim", "report", "--json"))
    assert [c["task_id"] for c in freed["released"]] == ["t-1"]
    assert not lockapp.r.exists("redislock:{report}:queued")


def test_unreachable_lock_redis_is_exit_code_3(lockapp: ModuleType, cliapp: ModuleType) -> None:
    from helpers import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    result = celery("list", env={"LOCKAPP_LOCK_URL": url})
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert f"Error: Redis at {url} failed" in result.stderr
