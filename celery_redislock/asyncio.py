"""The lock core for asyncio code, on redis-py's asyncio client: web handlers (FastAPI, aiohttp,
Starlette) that hold or inspect the same locks as Celery tasks and RQ jobs. The scripts, keys
and replies are the synchronous core's (:mod:`celery_redislock.core.aio`).

>>> import redis.asyncio                                                 # doctest: +SKIP
>>> from celery_redislock.asyncio import AsyncLock                       # doctest: +SKIP
>>> lock = AsyncLock(redis.asyncio.Redis(), "report:42", ttl=30)        # doctest: +SKIP
>>> async with lock.hold(timeout=5) as lease:                           # doctest: +SKIP
...     await save(report, fence=lease.fence)
"""

from __future__ import annotations

from .core.aio import (
    AsyncLease,
    AsyncLock,
    AsyncRateLimit,
    claim,
    claim_state,
    release_claim,
    reserve_all,
)

__all__ = [
    "AsyncLease",
    "AsyncLock",
    "AsyncRateLimit",
    "claim",
    "claim_state",
    "release_claim",
    "reserve_all",
]
