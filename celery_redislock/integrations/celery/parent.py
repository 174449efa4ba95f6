"""The worker parent's side: release what a pool child held as soon as the child is gone."""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any

from billiard.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery.worker import state as worker_state
from celery.worker.request import Request

from ...core.childwatch import ChildWatch
from ...core.run.dead import release_dead
from .run import locks_for
from .settings import client_for

__all__ = ["LockRequest", "watched_tasks"]

log = logging.getLogger(__name__)

_CHILD_DEATHS = (Terminated, TimeLimitExceeded, WorkerLostError, SystemExit, KeyboardInterrupt)


class _Parent:
    """What this worker's parent process keeps: its child watch, and the apps whose lock
    client exists here (made before the watch thread needs it: fork safety)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.watch = ChildWatch()
        self.prepared: weakref.WeakSet[Any] = weakref.WeakSet()


_PARENT = _Parent()
# A forked process (a pool child) is no parent of the children it did not fork.
os.register_at_fork(after_in_child=_PARENT.reset)


def watched_tasks() -> list[str]:
    """Ids of the locked tasks whose pool children this worker's parent watches now (a worker's
    remote-control command can report it; a task whose child ended normally leaves the list).

    >>> watched_tasks()  # in a process that runs no pool
    []
    """
    return _PARENT.watch.watching()


class LockRequest(Request):  # type: ignore[misc]
    """Celery's request with one addition, run in the worker's parent process: while a pool
    child runs a locked task the parent watches it, and if the child dies (hard time limit,
    ``revoke(terminate=True)``, SIGKILL, OOM) the lease it held is released at once.

    Subclass it (and set ``Request`` on your task class) if you need a request class of your own.
    """

    # Set once Celery reports the child dead or being killed: the watch then keeps the request
    # until the child is gone, though Celery has finished with it.
    child_dying = False

    def on_accepted(self, pid: int, time_accepted: float) -> None:
        super().on_accepted(pid, time_accepted)
        if getattr(self.task, "lock_options", None) is not None and pid != os.getpid():
            if self.task.app not in _PARENT.prepared:
                client_for(self.task.app)  # made here, not in the watch thread (fork safety)
                _PARENT.prepared.add(self.task.app)
            _PARENT.watch.watch(
                self.id, pid, self
            )  # (solo and threads pools have no child to watch)

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

    def done(self) -> bool:
        """The child watcher's question: finished, with the child alive (it released itself)."""
        return not self.child_dying and self not in worker_state.active_requests

    def child_died(self, pid: int) -> None:
        """Releases the leases the dead child ``pid`` took for this task (matched by task id,
        host and pid: never a lease of another delivery or another process)."""
        release_dead(
            lambda: locks_for(self.task, self.args, self.kwargs),
            f"task {self.name}[{self.id}]",
            self.id,
            pid,
            "child",
        )
