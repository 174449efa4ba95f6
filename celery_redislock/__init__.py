"""Redis leases for Celery and RQ tasks: mutexes, caps of N holders and read/write locks,
kept alive by a per-process heartbeat and released however a task ends.

Here: the lock core (it needs redis-py only), the exceptions, and Celery's entry points
(``LockedTask``, ``install``, ``lock_for``, ``lock_workflow``, ``SKIPPED``, ``LeaderScheduler``),
which load :mod:`celery_redislock.integrations.celery` on first use, so a core user never
imports Celery.
docs/api.md lists the other public modules; every other module is internal and may change.
Names that earlier releases exported here (Celery's signals, ``LockRequest``, ``client_for``,
``iter_locks``, ``LockOptions``, ``UniqueOptions``) still resolve, outside ``__all__``.

>>> import redis, celery_redislock                                        # doctest: +SKIP
>>> lock = celery_redislock.Lock(redis.Redis(), "nightly-report", ttl=30)  # doctest: +SKIP
>>> with lock.acquire(timeout=5) as lease:                                 # doctest: +SKIP
...     ...
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__
from .core.clients import sentinel_client
from .core.heartbeat import Heartbeat
from .core.lease import Holder, Lease, Mode, RenewReport, renew_leases
from .core.lock import Lock
from .core.lock_set import acquire_all
from .core.rate import RateLimit, reserve_all
from .core.redlock import RedLock
from .core.redlock_masters import master_clients
from .core.replicas import require_replicas
from .core.run.current import RateSlot, current_lease, current_rate
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
    TaskSkipped,
)

if TYPE_CHECKING:
    from .core.admin import iter_locks as iter_locks
    from .core.options import LockOptions as LockOptions
    from .core.unique_options import UniqueOptions as UniqueOptions
    from .integrations.celery import (
        SKIPPED,
        LeaderScheduler,
        LockedTask,
        install,
        lock_for,
        lock_workflow,
    )
    from .integrations.celery import LockRequest as LockRequest
    from .integrations.celery import client_for as client_for
    from .integrations.celery import lock_acquired as lock_acquired
    from .integrations.celery import lock_backend_error as lock_backend_error
    from .integrations.celery import lock_conflict as lock_conflict
    from .integrations.celery import lock_lost as lock_lost
    from .integrations.celery import lock_released as lock_released

__all__ = [  # noqa: RUF022 (in groups: the docs list them in this order)
    # the lock core
    "Lock",
    "Lease",
    "Holder",
    "Mode",
    "Heartbeat",
    "acquire_all",
    "renew_leases",
    "RenewReport",
    "RedLock",
    "master_clients",
    "sentinel_client",
    "require_replicas",
    "RateLimit",
    "reserve_all",
    "current_rate",
    "current_lease",
    "RateSlot",
    # the exceptions
    "RedisLockError",
    "LockNotAcquired",
    "LockNotOwned",
    "LockLost",
    "LockUpgradeError",
    "LockBackendError",
    "LockConfigError",
    "DuplicateTask",
    "JobFinished",
    "LineFull",
    "TaskSkipped",
    # Celery, loaded on first use
    "LockedTask",
    "install",
    "lock_for",
    "lock_workflow",
    "SKIPPED",
    "LeaderScheduler",
]

_CELERY = ".integrations.celery"
# Loaded on first use (PEP 562; why: the docstring): name -> the module that has it.
_ELSEWHERE = {
    "LockedTask": _CELERY,
    "install": _CELERY,
    "lock_for": _CELERY,
    "lock_workflow": _CELERY,
    "SKIPPED": _CELERY,
    "LeaderScheduler": _CELERY,
    "LockRequest": _CELERY,
    "client_for": _CELERY,
    "lock_acquired": _CELERY,
    "lock_backend_error": _CELERY,
    "lock_conflict": _CELERY,
    "lock_lost": _CELERY,
    "lock_released": _CELERY,
    "iter_locks": ".core.admin",
    "LockOptions": ".core.options",
    "UniqueOptions": ".core.unique_options",
}


def __getattr__(name: str) -> Any:
    where = _ELSEWHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(where, __name__)
    except ModuleNotFoundError as exc:
        if exc.name not in ("celery", "kombu", "billiard"):
            raise
        raise ImportError(
            f"celery_redislock.{name} needs Celery, which is not installed: "
            'pip install "celery-redislock[celery]"',
            name=exc.name,
        ) from exc
    value = getattr(module, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ELSEWHERE))
