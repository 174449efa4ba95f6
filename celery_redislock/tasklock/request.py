"""The worker parent's side: release what a pool child held when the child was killed."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from billiard.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request

from ..lock import Lock

__all__ = ["LockRequest"]

log = logging.getLogger("celery_redislock")

# How long the parent waits for a killed child to be gone before releasing its lease. A child
# still alive after this (stuck in the kernel) keeps renewing; its lease is left alone.
_DEATH_WAIT_S = 10.0
_HOST = socket.gethostname()
_CHILD_DEATHS = (Terminated, TimeLimitExceeded, WorkerLostError, SystemExit, KeyboardInterrupt)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")  # a zombie is dead, just not reaped yet
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


class LockRequest(Request):  # type: ignore[misc]
    """Celery's request with one addition, run in the worker's parent process: when the pool
    child running a locked task dies (hard time limit, ``revoke(terminate=True)``, SIGKILL,
    OOM), the lease the child held is released as soon as the child is gone.

    Subclass it (and set ``Request`` on your task class) if you need a request class of your own.
    """

    _redislock_released = False

    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)
        if not soft:
            self._release_for_dead_child()

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # ExceptionWithTraceback wraps the original
        try:
            return super().on_failure(exc_info, send_failed_event, return_ok)
        finally:
            if isinstance(exc, _CHILD_DEATHS):
                self._release_for_dead_child()

    def _release_for_dead_child(self) -> None:
        from .runtime import lock_for

        if self._redislock_released or getattr(self.task, "lock_options", None) is None:
            return
        self._redislock_released = True
        pid, task_id = self.worker_pid, self.id
        if pid is None:
            return  # never started in a child: nothing was taken
        try:
            lock = lock_for(self.task, self.args, self.kwargs)
        except Exception:
            log.exception(
                "task %s[%s]: cannot find the lock its dead child held", self.name, task_id
            )
            return
        threading.Thread(
            target=_release_when_gone,
            args=(lock, pid, task_id),
            name="redislock-release",
            daemon=True,
        ).start()


def _release_when_gone(lock: Lock, pid: int, task_id: str) -> None:
    deadline = time.monotonic() + _DEATH_WAIT_S
    while _alive(pid):
        if time.monotonic() >= deadline:
            log.warning(
                "lock %r: child %d of task %s still alive after %.0fs; its lease is left to lapse",
                lock.name,
                pid,
                task_id,
                _DEATH_WAIT_S,
            )
            return
        time.sleep(0.005)
    try:
        released = lock.release_where(task_id=task_id, host=_HOST, pid=str(pid))
    except Exception as exc:
        log.warning(
            "lock %r: could not release the lease of dead child %d: %s", lock.name, pid, exc
        )
        return
    if released:
        log.info("lock %r released: child %d running task %s died", lock.name, pid, task_id)
