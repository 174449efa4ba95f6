"""The lock-core demo, run as a user runs it from the checkout:
``python -m demos.core --quick --json PATH``.

Assertions are on the JSON summary and on processes, never on the printed wording.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import HAS_PROC, alive, processes, wait_for

from celery_redislock.contrib.redis_server import RedisServer

SCENARIOS = {"mutex", "cap", "read_write", "fair", "crash"}
DEMO = [sys.executable, "-m", "demos.core", "--quick"]
ROOT = Path(__file__).resolve().parents[2]  # demos/ is in the checkout, not installed


def _env(redis_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return env


def _run_demo(tmp_path: Path, redis_url: str | None) -> dict[str, Any]:
    summary = tmp_path / "summary.json"
    done = subprocess.run(
        [*DEMO, "--json", str(summary)],
        env=_env(redis_url),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    result: dict[str, Any] = json.loads(summary.read_text())
    return result


def _still_running(pids: list[int], grace: float = 5.0) -> list[int]:
    deadline = time.monotonic() + grace
    while True:
        running = [pid for pid in pids if alive(pid)]
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)


def _children(parent: int) -> dict[int, str]:
    """pid -> command name of each child of ``parent``."""
    return {p.pid: p.name for p in processes() if p.ppid == parent}


@pytest.mark.slow
def test_quick_demo_passes_on_each_redis(redis_server: RedisServer, tmp_path: Path) -> None:
    summary = _run_demo(tmp_path, redis_server.url)
    assert summary["passed"] is True
    assert summary["redis"]["started_here"] is False
    assert summary["redis"]["version"] == redis_server.version
    scenarios = summary["scenarios"]
    assert set(scenarios) == SCENARIOS
    for name, scenario in scenarios.items():
        failed = {k: c for k, c in scenario["checks"].items() if not c["passed"]}
        assert scenario["passed"] and not failed, (name, failed)
        assert scenario["checks"]["workers"]["observed"] == 0
    counter = scenarios["mutex"]["checks"]["counter"]
    assert counter["observed"] == counter["allowed"] == 4 * summary["settings"]["mutex_rounds"]
    assert scenarios["mutex"]["checks"]["max_concurrency"]["observed"] == 1
    assert scenarios["cap"]["checks"]["max_concurrency"]["observed"] == 3
    assert scenarios["read_write"]["checks"]["reader_writer_overlaps"]["observed"] == 0
    assert scenarios["read_write"]["stats"]["max_readers"] >= 2
    assert scenarios["crash"]["stats"]["recovery_ms"] <= 1000 + 500
    assert summary["seconds"] < 45  # --quick aims at under 15 s; this only guards against creep


@pytest.mark.slow
def test_demo_without_redis_url_starts_and_stops_its_own_server(tmp_path: Path) -> None:
    summary = _run_demo(tmp_path, None)
    assert summary["passed"] is True
    server = summary["redis"]
    assert server["started_here"] is True
    assert server["pid"] > 0
    assert summary["workers"] and os.getpid() not in summary["workers"]
    assert _still_running([server["pid"], *summary["workers"]]) == []
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(server["url"], socket_connect_timeout=1).ping()


@pytest.mark.skipif(not HAS_PROC, reason="finds the demo's children in /proc")
@pytest.mark.parametrize("target", ["demo", "process group"])
@pytest.mark.faults
def test_ctrl_c_stops_every_process_the_demo_started(target: str) -> None:
    """SIGINT to the demo alone (its cleanup does everything), or to its whole process group
    as a terminal's Ctrl-C does (the workers ignore it and are stopped by the demo)."""
    demo = subprocess.Popen(
        DEMO,
        env=_env(None),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert demo.stdout is not None
        for line in demo.stdout:  # the fair scenario runs its workers for seconds
            if line.startswith("[4/5]"):
                break
        wait_for(
            lambda: (
                "redis-server" in _children(demo.pid).values() and len(_children(demo.pid)) >= 2
            ),
            "the demo's server and workers run",
        )
        children = _children(demo.pid)
        assert "redis-server" in children.values(), children
        assert len(children) >= 2, children  # the server and some workers
        if target == "demo":
            demo.send_signal(signal.SIGINT)
        else:
            os.killpg(demo.pid, signal.SIGINT)
        _, stderr = demo.communicate(timeout=30)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert _still_running(list(children)) == []
