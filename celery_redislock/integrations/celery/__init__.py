"""The Celery integration: the task base class that reads ``lock=`` and ``unique=``, its
settings, the worker parent's release of a dead child's lease, signals and helpers.

>>> from celery import Celery                                  # doctest: +SKIP
>>> from celery_redislock.integrations.celery import install   # doctest: +SKIP
>>> app = install(Celery("proj"))                              # doctest: +SKIP
"""

from .install import install
from .parent import LockRequest
from .run import SKIPPED, lock_for
from .settings import client_for
from .signals import (
    lock_acquired,
    lock_backend_error,
    lock_conflict,
    lock_lost,
    lock_released,
)
from .task import LockedTask

__all__ = [
    "SKIPPED",
    "LockRequest",
    "LockedTask",
    "client_for",
    "install",
    "lock_acquired",
    "lock_backend_error",
    "lock_conflict",
    "lock_for",
    "lock_lost",
    "lock_released",
]
