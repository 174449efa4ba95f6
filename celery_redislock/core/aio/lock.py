"""The lock on redis-py's asyncio client: :class:`AsyncLock` runs the synchronous lock's own
decisions (:class:`~celery_redislock.core.lock_base.LockBase`: its settings, the acquire loop
as steps, what a release sends) over :class:`~.store.AsyncServerStore`, so a web handler and a
Celery task exclude each other on one key; :class:`AsyncLease` renews itself in an asyncio task
while it is held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from ...errors import LockBackendError, LockConfigError, LockLost, RedisLockError
from ..durations import TTL, seconds
from ..handover import is_line_token, lapse_args, lapse_failed
from ..holders import LiveHolders
from ..keys import DEFAULT_NAMESPACE, check_name
from ..lock_base import (
    DEFAULT_FENCE_KEEP,
    AwaitPush,
    ClaimGrant,
    LeaseBase,
    LockBase,
    LockExtras,
    TryAcquire,
    check_pause,
)
from ..protocol import AcquireArgs, Grant, LimitsReply, Mode
from ..store import Holder, backend_error, backend_errors
from .store import AsyncClient, AsyncServerStore

__all__ = ["AsyncLease", "AsyncLock", "OnLost"]

log = logging.getLogger(__name__)

OnLost = Callable[["AsyncLease", BaseException | None], object]
"""Called when a kept-alive lease is found lost, or lapses before it could be renewed (the
error then says why)."""


class AsyncLock(LockBase[AsyncServerStore, "AsyncLease"]):
    """:class:`~celery_redislock.Lock` for asyncio code: the same lock (keys, scripts, modes,
    caps, fences, fair lines, pauses) on a ``redis.asyncio.Redis`` (also from Sentinel's
    ``master_for``) or ``redis.asyncio.RedisCluster``. A lease taken here excludes one taken by
    a Celery task or an RQ job on the same name, and the other way round.

    ``async with lock.hold(timeout=5) as lease`` takes a lease, renews it every ttl/3 in an
    asyncio task while the block runs, and gives it back however the block ends.

    >>> lock = AsyncLock(redis.asyncio.Redis(), "nightly-report", ttl=30)  # doctest: +SKIP
    >>> async with lock.hold(timeout=5) as lease:                           # doctest: +SKIP
    ...     await write(data, fence=lease.fence)
    """

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        *,
        ttl: float,
        mode: Mode = "write",
        limit: int | None = None,
        fair: bool = False,
        namespace: str = DEFAULT_NAMESPACE,
        fence_keep: float = DEFAULT_FENCE_KEEP,
    ) -> None:
        name = check_name(name)
        if not isinstance(client, redis.asyncio.Redis | RedisCluster):
            hint = " (a redis.Redis goes to Lock)" if isinstance(client, redis.Redis) else ""
            raise LockConfigError(
                "client must be a redis.asyncio.Redis or redis.asyncio.RedisCluster, got "
                f"{type(client).__name__}{hint}",
                name=name,
            )
        more = LockExtras(namespace=namespace, fence_keep=fence_keep)
        store = AsyncServerStore(client)
        super().__init__(store, name, ttl=ttl, mode=mode, limit=limit, fair=fair, more=more)
        self.client = client

    def new_lease(
        self, token: str, fence: int, mode: Mode, owner: str | None, expiry_ms: int, valid: float
    ) -> AsyncLease:
        return AsyncLease(self, token, fence, mode, owner, expiry_ms, valid)

    # -- acquiring ---------------------------------------------------------------------------

    async def acquire(
        self,
        blocking: bool = True,
        timeout: float | None = None,
        *,
        owner: str | None = None,
        info: Mapping[str, object] | None = None,
        reentrant: bool = True,
        job: str | None = None,
    ) -> AsyncLease:
        """Takes a lease and returns it, as :meth:`Lock.acquire <celery_redislock.Lock.acquire>`
        does (same arguments and errors); waiting never blocks the event loop. The lease is not
        renewed unless kept alive (:meth:`AsyncLease.keep_alive`, or :meth:`hold`).

        Cancelled while a call is on its way (a client gone, ``asyncio.timeout``), it drops the
        lease that call may have made, in a task of its own; with Redis unreachable, that lease
        lapses within ``ttl``.
        """
        request = self.acquire_request(blocking, timeout, owner, info, reentrant, job)
        try:
            return await self._acquire(request, blocking, timeout)
        except LockBackendError:
            await self._abandon(request)
            raise
        except asyncio.CancelledError:
            _in_background(self._abandon(request, leave_line=True))
            raise

    async def _acquire(
        self, request: AcquireArgs, blocking: bool, timeout: float | None
    ) -> AsyncLease:
        """Runs :meth:`acquire_steps` on the store."""
        steps = self.acquire_steps(request, blocking, timeout)
        store = self.store
        step = next(steps)
        try:
            while True:
                try:
                    if type(step) is TryAcquire:
                        reply = await store.acquire(self, step.args)
                        await self._notify(reply.granted)
                        step = steps.send(reply)
                    elif type(step) is AwaitPush:
                        popped = await store.await_push(self, step.key, step.seconds, step.tries)
                        step = steps.send(popped)
                    elif isinstance(step, ClaimGrant):
                        step = steps.send(await store.claim(self, step.token))
                except redis.RedisError as exc:
                    raise backend_error(self.name, exc) from exc
        except StopIteration as done:
            lease: AsyncLease = done.value
            return lease

    async def _abandon(self, request: AcquireArgs, leave_line: bool = False) -> None:
        try:
            if leave_line and request.wait:
                # A cancelled waiter leaves the line at once, as a waiter whose time ran out
                # does: by a last try that no longer waits (whatever it was handed, it passes
                # on, or takes and gives back below).
                reply = await self.store.acquire(self, request._replace(wait=False).encode())
                await self._notify(reply.granted)
            await self.store.abandon(self, request.token)
        except redis.RedisError as exc:
            log.warning(
                "lock %r: could not drop the lease a failed acquire may have made (it lapses "
                "within %ss): %s",
                self.name,
                self.ttl,
                exc,
            )

    async def _notify(self, granted: Sequence[Grant]) -> None:
        """Wakes the fair waiters a script handed the lock to; the parked tasks it handed the
        lock to are passed on (this lock publishes no task: a worker's sweeper does)."""
        if not granted:
            return
        parked = [g for g in granted if is_line_token(g.token)]
        if parked:
            try:
                await self.store.run("line_lapse", self.encoded_keys, lapse_args(parked))
            except redis.RedisError as exc:
                lapse_failed(self, parked, exc)
        notify = self.notify_args(granted)
        if notify is not None:
            await self.store.run("notify", notify[0], notify[1])

    @contextlib.asynccontextmanager
    async def hold(
        self,
        blocking: bool = True,
        timeout: float | None = None,
        *,
        owner: str | None = None,
        info: Mapping[str, object] | None = None,
        on_lost: OnLost | None = None,
    ) -> AsyncIterator[AsyncLease]:
        """Takes a lease (see :meth:`acquire`), keeps it alive while the block runs (every
        ttl/3; ``on_lost`` is called if it is lost meanwhile, and ``lease.check()`` raises
        :class:`~celery_redislock.LockLost`), and gives it back as the block ends, however.

        >>> async with lock.hold(timeout=5, info={"request": "r-17"}) as lease:  # doctest: +SKIP
        ...     ...
        """
        lease = await self.acquire(blocking, timeout, owner=owner, info=info)
        lease.keep_alive(on_lost)
        async with lease:
            yield lease

    # -- releasing ---------------------------------------------------------------------------

    async def release(
        self, lease: AsyncLease, *, finish_job: str | None = None, keep: float | None = None
    ) -> None:
        """Releases ``lease`` (one re-entry level); see :meth:`AsyncLease.release`."""
        args = self.release_args(lease, finish_job, keep)
        try:
            reply = await self.store.release(self, args)
            await self._notify(reply.granted)
        except redis.RedisError as exc:
            raise backend_error(self.name, exc) from exc
        self.released(lease, reply)

    async def release_where(self, **match: object) -> list[str]:
        """Releases every lease whose recorded info matches all of ``match`` (see
        :meth:`Lock.release_where <celery_redislock.Lock.release_where>`)."""
        return await self._release_where(self.release_where_args(match))

    async def release_tokens(self, tokens: Sequence[str]) -> list[str]:
        """Releases the leases ``tokens`` whatever their re-entry counts (an operator's
        release); the tokens of those that were live."""
        args = self.release_tokens_args(tokens)
        return [] if args is None else await self._release_where(args)

    async def _release_where(self, args: list[str]) -> list[str]:
        with backend_errors(self.name):
            reply = await self.store.release_where(self, args)
            await self._notify(reply.granted)
        return list(reply.released)

    async def finish_job(self, job: str, keep: float) -> None:
        """Records ``job`` as finished for ``keep`` seconds (see
        :meth:`Lock.finish_job <celery_redislock.Lock.finish_job>`)."""
        with backend_errors(self.name):
            await self.store.finish(self, self.finish_args(job, keep).encode())

    # -- pausing and inspecting ----------------------------------------------------------------

    async def pause(self, seconds: float) -> float:
        """Hands out no new lease of this name for ``seconds``, on any worker (see
        :meth:`Lock.pause <celery_redislock.Lock.pause>`); the seconds the pause has left."""
        return await self._limits("p", str(check_pause(seconds, self.name)))

    async def paused_for(self) -> float:
        """Seconds left of this lock's pause (0: not paused)."""
        return await self._limits("r")

    async def _limits(self, *args: str) -> float:
        with backend_errors(self.name):
            raw = await self.store.run("limits", self.encoded_keys, list(args))
        return LimitsReply.decode(raw).lock_paused_for

    async def holders(self) -> list[Holder]:
        """The live leases of this lock's name, oldest fence first."""
        return (await self.live_holders()).holders

    async def live_holders(self) -> LiveHolders:
        """The live leases and the server's clock as they were read."""
        with backend_errors(self.name):
            return await self.store.holders(self)

    async def locked(self) -> bool:
        """Whether any live lease exists on this lock's name."""
        return bool(await self.holders())


# Tasks started in the background (a give-back after a cancel): kept until done, or the event
# loop could collect them half-way.
_BACKGROUND: set[asyncio.Task[Any]] = set()


def _in_background(work: Any) -> None:
    task = asyncio.ensure_future(work)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


@dataclass(eq=False)
class AsyncLease(LeaseBase[AsyncLock]):
    """A lease held through an :class:`AsyncLock`. ``async with lease`` keeps it alive while
    the block runs and gives it back at its end.

    >>> lease = await lock.acquire(timeout=5)   # doctest: +SKIP
    >>> async with lease:                       # doctest: +SKIP
    ...     await store.write(data, fence=lease.fence)
    """

    _keeper: asyncio.Task[None] | None = field(default=None, repr=False)

    async def release(self, *, finish_job: str | None = None, keep: float | None = None) -> None:
        """Gives the lease back (one level, if the owner re-entered), with ``finish_job``
        recorded as finished for ``keep`` seconds in the same step; stops its renewal once it
        is gone. Raises :class:`~celery_redislock.LockNotOwned` if it was not held any more."""
        try:
            await self.lock.release(self, finish_job=finish_job, keep=keep)
        finally:
            if self.released:
                await self._stop()

    async def renew(self, ttl: float | None = None) -> None:
        """Extends the lease to ``ttl`` seconds from now (the lock's ttl by default), never
        shortening it; :class:`~celery_redislock.LockLost` if it had lapsed or was removed."""
        ttl = self.lock.ttl if ttl is None else seconds(ttl, TTL, "ttl", name=self.name)
        sent = time.monotonic()
        with backend_errors(self.name):
            expiry = await self.lock.store.renew(self.lock, self.token, max(1, round(ttl * 1000)))
        if not expiry:
            self.lost = True
            raise self._lost()
        self.expires_at_ms = expiry
        self.valid_until = sent + ttl

    async def pause(self, seconds: float) -> float:
        """Pauses this lease's lock (see :meth:`AsyncLock.pause`); this lease goes on."""
        return await self.lock.pause(seconds)

    def keep_alive(self, on_lost: OnLost | None = None) -> asyncio.Task[None]:
        """Renews the lease every ttl/3 in an asyncio task of the running loop until it is
        released (or found lost: it is marked ``lost``, a warning logged, and ``on_lost``
        called). A failed renewal is tried again within 0.5 s while the lease is valid.
        Returns the task (the same one if it runs already)."""
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(
                self._keep(on_lost), name=f"redislock keep-alive {self.name}"
            )
        return self._keeper

    async def _keep(self, on_lost: OnLost | None) -> None:
        interval = self.lock.ttl / 3
        error: BaseException | None = None
        while not self.released:
            await asyncio.sleep(interval if error is None else min(interval, 0.5))
            if self.released:
                return
            try:
                await self.renew()
                error = None
                continue
            except LockLost as lost:
                error = lost
            except LockBackendError as failed:
                error = failed
                if time.monotonic() < self.valid_until:
                    continue  # still held for a while: try again soon
                self.lost = True
            log.warning("lock %r: lease %s was lost: %s", self.name, self.token, error)
            if on_lost is not None:
                on_lost(self, error)
            return

    async def _stop(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None and keeper is not asyncio.current_task():
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper

    async def __aenter__(self) -> AsyncLease:
        self.keep_alive()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # As the synchronous lease: a failed release raises on a clean exit, but never hides
        # the exception the block raised (it is logged instead).
        try:
            if not self.released:
                await self.release()
        except RedisLockError as error:
            if exc is None:
                raise
            log.warning(
                "lock %r: release after the block raised %r failed: %s", self.name, exc, error
            )
        finally:
            await self._stop()
