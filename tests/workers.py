"""Real Celery worker processes for tests: each in its own process group, killed for real."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import children_of

TESTS = Path(__file__).parent


class Worker:
    """``celery -A <app> worker`` as a subprocess, with its log in a file."""

    def __init__(
        self,
        url: str,
        log_dir: Path,
        *,
        name: str = "w1",
        pool: str = "prefork",
        concurrency: int = 2,
        app: str = "lockapp",
        env: dict[str, str] | None = None,
        heartbeat: bool = False,
        queues: str | None = None,
    ) -> None:
        self.name, self.pool, self.concurrency, self.app = name, pool, concurrency, app
        self.queues = queues  # -Q: the queues it consumes (None: Celery's default)
        # Worker heartbeats on: its event dispatcher is enabled without -E, as in production,
        # so that `celery control enable_events` can turn task events on.
        self.heartbeat = heartbeat
        self.log_path = log_dir / f"worker-{name}.log"
        self.env = {
            **os.environ,
            "LOCKAPP_REDIS_URL": url,
            "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
            **(env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> Worker:
        command = [
            sys.executable, "-m", "celery", "-A", self.app, "worker",
            "-P", self.pool, "-c", str(self.concurrency), "-n", f"{self.name}@%h",
            "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "info",
        ]  # fmt: skip
        if self.heartbeat:
            command.remove("--without-heartbeat")
        if self.queues is not None:
            command += ["-Q", self.queues]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while " ready." not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"worker {self.name} did not start:\n{self.log()}")
            time.sleep(0.05)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def dump_threads(self, timeout: float = 5, times: int = 2, apart: float = 3) -> None:
        """Has a live worker write every thread's stack into its log (Celery's SIGUSR1
        handler), ``times`` times ``apart`` seconds apart, each after a line with the state of
        its processes and threads: a failing test's report then shows where a stuck worker
        stands, and whether it moves."""
        for n in range(times):
            if self.proc is None or self.proc.poll() is not None:
                return
            if n:
                time.sleep(apart)  # (what moves between two dumps is what was not stuck)
            with open(self.log_path, "ab") as log:
                log.write(f"\n--- thread dump {n + 1}: {_processes(self.proc.pid)}\n".encode())
            before = len(self.log())
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGUSR1)
            deadline = time.monotonic() + timeout
            while len(self.log()) == before and time.monotonic() < deadline:
                time.sleep(0.05)  # (a poll: the dump comes when the worker's handler runs)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def children(self) -> list[int]:
        return children_of(self.pid)

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL to the whole process group: the main process and every pool child."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def finish(self, timeout: float = 5) -> None:
        """End of a test: a cold shutdown (SIGQUIT: the pool's children are terminated, the
        main process exits through its own shutdown, so coverage records the parent-side code),
        then SIGKILL to the whole group, whatever is left."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)  # a test may have stopped it
                self.proc.send_signal(signal.SIGQUIT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self.kill()

    def stop(self, timeout: float = 20) -> None:
        """Warm shutdown (SIGTERM); SIGKILL if it takes longer than ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            self.kill()
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        finally:
            self.kill()


def _processes(pid: int) -> str:
    """Each process of ``pid``'s tree and each of its threads: state and kernel wait channel
    (``S futex_wait_queue``: waiting on a lock; ``R``: running)."""

    def threads(proc: int) -> str:
        found = []
        for task in sorted(Path(f"/proc/{proc}/task").glob("*")):
            with contextlib.suppress(OSError):
                stat = (task / "stat").read_text()
                comm, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat.split(")")[1][1]
                wchan = (task / "wchan").read_text() or "-"
                found.append(f"{task.name} {comm} {state} {wchan}")
        return "; ".join(found)

    lines = [f"pid {p}: {threads(p)}" for p in [pid, *children_of(pid)]]
    return " | ".join(lines)
