"""Lock options for Celery tasks: the task base class, its settings, signals and helpers."""

from . import revoked as _revoked  # noqa: F401  (connects its signal receivers)
from .install import install
from .options import LockOptions
from .request import LockRequest
from .runtime import SKIPPED, lock_for
from .settings import client_for
from .signals import lock_conflict, lock_lost
from .task import LockedTask
from .unique import UniqueOptions

__all__ = [
    "SKIPPED",
    "LockOptions",
    "LockRequest",
    "LockedTask",
    "UniqueOptions",
    "client_for",
    "install",
    "lock_conflict",
    "lock_for",
    "lock_lost",
]
