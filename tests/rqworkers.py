"""Real ``rq worker`` processes for tests, each in its own process group, killed for real."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis
import rq.worker
from helpers import children_of

TESTS = Path(__file__).parent
RQ = str(Path(sys.executable).parent / "rq")

# SpawnWorker came in RQ 2.2: on the lowest RQ the tests run without it.
HAS_SPAWN = hasattr(rq.worker, "SpawnWorker")

CLASSES = {
    "LockWorker": "celery_redislock.integrations.rq.LockWorker",
    "LockSpawnWorker": "celery_redislock.integrations.rq.LockSpawnWorker",
    "Worker": "rq.worker.Worker",
    "SpawnWorker": "rq.worker.SpawnWorker",
    "SimpleWorker": "rq.worker.SimpleWorker",
}


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (a pool's workers, their horses, schedulers)."""
    found, todo = [], [pid]
    while todo:
        children = children_of(todo.pop())
        found += children
        todo += children
    return found


class RQWorker:
    """``rq worker`` as a subprocess (``--with-scheduler``, so retries come back), its log in a
    file."""

    def __init__(
        self,
        url: str,
        log_dir: Path,
        *,
        name: str,
        worker_class: str = "LockWorker",
        scheduler: bool = True,
        pool: int = 0,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        # A name of its own: RQ refuses a second live worker of one name, and a horse killed
        # while it wrote its worker's state could leave one behind for the next test.
        self.name = f"{name}-{os.urandom(3).hex()}"
        self.worker_class = CLASSES.get(worker_class, worker_class)
        self.url, self.scheduler, self.pool = url, scheduler, pool
        self.args = args  # more options for `rq worker` (e.g. --log-format)
        self.log_path = log_dir / f"rq-{name}.log"
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
            **(env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30) -> RQWorker:
        if self.pool:  # `rq worker-pool`: it runs a scheduler of its own
            command = [RQ, "worker-pool", "--url", self.url, "-w", self.worker_class]
            command += ["-n", str(self.pool)]
        else:
            command = [RQ, "worker", "--url", self.url, "-w", self.worker_class, "-n", self.name]
            if self.scheduler:
                command.append("--with-scheduler")
        command += self.args
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while self.log().count("Listening on") < max(1, self.pool):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"rq worker {self.name} did not start:\n{self.log()}")
            time.sleep(0.05)
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill_parent(self) -> None:
        """SIGKILLs the worker and its scheduler (its process group): its horse, in a process
        group of its own, lives on."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    @staticmethod
    def forget_scheduler(conn: redis.Redis, queue: str = "default") -> None:
        """Drops the scheduler lock a SIGKILLed worker held: RQ lets it lapse after 61 s, and
        only then does another worker's scheduler move due jobs (retries) of ``queue``."""
        conn.delete(f"rq:scheduler-lock:{queue}")

    def finish(self, timeout: float = 5) -> None:
        """End of a test: SIGTERM twice (RQ's cold shutdown: a running horse is killed, the
        worker exits through its own shutdown, so coverage records it), then :meth:`kill`."""
        if self.proc is not None and self.proc.poll() is None:
            deadline = time.monotonic() + timeout
            for _ in range(2):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGCONT)  # a test may have stopped it
                    self.proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(max(0.0, min(1.0, deadline - time.monotonic())))
                if self.proc.poll() is not None:
                    break
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        """SIGKILLs the worker, its process group and every descendant (horses included)."""
        if self.proc is None:
            return
        # Stop the parent first, so that it forks no horse (in a process group of its own)
        # while its children are being killed.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.proc.pid, signal.SIGSTOP)
        pids = descendants(self.proc.pid)
        for pid in pids:  # a pool's workers, stopped before they fork again
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        pids = descendants(self.proc.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
