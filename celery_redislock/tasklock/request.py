"""The worker parent's side: release what a pool child held as soon as the child is gone."""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
import weakref
from typing import Any

from billiard.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery.worker import state as worker_state
from celery.worker.request import Request

from .runtime import lock_for
from .settings import client_for

__all__ = ["LockRequest"]

log = logging.getLogger("celery_redislock")

_HOST = socket.gethostname()
# How often the watch picks up newly started tasks (and, without pidfds, looks at /proc).
# Celery itself may notice a lost child only seconds later; the lease must not wait for that.
_WATCH_INTERVAL_S = 0.05
_CHILD_DEATHS = (Terminated, TimeLimitExceeded, WorkerLostError, SystemExit, KeyboardInterrupt)


def _alive(pid: int) -> bool:
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


class _ChildWatch:
    """One thread in the worker's parent process that watches the pool children running locked
    tasks and releases a child's lease the moment the child is dead (a zombie counts)."""

    def __init__(self) -> None:
        self._watched: dict[str, tuple[int, LockRequest]] = {}  # task id -> (child pid, request)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, request: LockRequest, pid: int) -> None:
        with self._cond:
            idle = not self._watched  # the thread sleeps until there is something to watch
            self._watched[request.id] = (pid, request)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="redislock-childwatch", daemon=True
                )
                self._thread.start()
            if idle:
                self._cond.notify()

    def _forget(self, task_id: str) -> bool:
        with self._cond:
            return self._watched.pop(task_id, None) is not None

    def _run(self) -> None:
        pidfds: dict[int, int] = {}  # child pid -> pidfd: readable once the child has exited
        while True:
            with self._cond:
                while not self._watched:
                    self._cond.wait()
                watched = list(self._watched.items())
            dead = self._wait_for_deaths({pid for pid, _ in dict(watched).values()}, pidfds)
            for task_id, (pid, request) in watched:
                if pid in dead:
                    if self._forget(task_id):
                        request.release_for_dead_child(pid)
                elif not request.child_dying and request not in worker_state.active_requests:
                    self._forget(task_id)  # done: the child released the lease itself

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
                return dead | {p for p in pids if not _alive(p)}
        poller = select.poll()
        for pid in pids - dead:
            poller.register(pidfds[pid], select.POLLIN)
        by_fd = {fd: pid for pid, fd in pidfds.items()}
        for fd, _ in poller.poll(_WATCH_INTERVAL_S * 1000):
            dead.add(by_fd[fd])
        for pid in [p for p in pidfds if p in dead or p not in pids]:
            os.close(pidfds.pop(pid))  # died, or runs no locked task now
        return dead


_watch = _ChildWatch()
_prepared: weakref.WeakSet[Any] = weakref.WeakSet()  # apps whose lock client exists here


def _reset_after_fork() -> None:
    global _watch
    _watch = _ChildWatch()


os.register_at_fork(after_in_child=_reset_after_fork)


class LockRequest(Request):  # type: ignore[misc]
    """Celery's request with one addition, run in the worker's parent process: while a pool
    child runs a locked task the parent watches it, and if the child dies (hard time limit,
    ``revoke(terminate=True)``, SIGKILL, OOM) the lease it held is released at once.

    Subclass it (and set ``Request`` on your task class) if you need a request class of your own.
    """

    # Set (in the main thread) once Celery reports the child dead or being killed: the watch
    # then keeps the request until the child is gone, though Celery has finished with it.
    child_dying = False

    def on_accepted(self, pid: int, time_accepted: float) -> None:
        super().on_accepted(pid, time_accepted)
        if getattr(self.task, "lock_options", None) is not None and pid != os.getpid():
            if self.task.app not in _prepared:
                client_for(self.task.app)  # made here, not in the watch thread (fork safety)
                _prepared.add(self.task.app)
            _watch.watch(self, pid)  # (solo and threads pools have no child to watch)

    def terminate(self, pool: Any, signal: Any = None) -> None:
        # revoke(terminate=True): Celery counts the task done at once, before the child is
        # dead; the watch must keep waiting for the death.
        self.child_dying = True
        super().terminate(pool, signal)

    def cancel(self, pool: Any, *args: Any, **kwargs: Any) -> Any:
        self.child_dying = True  # cold shutdown, lost connection: the child is being killed
        return super().cancel(pool, *args, **kwargs)

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if not soft:
            self.child_dying = True  # the pool kills the child right after this
        super().on_timeout(soft, timeout)

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # ExceptionWithTraceback wraps the original
        if isinstance(exc, _CHILD_DEATHS):
            self.child_dying = True
        return super().on_failure(exc_info, send_failed_event, return_ok)

    def release_for_dead_child(self, pid: int) -> None:
        """Releases the lease the dead child ``pid`` took for this task (matched by task id,
        host and pid: never a lease of another delivery or another process)."""
        try:
            lock = lock_for(self.task, self.args, self.kwargs)
            released = lock.release_where(task_id=self.id, host=_HOST, pid=str(pid))
        except Exception as exc:
            log.warning(
                "task %s[%s]: could not release the lease of dead child %d "
                "(it lapses within its ttl): %s",
                self.name,
                self.id,
                pid,
                exc,
            )
            return
        if released:
            log.info("lock %r released: child %d running task %s died", lock.name, pid, self.id)
