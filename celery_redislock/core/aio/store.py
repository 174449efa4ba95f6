"""Where an :class:`~.lock.AsyncLock` keeps its leases: one Redis server (plain, Sentinel's
``master_for``, or a Cluster) through redis-py's asyncio client, each script call the one
:class:`~celery_redislock.core.server_store.ServerStore` makes (the fast path where the namespace's
layout allows it), with the same keys, arguments and replies
(:mod:`celery_redislock.core.protocol`)."""

from __future__ import annotations

from typing import Any

import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from ..holders import LiveHolders, holders_of
from ..layout import lean_allowed_async
from ..protocol import (
    AcquireReply,
    HoldersReply,
    ReleaseArgs,
    ReleaseReply,
    ReleaseWhereReply,
    RenewArgs,
    RenewReply,
)
from ..scripts import run_async
from ..store import LockView

__all__ = ["AsyncClient", "AsyncServerStore"]

AsyncClient = redis.asyncio.Redis | RedisCluster


class AsyncServerStore:
    """A lock's leases on one Redis server, reached by ``client`` (redis-py's asyncio client).
    Acquires and renewals wait for no replica (``min_replicas`` is the synchronous lock's)."""

    __slots__ = ("client",)
    replicas = None
    queues = True

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    def drift(self, ttl: float) -> float:
        return 0.0

    def max_block(self) -> float:
        if isinstance(self.client, redis.asyncio.Redis):
            socket_timeout = self.client.connection_pool.connection_kwargs.get("socket_timeout")
            if socket_timeout:
                # A blocking pop must return before the client's own read timeout fires.
                return float(socket_timeout) / 2
        return float("inf")

    async def _lean(self, lock: LockView, args: list[str], size: int) -> list[bytes] | None:
        """As the synchronous store's: the fast path's KEYS if this call may take it."""
        keys = lock.lean_keys
        if keys is None or len(args) != size or (size == 6 and args[5]):
            return None
        return keys if await lean_allowed_async(self.client, lock.namespace) else None

    async def acquire(self, lock: LockView, args: list[str]) -> AcquireReply:
        lean = await self._lean(lock, args, 6)
        if lean is not None:  # (the meta key alone: a refusal pushes no wake-up)
            raw = await run_async("lean_acquire", self.client, lean[:1], args)
            if raw != b"9" and raw != "9":
                return AcquireReply.decode(raw)
        return AcquireReply.decode(await run_async("acquire", self.client, lock.encoded_keys, args))

    async def abandon(self, lock: LockView, token: str) -> None:
        # The token is the request id: sent twice, the give-back counts once. The general path
        # finds a lease the fast path made too (promote in lua/_lock.lua).
        args = ReleaseArgs(token=token, spec=lock.spec, whole=True, request=token).encode()
        await run_async("release", self.client, lock.encoded_keys, args)

    async def await_push(self, lock: LockView, key: str, seconds: float, tries: int) -> Any | None:
        popped = await self.client.blpop([key], timeout=seconds)
        return popped[1] if popped else None

    async def claim(self, lock: LockView, token: str) -> int:
        return await self.renew(lock, token, lock.ttl_ms)

    async def renew(self, lock: LockView, token: str, ttl_ms: int) -> int:
        """Extends the lease ``token`` to ``ttl_ms`` from now (never shortening it): its expiry
        in server ms, 0 if it was lost."""
        args = RenewArgs(ttl_ms=ttl_ms, tokens=[token]).encode()
        raw = await run_async("renew", self.client, lock.encoded_keys[:2], args)
        return RenewReply.decode(raw).expiries[0]

    async def release(self, lock: LockView, args: list[str]) -> ReleaseReply:
        lean = await self._lean(lock, args, 4)
        if lean is not None:
            raw = await run_async("lean_release", self.client, lean, args)
            if raw != b"9" and raw != "9":
                return ReleaseReply.decode(raw)
        return ReleaseReply.decode(await run_async("release", self.client, lock.encoded_keys, args))

    async def release_where(self, lock: LockView, args: list[str]) -> ReleaseWhereReply:
        raw = await run_async("release_where", self.client, lock.encoded_keys, args)
        return ReleaseWhereReply.decode(raw)

    async def finish(self, lock: LockView, args: list[str]) -> None:
        await run_async("finish", self.client, lock.encoded_keys, args)

    async def holders(self, lock: LockView) -> LiveHolders:
        keys = [lock.keys.leases, lock.keys.meta]
        reply = HoldersReply.decode(await run_async("holders", self.client, keys, []))
        return LiveHolders(holders_of(reply), reply.now_ms)

    async def run(self, name: str, keys: list[Any], args: list[str]) -> Any:
        """Script ``name`` on this server."""
        return await run_async(name, self.client, keys, args)
