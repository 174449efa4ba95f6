"""The parent's side of the workers: a run's shared state, and the fleet of one scenario."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.context import ForkContext, SpawnContext
from multiprocessing.process import BaseProcess
from types import TracebackType

import redis

from .._common.processes import signals_blocked
from .intervals import NS_PER_S, Interval, load
from .settings import SCENARIO_TIMEOUT_S, Settings
from .workers import Job, Keys


@dataclass
class Run:
    """What the scenarios share: the Redis, a client, a process context and the pids started."""

    url: str
    client: redis.Redis
    context: ForkContext | SpawnContext
    settings: Settings
    run_id: str = field(default_factory=lambda: f"{os.getpid()}-{os.urandom(3).hex()}")
    pids: list[int] = field(default_factory=list)

    def keys(self, scenario: str) -> Keys:
        return Keys(f"demo:{self.run_id}:{scenario}")

    def forget_all(self) -> None:
        """Deletes the run's keys (its locks' keys expire by themselves), if Redis is still up."""
        try:
            stale = list(self.client.scan_iter(match=f"demo:{self.run_id}:*", count=500))
            if stale:
                self.client.delete(*stale)
        except redis.RedisError:
            pass  # interrupted, and the server is gone already


class Fleet:
    """The worker processes of one scenario; any still running when it closes are stopped."""

    def __init__(self, run: Run, keys: Keys) -> None:
        self.run = run
        self.keys = keys
        self.processes: list[BaseProcess] = []
        self.killed: set[int | None] = set()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(
        self, target: Callable[[str, Job], None], job: Job, count: int = 1
    ) -> list[BaseProcess]:
        started: list[BaseProcess] = []
        for _ in range(count):
            process = self.run.context.Process(target=target, args=(self.run.url, job), daemon=True)
            with signals_blocked():  # a Ctrl-C waits until the child is known
                process.start()
                self.processes.append(process)
                self.run.pids.append(process.pid or 0)
                started.append(process)
        return started

    def go(self, count: int, seconds: float | None = None) -> None:
        """Waits until ``count`` workers are at the start line, then starts them together."""
        for _ in range(count):
            self.pop(self.keys.ready)
        until_ns = 0 if seconds is None else time.monotonic_ns() + int(seconds * NS_PER_S)
        self.run.client.rpush(self.keys.go, *[until_ns] * count)

    def pop(self, key: str) -> bytes | str:
        """The next item a worker pushes to ``key``; raises if a worker died first."""
        deadline = time.monotonic() + SCENARIO_TIMEOUT_S
        while time.monotonic() < deadline:
            reply = self.run.client.blpop([key], timeout=0.5)
            if reply:
                item: bytes | str = reply[1]
                return item
            crashed = self.crashed()
            if crashed:
                raise RuntimeError(f"worker {crashed[0]} before reporting on {key}")
        raise RuntimeError(f"no worker reported on {key} in {SCENARIO_TIMEOUT_S:g} s")

    def join(self, processes: Sequence[BaseProcess] | None = None) -> None:
        deadline = time.monotonic() + SCENARIO_TIMEOUT_S
        for process in self.processes if processes is None else processes:
            process.join(max(0.0, deadline - time.monotonic()))

    def kill(self, process: BaseProcess) -> int:
        """SIGKILLs ``process``; returns when, in ``time.monotonic_ns()``."""
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        when = time.monotonic_ns()
        self.killed.add(process.pid)
        process.join(5)
        return when

    def failures(self) -> list[str]:
        """Workers that did not finish cleanly (those killed on purpose excepted)."""
        return [
            f"pid {p.pid} " + ("did not finish" if p.exitcode is None else f"exit {p.exitcode}")
            for p in self.processes
            if p.pid not in self.killed and p.exitcode != 0
        ]

    def crashed(self) -> list[str]:
        """Workers that exited with an error so far."""
        return [
            f"pid {p.pid} exit {p.exitcode}"
            for p in self.processes
            if p.pid not in self.killed and p.exitcode not in (None, 0)
        ]

    def close(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join(3)
            if process.is_alive():
                process.kill()
                process.join()


def collect(client: redis.Redis, key: str) -> list[Interval]:
    return [i for blob in client.lrange(key, 0, -1) for i in load(blob)]


def sleep_until(t_ns: int) -> None:
    time.sleep(max(0.0, (t_ns - time.monotonic_ns()) / NS_PER_S))
