"""A forgotten ``install(app)``: Celery accepts ``lock=``, ``unique=`` and ``rate=`` as unknown
task options, so the tasks of an app that never installed celery_redislock would run with no
lock. Its worker refuses to start instead, naming the tasks and the fix. Real ``celery worker``
processes on an app written to a file, with nothing of ours imported by the app."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import wait_for

from celery_redislock.contrib.redis_server import RedisServer

APP = textwrap.dedent(
    """
    import os, threading
    from celery import Celery, Task

    app = Celery("proj", broker=os.environ["BROKER_URL"])
    if os.environ.get("INSTALL"):
        import celery_redislock
        celery_redislock.install(app)


    class WithAThreadLock(Task):
        lock = threading.Lock()  # an attribute of the same name, not our option


    @app.task(base=WithAThreadLock)
    def plain(): ...


    if not os.environ.get("PLAIN_ONLY"):
        @app.task(lock=True)
        def nightly_report(day): ...

        @app.task(unique="until_finished")
        def rebuild_index(): ...

        @app.task(rate="10/s")
        def call_partner(account): ...
    """
)
COMMAND = [sys.executable, "-m", "celery", "-A", "proj", "worker", "--pool", "solo", "-l", "info",
           "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip


def _env(server: RedisServer, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("INSTALL", "PLAIN_ONLY")}
    return {**env, "BROKER_URL": server.url, **extra}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "proj.py").write_text(APP)
    return tmp_path


def test_a_worker_whose_app_never_called_install_refuses_to_start(
    project: Path, redis_server: RedisServer
) -> None:
    done = subprocess.run(
        COMMAND, cwd=project, env=_env(redis_server), capture_output=True, text=True, timeout=120
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "refuses to start" in out
    assert "proj.call_partner, proj.nightly_report, proj.rebuild_index" in out
    assert "celery_redislock.install(app)" in out and "celery_redislock:LockedTask" in out
    assert "proj.plain" not in out, "an attribute named lock that is no option is not flagged"
    assert "ready." not in out


@pytest.mark.parametrize("env", [{"INSTALL": "1"}, {"PLAIN_ONLY": "1"}], ids=["installed", "plain"])
def test_a_worker_starts_when_installed_or_with_no_lock_options(
    project: Path, redis_server: RedisServer, env: dict[str, str]
) -> None:
    log = project / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            COMMAND,
            cwd=project,
            env=_env(redis_server, **env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "ready." in log.read_text() or worker.poll() is not None, "ready", 60)
        assert worker.poll() is None, log.read_text()
        assert "refuses to start" not in log.read_text()
    finally:
        worker.kill()
        worker.wait(10)
