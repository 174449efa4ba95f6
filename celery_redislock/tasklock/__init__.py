"""Lock options for Celery tasks: the task base class, its settings, signals and helpers."""

from .install import install
from .options import LockOptions
from .request import LockRequest
from .runtime import SKIPPED, lock_for
from .settings import client_for
from .signals import lock_conflict, lock_lost
from .task import LockedTask

__all__ = [
    "SKIPPED",
    "LockOptions",
    "LockRequest",
    "LockedTask",
    "client_for",
    "install",
    "lock_conflict",
    "lock_for",
    "lock_lost",
]
