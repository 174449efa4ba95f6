"""The lock core on redis-py's asyncio client, for web code (FastAPI, aiohttp, Starlette) that
holds or inspects the locks Celery tasks and RQ jobs hold: :class:`AsyncLock` and
:class:`AsyncLease`, and unique claims and rate limits (:mod:`.claims`, :mod:`.rate`). The
scripts, keys, arguments and replies are the synchronous core's; only the calls are awaited.

>>> from celery_redislock.asyncio import AsyncLock                      # doctest: +SKIP
>>> lock = AsyncLock(redis.asyncio.Redis(), "report:42", ttl=30)       # doctest: +SKIP
>>> async with lock.hold(timeout=5) as lease:                          # doctest: +SKIP
...     ...
"""

from __future__ import annotations

from .claims import claim, claim_state, release_claim
from .lock import AsyncLease, AsyncLock, OnLost
from .rate import AsyncRateLimit, reserve_all
from .store import AsyncClient, AsyncServerStore

__all__ = [
    "AsyncClient",
    "AsyncLease",
    "AsyncLock",
    "AsyncRateLimit",
    "AsyncServerStore",
    "OnLost",
    "claim",
    "claim_state",
    "release_claim",
    "reserve_all",
]
