"""The fork guard: a fork of this process waits while one of our background threads (the child
watch, the task lines' sweeper) is inside a call to Redis or the broker, so that no forked child
inherits a connection pool's lock taken by a thread that does not exist in it.

A worker's main process forks (a Celery pool child, an RQ work horse) while those threads hand
locks on: redis-py (8) takes its pool's lock as it resets the pool in the child, and Celery's
and kombu's pools take theirs as they close what the parent left; a lock taken at the fork stays
taken there for ever, and the child hangs at its first call (Celery kills a child that does not
report ready within 4 s). A fork waits for what such a thread is doing: one dead child's
release and hand-over, one lock's sweep, one debounced call's publish; each call to Redis is
bounded by its socket timeout (5 s for our lock clients), a publish by the broker's connection
timeout and the framework's publish retries. The fork (and so the thread that forks, a Celery
worker's event loop or an RQ worker's main loop) waits that long at most, while Redis or the
broker does not answer.

Not guarded: the heartbeat and RedLock's call threads. They run where locked tasks run (pool
children, work horses, a solo or threads pool), and those processes fork no children. (A
RedLock release made by the child watch runs on call threads: the watch waits for them under the
guard until a quorum answered; a call to a slower master may still be under way at a fork.)
A thread must never wait, while holding the guard, for a thread that forks."""

from __future__ import annotations

# Imported first, for their fork hooks: the hooks registered last run first before a fork, so
# the guard is taken before the locks these take for the fork (logging's, and the one a thread
# pool's submit takes), and a thread holding the guard may still log or submit while the fork
# waits for it.
import concurrent.futures.thread  # noqa: F401
import logging  # noqa: F401
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["FORK_GUARD", "ForkGuard"]


class ForkGuard:
    """Held by a background thread around each call to Redis or the broker; taken by a fork
    before it happens, released after it (in the parent), made anew in the child. Reentrant: a
    thread that holds it may fork, or take it again.

    >>> with FORK_GUARD.held():
    ...     pass  # a call no fork of this process may cut in two
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Holds the guard: a fork waits until the block ends."""
        lock = self._lock  # (the one released at the end, even in a child forked meanwhile)
        with lock:
            yield

    def _before_fork(self) -> None:
        self._lock.acquire()

    def _after_fork_in_parent(self) -> None:
        self._lock.release()

    def _after_fork_in_child(self) -> None:
        # The parent's threads do not exist here: none will release what they held.
        self._lock = threading.RLock()


FORK_GUARD = ForkGuard()
"""The process's fork guard."""
os.register_at_fork(
    before=FORK_GUARD._before_fork,
    after_in_parent=FORK_GUARD._after_fork_in_parent,
    after_in_child=FORK_GUARD._after_fork_in_child,
)
