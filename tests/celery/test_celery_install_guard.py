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


TYPO = textwrap.dedent(
    """
    import os
    from celery import Celery

    app = Celery("typo", broker=os.environ["BROKER_URL"], task_cls=os.environ.get("TASK_CLS"))
    if os.environ.get("INSTALL"):
        import celery_redislock
        celery_redislock.install(app)


    @app.task(lock={"key": "sync:{customer}", "on_conflcit": "retry"})
    def sync(customer): ...
    """
)


@pytest.mark.parametrize(
    "env",
    [{"INSTALL": "1"}, {"INSTALL": "1", "TASK_CLS": "celery_redislock:LockedTask"}],
    ids=["install", "install-and-task-cls"],
)
def test_install_refuses_a_bad_option_as_the_module_is_imported(
    tmp_path: Path, redis_server: RedisServer, env: dict[str, str]
) -> None:
    """``install(app)`` checks each option as its ``@app.task`` decorator runs: importing the
    module fails, naming the task and the option, before anything is published."""
    (tmp_path / "typo.py").write_text(TYPO)
    done = subprocess.run(
        [sys.executable, "-c", "import typo"],
        cwd=tmp_path,
        env=_env(redis_server, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("celery_redislock.errors.LockConfigError: task 'typo.sync'"), last
    assert "unknown lock option(s) 'on_conflcit'" in last
    assert "PromiseProxy" not in done.stderr


def test_task_cls_alone_cannot_check_at_import_so_the_readme_offers_install(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Celery makes an app's tasks lazily (a ``PromiseProxy``), and with ``task_cls=`` alone
    nothing of this package runs as the decorator does: the module imports, and the bad option
    is only found when the task is first made (a worker's start, a producer's first call). So
    the README offers one way, ``install(app)``, which checks at import."""
    (tmp_path / "typo.py").write_text(TYPO)
    env = _env(redis_server, TASK_CLS="celery_redislock:LockedTask")
    imported = subprocess.run(
        [sys.executable, "-c", "import typo"], cwd=tmp_path, env=env, capture_output=True
    )
    assert imported.returncode == 0
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "celery_redislock.install(app)" in readme
    assert "task_cls" not in readme, "the README offers install(app), the way that checks"
