"""Redis leases for Celery and RQ tasks: mutexes, caps of N holders and read/write locks,
kept alive by a per-process heartbeat and released however a task ends.

The core (this module's eager names) needs redis-py only. The Celery names (``LockedTask``,
``install``, ``lock_for``, ...) load :mod:`celery_redislock.integrations.celery` on first use,
so ``task_cls="celery_redislock:LockedTask"`` works and a core user never imports Celery.

>>> import redis, celery_redislock                                        # doctest: +SKIP
>>> lock = celery_redislock.Lock(redis.Redis(), "nightly-report", ttl=30)  # doctest: +SKIP
>>> with lock.acquire(timeout=5) as lease:                                 # doctest: +SKIP
...     ...
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__
from .core.admin import iter_locks
from .core.heartbeat import Heartbeat
from .core.lease import Holder, Lease, Mode, RenewReport, renew_leases
from .core.lock import Lock
from .core.options import LockOptions
from .core.unique_options import UniqueOptions
from .errors import (
    DuplicateTask,
    JobFinished,
    LineFull,
    LockBackendError,
    LockConfigError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    LockUpgradeError,
    RedisLockError,
)

if TYPE_CHECKING:
    from .integrations.celery import (
        SKIPPED,
        LockedTask,
        LockRequest,
        client_for,
        install,
        lock_acquired,
        lock_backend_error,
        lock_conflict,
        lock_for,
        lock_lost,
        lock_released,
    )

__all__ = [
    "SKIPPED",
    "DuplicateTask",
    "Heartbeat",
    "Holder",
    "JobFinished",
    "Lease",
    "LineFull",
    "Lock",
    "LockBackendError",
    "LockConfigError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "LockOptions",
    "LockRequest",
    "LockUpgradeError",
    "LockedTask",
    "Mode",
    "RedisLockError",
    "RenewReport",
    "UniqueOptions",
    "client_for",
    "install",
    "iter_locks",
    "lock_acquired",
    "lock_backend_error",
    "lock_conflict",
    "lock_for",
    "lock_lost",
    "lock_released",
    "renew_leases",
]

_CELERY_NAMES = frozenset(
    {
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
    }
)


def __getattr__(name: str) -> Any:
    # PEP 562: the Celery names are loaded on first use, never by `import celery_redislock`.
    if name not in _CELERY_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        celery_integration = importlib.import_module(".integrations.celery", __name__)
    except ModuleNotFoundError as exc:
        if exc.name not in ("celery", "kombu", "billiard"):
            raise
        raise ImportError(
            f"celery_redislock.{name} needs Celery, which is not installed: "
            'pip install "celery-redislock[celery]"',
            name=exc.name,
        ) from exc
    value = getattr(celery_integration, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | _CELERY_NAMES)
