"""The Celery integration; its ``__all__`` is the public Celery API (also exported by the
top-level package), with the ``Request`` base a custom request class must derive from.

>>> from celery import Celery                                  # doctest: +SKIP
>>> from celery_redislock.integrations.celery import install   # doctest: +SKIP
>>> app = install(Celery("proj"))                              # doctest: +SKIP
"""

from .beat import LeaderScheduler
from .install import install
from .parent import LockRequest
from .run import SKIPPED, lock_for
from .settings import client_for as client_for  # plumbing, not in __all__; tests use it
from .signals import (
    lock_acquired,
    lock_backend_error,
    lock_conflict,
    lock_lost,
    lock_released,
)
from .task import LockedTask
from .workflow import lock_workflow

__all__ = [
    "SKIPPED",
    "LeaderScheduler",
    "LockRequest",
    "LockedTask",
    "install",
    "lock_acquired",
    "lock_backend_error",
    "lock_conflict",
    "lock_for",
    "lock_lost",
    "lock_released",
    "lock_workflow",
]
