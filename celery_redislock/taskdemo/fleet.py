"""The demo's workers: real ``celery worker`` subprocesses (see :mod:`.processes`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .processes import Children

APP = "celery_redislock.taskdemo.app"


def worker_command(name: str, concurrency: int) -> list[str]:
    """The command a demo worker runs (the same one a user would type)."""
    return [
        sys.executable, "-m", "celery", "-A", APP, "worker", "-P", "prefork",
        "-c", str(concurrency), "-n", f"{name}@%h", "-l", "info",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip


class Fleet:
    """The demo's workers by name, on the Redis at ``url``; :meth:`stop` ends every one."""

    def __init__(self, url: str, log_dir: Path, env: dict[str, str]) -> None:
        self.children = Children(log_dir, env={**os.environ, **env, "REDIS_URL": url})

    def start(self, names: list[str], concurrency: int, timeout: float = 60) -> None:
        for name in names:
            self.children.start(name, worker_command(name, concurrency))
        self.children.wait_ready(names, timeout)

    @property
    def procs(self) -> dict[str, subprocess.Popen[bytes]]:
        return self.children.procs

    def stop(self, grace: float = 10) -> None:
        self.children.stop(grace)
