"""``redislock web``: serves the view of the group's Redis (read-only, or with actions behind a
token from a file or the environment); refuses to start with --allow-actions and no token;
warns when bound to a non-loopback address; says which extra to install when Starlette is
missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from helpers import free_port, wait_for
from webclient import TOKEN, WebClient

from celery_redislock import Lock

REDISLOCK = str(Path(sys.executable).parent / "redislock")


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [REDISLOCK, *args], capture_output=True, text=True, timeout=60, env=env or os.environ
    )


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _up(web: WebClient) -> bool:
    try:
        return web.get().status == 200
    except OSError:
        return False


def test_redislock_web_serves_the_view_with_actions_behind_the_token(
    lockapp: ModuleType, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    lease = Lock(lockapp.r, "cli:1", ttl=30).acquire(info={"task_id": "task-cli"})
    try:
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
        port = free_port()
        proc = subprocess.Popen(
            [
                REDISLOCK,
                "web",
                "--url",
                lockapp.URL,
                "--port",
                str(port),
                "--allow-actions",
                "--token-file",
                str(token_file),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        started.append(proc)
        web = WebClient(f"http://127.0.0.1:{port}/")
        wait_for(lambda: _up(web) or proc.poll() is not None, "redislock web to serve", 30)
        assert proc.poll() is None, proc.communicate()[0]
        assert "task-cli" in web.get().text
        assert web.login("not-the-token-but-long").status == 403
        assert web.login().status == 303
        assert web.act("release", name="cli:1", all="1").status == 200
        assert Lock(lockapp.r, "cli:1", ttl=1).holders() == []
    finally:
        if Lock(lockapp.r, "cli:1", ttl=1).holders():
            lease.release()


def test_allow_actions_without_a_token_does_not_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDISLOCK_WEB_TOKEN"}
    done = _run("--url", "redis://127.0.0.1:1/0", "web", "--allow-actions", env=env)
    assert done.returncode == 2
    assert "--allow-actions needs a token: --token-file PATH or REDISLOCK_WEB_TOKEN" in done.stderr
    short = _run(
        "web", "--url", "redis://127.0.0.1:1/0", "--allow-actions",
        env={**env, "REDISLOCK_WEB_TOKEN": "short"},
    )  # fmt: skip
    assert short.returncode == 2 and "token must be at least 16 characters" in short.stderr
    empty = tmp_path / "empty"
    empty.write_text("\n")
    no_file = _run("web", "--allow-actions", "--token-file", str(empty), env=env)
    assert no_file.returncode == 2 and "is empty" in no_file.stderr


def test_a_non_loopback_address_is_warned_about_and_an_unreachable_redis_named() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    done = _run("web", "--url", url, "--host", "0.0.0.0")
    assert "Warning: serving on 0.0.0.0, not a loopback address" in done.stderr
    assert done.returncode == 3 and f"Redis at {url} is unreachable" in done.stderr
    bad = _run("web", "--url", "http://example.com")
    assert bad.returncode == 2 and "is not a Redis URL" in bad.stderr


def test_without_the_web_extra_it_names_the_extra_to_install() -> None:
    code = (
        "import sys; sys.modules['starlette'] = None\n"
        "from celery_redislock.cli import main\n"
        "main(['web', '--url', 'redis://127.0.0.1:1/0'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "redislock web needs the web extra: pip install 'celery-redislock[web]'" in done.stderr
