"""The demo's worker processes: real ``celery worker`` subprocesses, each in a process group of
its own, so that every one of them (and its pool children) is stopped however the demo ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

APP = "celery_redislock.taskdemo.app"


def worker_command(name: str, concurrency: int) -> list[str]:
    """The command a demo worker runs (the same one a user would type)."""
    return [
        sys.executable, "-m", "celery", "-A", APP, "worker", "-P", "prefork",
        "-c", str(concurrency), "-n", f"{name}@%h", "-l", "info",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip


class Fleet:
    """Started workers, by name; :meth:`stop` ends every one, :meth:`kill_child` one pool child."""

    def __init__(self, url: str, log_dir: Path, env: dict[str, str]) -> None:
        self.url, self.log_dir = url, log_dir
        self.env = {**os.environ, **env, "REDIS_URL": url}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, names: list[str], concurrency: int, timeout: float = 60) -> None:
        for name in names:
            with open(self.log_dir / f"{name}.log", "ab") as log:
                # A Ctrl-C between the fork and the bookkeeping would leak the worker.
                blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
                try:
                    self.procs[name] = subprocess.Popen(
                        worker_command(name, concurrency),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=self.env,
                        start_new_session=True,
                    )
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        deadline = time.monotonic() + timeout
        for name, proc in self.procs.items():
            while " ready." not in self.log(name):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker {name} did not start:\n{self.log(name)[-2000:]}")
                time.sleep(0.05)

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    @property
    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}

    def stop(self, grace: float = 10) -> None:
        """Warm shutdown for each worker, then SIGKILL for whatever is left of its group."""
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        self.procs.clear()


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signum)
