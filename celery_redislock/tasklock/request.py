"""The worker parent's side: release what a pool child held as soon as the child is gone."""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from billiard.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request

from ..lock import Lock
from .runtime import lock_for

__all__ = ["LockRequest"]

log = logging.getLogger("celery_redislock")

_HOST = socket.gethostname()
# How often the parent looks whether a child running a locked task is still alive. Celery
# itself may notice a lost child only seconds later; the lease must not wait for that.
_WATCH_INTERVAL_S = 0.02
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
        self._watched: dict[str, tuple[int, Lock]] = {}  # task id -> (child pid, its lock)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, task_id: str, pid: int, lock: Lock) -> None:
        with self._cond:
            self._watched[task_id] = (pid, lock)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="redislock-childwatch", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def forget(self, task_id: str) -> tuple[int, Lock] | None:
        with self._cond:
            return self._watched.pop(task_id, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._watched:
                    self._cond.wait()
                watched = list(self._watched.items())
            for task_id, (pid, _) in watched:
                if not _alive(pid):
                    entry = self.forget(task_id)
                    if entry is not None:
                        release_dead(task_id, *entry)
            with self._cond:
                self._cond.wait(_WATCH_INTERVAL_S)


_watch = _ChildWatch()


def _reset_after_fork() -> None:
    global _watch
    _watch = _ChildWatch()


os.register_at_fork(after_in_child=_reset_after_fork)


def release_dead(task_id: str, pid: int, lock: Lock) -> None:
    """Releases the lease a dead child took for ``task_id`` (matched by task id, host, pid)."""
    try:
        released = lock.release_where(task_id=task_id, host=_HOST, pid=str(pid))
    except Exception as exc:
        log.warning(
            "lock %r: could not release the lease of dead child %d (it lapses within its ttl): %s",
            lock.name,
            pid,
            exc,
        )
        return
    if released:
        log.info("lock %r released: child %d running task %s died", lock.name, pid, task_id)


class LockRequest(Request):  # type: ignore[misc]
    """Celery's request with one addition, run in the worker's parent process: while a pool
    child runs a locked task the parent watches it, and if the child dies (hard time limit,
    ``revoke(terminate=True)``, SIGKILL, OOM) the lease it held is released at once.

    Subclass it (and set ``Request`` on your task class) if you need a request class of your own.
    """

    def on_accepted(self, pid: int, time_accepted: float) -> None:
        super().on_accepted(pid, time_accepted)
        if getattr(self.task, "lock_options", None) is None or pid == os.getpid():
            return  # not locked, or no child to watch (solo and threads pools)
        try:
            lock = lock_for(self.task, self.args, self.kwargs)
        except Exception:
            log.exception(
                "task %s[%s]: cannot derive its lock to watch its child", self.name, self.id
            )
            return
        _watch.watch(self.id, pid, lock)

    def on_success(self, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        _watch.forget(self.id)
        return super().on_success(failed__retval__runtime, **kwargs)

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # ExceptionWithTraceback wraps the original
        if not isinstance(exc, _CHILD_DEATHS):
            _watch.forget(self.id)  # the child ended the task itself and released the lease
        return super().on_failure(exc_info, send_failed_event, return_ok)
