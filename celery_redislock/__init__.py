"""Redis leases for Celery and RQ tasks: mutexes, caps of N holders and read/write locks,
kept alive by a per-process renewer and released however a task ends.

>>> import redis, celery_redislock                                        # doctest: +SKIP
>>> lock = celery_redislock.Lock(redis.Redis(), "nightly-report", ttl=30)  # doctest: +SKIP
>>> with lock.acquire(timeout=5) as lease:                                 # doctest: +SKIP
...     ...
"""

from .errors import (
    DuplicateTask,
    JobFinished,
    LockBackendError,
    LockConfigError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    LockUpgradeError,
    RedisLockError,
)
from .inspection import iter_locks
from .lock import Holder, Lease, Lock, Mode
from .renewal import Renewer, RenewReport, renew_leases
from .tasklock import (
    SKIPPED,
    LockedTask,
    LockOptions,
    LockRequest,
    UniqueOptions,
    client_for,
    install,
    lock_conflict,
    lock_for,
    lock_lost,
)

__all__ = [
    "SKIPPED",
    "DuplicateTask",
    "Holder",
    "JobFinished",
    "Lease",
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
    "Renewer",
    "UniqueOptions",
    "client_for",
    "install",
    "iter_locks",
    "lock_conflict",
    "lock_for",
    "lock_lost",
    "renew_leases",
]

__version__ = "0.1.0"
