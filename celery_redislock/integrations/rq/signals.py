"""Signals sent by locked RQ jobs, with the Celery side's names and arguments (``sender`` is
the job's function name; ``task_id`` the job id).

>>> from celery_redislock.integrations.rq import lock_conflict
>>> @lock_conflict.connect                                  # doctest: +SKIP
... def on_conflict(sender, task_id, lock, action, holders, **kw):
...     metrics.incr(f"lock_conflict.{action}")
"""

from __future__ import annotations

from ...core.signal import Signal

__all__ = ["lock_acquired", "lock_backend_error", "lock_conflict", "lock_lost", "lock_released"]

lock_acquired = Signal("lock_acquired")
"""A job took its lease: ``task_id``, ``lock`` (name), ``lease``, ``waited`` (seconds; for a
job from a task line, since it first parked)."""

lock_released = Signal("lock_released")
"""A job gave its lease back as it ended: ``task_id``, ``lock``, ``lease``, ``held`` (seconds).
Not sent for a lease that was lost, nor when ``LockWorker``'s parent frees a killed horse's
lease."""

lock_conflict = Signal("lock_conflict")
"""A job found its lock held (``action``: skip, retry, wait, raise, queue; ``expired`` and
``full`` for the task line; ``await`` and ``drop`` for a copy of a job whose first run holds or
finished it; ``superseded``), or an enqueue found a
unique job's key held (``existing``, ``raise``, ``replace``): ``task_id``, ``lock``, ``action``,
``holders`` (job ids)."""

lock_lost = Signal("lock_lost")
"""Sent from the heartbeat thread when a running job's lease was found lost: ``task_id``,
``lease``, ``error``."""

lock_backend_error = Signal("lock_backend_error")
"""A job's lock Redis failed as it started: ``task_id``, ``lock``, ``error``, ``policy``."""
