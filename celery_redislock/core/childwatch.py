"""The child watcher: a worker's parent process learns the moment a child running a locked job
dies (pidfds on Linux 5.3+, else /proc), so the lease the child held is released at once."""

from __future__ import annotations

import os
import select
import threading
import time
from typing import Protocol

from .forkguard import FORK_GUARD

__all__ = ["ChildWatch", "Watched", "alive"]

# How often the watch picks up newly started jobs (and, without pidfds, looks at /proc).
# A framework may notice a lost child only seconds later; the lease must not wait for that.
_WATCH_INTERVAL_S = 0.05


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")  # a zombie is dead, just not reaped yet
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): a zombie then counts as alive until reaped
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


class Watched(Protocol):
    """What a :class:`ChildWatch` watches on behalf of a child process: told when the child
    dies, asked whether it still needs watching."""

    def child_died(self, pid: int) -> None:
        """The child ``pid`` is dead (or a zombie): release what it held for this job."""

    def done(self) -> bool:
        """True once the job ended normally and the child released what it held itself."""


class ChildWatch:
    """One thread in a worker's parent process that watches the children running locked jobs
    and tells each job the moment its child is dead (a zombie counts), so that the parent can
    release the child's lease at once instead of waiting for it to lapse.

    >>> watch = ChildWatch()                    # doctest: +SKIP
    >>> watch.watch(job_id, child_pid, job)     # job.child_died(pid) is called on its death
    """

    def __init__(self) -> None:
        self._watched: dict[str, tuple[int, Watched]] = {}  # job id -> (child pid, job)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, job_id: str, pid: int, job: Watched) -> None:
        """Watches child ``pid`` while it runs ``job_id``, until it dies or ``job.done()``."""
        with self._cond:
            idle = not self._watched  # the thread sleeps until there is something to watch
            self._watched[job_id] = (pid, job)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="redislock-childwatch", daemon=True
                )
                self._thread.start()
            if idle:
                self._cond.notify()

    def watching(self) -> list[str]:
        """Ids of the jobs whose children are watched now (a snapshot, for inspection).

        >>> ChildWatch().watching()
        []
        """
        with self._cond:
            return list(self._watched)

    def _forget(self, job_id: str) -> bool:
        with self._cond:
            return self._watched.pop(job_id, None) is not None

    def _run(self) -> None:
        pidfds: dict[int, int] = {}  # child pid -> pidfd: readable once the child has exited
        while True:
            with self._cond:
                while not self._watched:
                    self._cond.wait()
                watched = list(self._watched.items())
            dead = self._wait_for_deaths({pid for pid, _ in dict(watched).values()}, pidfds)
            for job_id, (pid, job) in watched:
                if pid in dead:
                    if self._forget(job_id):
                        # Releases and hands on through Redis and the broker: the replacement
                        # child the worker forks meanwhile must not cut a call in two.
                        with FORK_GUARD.held():
                            job.child_died(pid)
                elif job.done():
                    self._forget(job_id)  # the child released the lease itself

    @staticmethod
    def _wait_for_deaths(pids: set[int], pidfds: dict[int, int]) -> set[int]:
        """Waits up to one interval; returns the pids among ``pids`` that have died. With
        pidfds (Linux 5.3+) the kernel says so the moment it happens, at no cost meanwhile."""
        dead = set()
        for pid in pids - pidfds.keys():
            try:
                pidfds[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                dead.add(pid)
            except (AttributeError, OSError):  # no pidfds here: read /proc after a pause
                time.sleep(_WATCH_INTERVAL_S)
                return dead | {p for p in pids if not alive(p)}
        poller = select.poll()
        for pid in pids - dead:
            poller.register(pidfds[pid], select.POLLIN)
        by_fd = {fd: pid for pid, fd in pidfds.items()}
        for fd, _ in poller.poll(_WATCH_INTERVAL_S * 1000):
            dead.add(by_fd[fd])
        for pid in [p for p in pidfds if p in dead or p not in pids]:
            os.close(pidfds.pop(pid))  # died, or runs no locked task now
        return dead
