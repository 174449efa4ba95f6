"""Signals sent by locked tasks (Celery's own signal class: connect as to ``task_failure``);
every one has ``task_id``.

>>> from celery_redislock import lock_conflict
>>> @lock_conflict.connect                                  # doctest: +SKIP
... def on_conflict(sender, task_id, lock, action, holders, **kw):
...     metrics.incr(f"lock_conflict.{action}")
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = ["lock_acquired", "lock_backend_error", "lock_conflict", "lock_lost", "lock_released"]

lock_conflict = Signal(name="lock_conflict")
"""Sent by a task that found its lock held: ``action`` is what it did (skip, retry, wait, raise,
drop, await); ``holders`` the task ids holding it; ``lock`` the lock's name. A unique task's
duplicate sends it too: ``existing``, ``replace`` or ``raise`` as it is published (then with
``stage="publish"``), ``superseded`` as a replaced copy starts."""

lock_lost = Signal(name="lock_lost")
"""Sent (from the heartbeat thread) when a running task's ``lease`` was found lost: removed,
expired, or not renewable before it lapsed (``error`` is then the Redis error)."""

lock_acquired = Signal(name="lock_acquired")
"""Sent by a task that took its lease, before its body runs: ``lock`` the lock's name,
``lease`` the :class:`~celery_redislock.Lease` (its ``fence``, ``mode``), ``waited`` the seconds
the acquire took (waiting in line included)."""

lock_released = Signal(name="lock_released")
"""Sent by a task that gave its lease back (as its body ends, at a retry, at shutdown):
``lock``, ``lease``, ``held`` (seconds). Not sent for a lease that was lost, nor for one the
worker's parent freed after the child running the task died."""

lock_backend_error = Signal(name="lock_backend_error")
"""Sent by a task whose lease could not be taken because Redis failed: ``lock``, ``error`` the
:class:`~celery_redislock.LockBackendError`, ``policy`` what the task does about it (the
``redislock_on_backend_error`` setting: fail, retry or run)."""
