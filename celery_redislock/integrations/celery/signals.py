"""Signals sent by locked tasks (Celery's own signal class: connect as to ``task_failure``).

>>> from celery_redislock import lock_conflict
>>> @lock_conflict.connect                                  # doctest: +SKIP
... def on_conflict(sender, task_id, lock, action, holders, **kw):
...     metrics.incr(f"lock_conflict.{action}")
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = ["lock_conflict", "lock_lost"]

lock_conflict = Signal(
    name="lock_conflict",
    providing_args={"task_id", "lock", "action", "holders"},
)
"""Sent by a task that found its lock held: ``action`` is what it did (skip, retry, wait, raise);
``holders`` the task ids holding it; ``lock`` the lock's name."""

lock_lost = Signal(
    name="lock_lost",
    providing_args={"task_id", "lease", "error"},
)
"""Sent (from the heartbeat thread) when a running task's lease was found lost: removed, expired,
or not renewable before it lapsed (``error`` is then the Redis error)."""
