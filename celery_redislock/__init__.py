"""Redis leases for Celery and RQ tasks: mutexes, caps of N holders and read/write locks,
kept alive by a per-process renewer and released however a task ends.

>>> import redis, celery_redislock                                        # doctest: +SKIP
>>> lock = celery_redislock.Lock(redis.Redis(), "nightly-report", ttl=30)  # doctest: +SKIP
>>> with lock.acquire(timeout=5) as lease:                                 # doctest: +SKIP
...     ...
"""

from .errors import (
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

__all__ = [
    "Holder",
    "Lease",
    "Lock",
    "LockBackendError",
    "LockConfigError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "LockUpgradeError",
    "Mode",
    "RedisLockError",
    "RenewReport",
    "Renewer",
    "iter_locks",
    "renew_leases",
]

__version__ = "0.1.0"
