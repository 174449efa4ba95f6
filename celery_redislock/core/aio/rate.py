"""Fleet-wide rate limits from asyncio code: :class:`AsyncRateLimit` is
:class:`~celery_redislock.RateLimit` (the same bucket, script, arguments and answers, built by
:class:`~celery_redislock.core.rate.RateLimitBase`) on redis-py's asyncio client, so a web
handler and the tasks spend one budget."""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from ..rate import (
    RateLimitBase,
    RateUsage,
    Reservation,
    _Answer,
    reservation_call,
    reservation_of,
)
from ..scripts import run_async
from ..store import backend_errors
from .store import AsyncClient

__all__ = ["AsyncRateLimit", "reserve_all"]


class AsyncRateLimit(RateLimitBase):
    """At most ``rate`` units across the fleet for the name ``name`` (see
    :class:`~celery_redislock.RateLimit`: the same arguments, the methods awaited).

    >>> api = AsyncRateLimit(redis.asyncio.Redis(), "partner-api", "100/m")   # doctest: +SKIP
    >>> booking = await api.reserve(request_id, max_delay=0)                  # doctest: +SKIP
    >>> if not booking.granted:                                               # doctest: +SKIP
    ...     raise HTTPException(429, headers={"Retry-After": str(ceil(booking.delay))})
    """

    _clients = (redis.asyncio.Redis, RedisCluster)
    _client_kinds = "a redis.asyncio.Redis or redis.asyncio.RedisCluster"
    client: AsyncClient

    async def _run(self, call: tuple[list[str], list[str]]) -> _Answer:
        with backend_errors(self.name, "rate limit"):
            return _Answer.read(await run_async("rate", self.client, *call))

    async def reserve(
        self,
        request_id: str,
        *,
        cost: float = 1.0,
        max_delay: float | None = None,
        max_late: float | None = None,
    ) -> Reservation:
        """Reserves the next free slot for ``request_id`` (see
        :meth:`RateLimit.reserve <celery_redislock.RateLimit.reserve>`)."""
        return await reserve_all([(self, cost)], request_id, max_delay=max_delay, max_late=max_late)

    async def settle(self, request_id: str, cost: float, *, estimate: float = 1.0) -> None:
        """Says what ``request_id`` really cost (see ``RateLimit.settle``)."""
        await self._run(self._settle_call(request_id, cost, estimate))

    async def pause(self, seconds: float) -> RateUsage:
        """Hands out no slot for ``seconds`` (see ``RateLimit.pause``)."""
        return RateUsage.of(await self._run(self._pause_call(seconds)))

    async def resume(self) -> RateUsage:
        """Ends a pause now."""
        return RateUsage.of(await self._run(self._call("q", None, "", "", "")))

    async def usage(self) -> RateUsage:
        """How the bucket stands now (reads only)."""
        return RateUsage.of(await self._run(self._call("u", None, "", "", "")))


async def reserve_all(
    limits: Sequence[tuple[AsyncRateLimit, float]],
    request_id: str,
    *,
    max_delay: float | None = None,
    max_late: float | None = None,
    near: float = 0.0,
) -> Reservation:
    """A slot in every limit of ``limits`` or in none, in one script (see
    :func:`celery_redislock.reserve_all`)."""
    keys, args, costs = reservation_call(limits, request_id, max_delay, max_late, near)
    first = limits[0][0]
    with backend_errors(first.name, "rate limit"):
        raw = await run_async("rate", first.client, keys, args)
    return reservation_of(limits, costs, raw)
