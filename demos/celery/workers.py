"""The demo's workers: real ``celery worker`` subprocesses, each in a process group of its own
(see :mod:`demos._common.processes`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._common.processes import Children, demos_importable

APP = "demos.celery.app"


def worker_command(name: str, concurrency: int) -> list[str]:
    """The command a demo worker runs (the same one a user would type)."""
    return [
        sys.executable, "-m", "celery", "-A", APP, "worker", "-P", "prefork",
        "-c", str(concurrency), "-n", f"{name}@%h", "-l", "info",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip


def start_workers(
    url: str,
    log_dir: Path,
    names: Sequence[str],
    concurrency: int,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
) -> Children:
    """Starts the named workers on the Redis at ``url`` and waits until each is ready; the
    caller stops them (``Children.stop``). If one does not start, all are stopped first."""
    # The workers may run in any directory (the tests run the demo in a temporary one).
    children = Children(
        log_dir, env=demos_importable({**os.environ, **(env or {}), "REDIS_URL": url})
    )
    try:
        children.start_workers({name: worker_command(name, concurrency) for name in names}, timeout)
    except BaseException:
        children.stop()
        raise
    return children
