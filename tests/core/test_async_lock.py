"""The asyncio lock (celery_redislock.asyncio) on a real Redis, beside the synchronous lock on the
same server: they exclude each other on one name, share one fence sequence, hand the lock to each
other's waiters; a held lease renews itself in an asyncio task; cancellation leaves nothing
behind; and a Celery task and an asyncio handler exclude each other on one key."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from types import ModuleType
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio
from faultproxy import FaultProxy
from helpers import load_factor, stop, wait_started, wait_until_queued
from workers import Worker

from celery_redislock import (
    JobFinished,
    Lock,
    LockConfigError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    RateLimit,
    acquire_all,
)
from celery_redislock import asyncio as aio
from celery_redislock.asyncio import AsyncLease, AsyncLock
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core import admin, claims, layout
from celery_redislock.core.claims import ClaimKind
from celery_redislock.core.scripts import script

T = TypeVar("T")

# No CLIENT SETINFO on connecting (redis-py 5.0 calls it lib_name and lib_version, newer
# versions driver_info).
NO_CLIENT_INFO: dict[str, Any] = (
    {"driver_info": None}
    if importlib.util.find_spec("redis.driver_info")
    else {"lib_name": None, "lib_version": None}
)


async def until(condition: Callable[[], object], what: str, timeout: float = 30) -> None:
    """Polls ``condition`` without blocking the event loop; fails naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.005)


async def close(aclient: redis.asyncio.Redis) -> None:
    """Closes an asyncio client (``aclose`` since redis-py 5.0.1; 5.0.0, the lowest supported,
    has ``close``)."""
    await (aclient.aclose() if hasattr(aclient, "aclose") else aclient.close())


@pytest.fixture
def run(redis_server: RedisServer, client: redis.Redis) -> Iterator[Callable[..., Any]]:
    """Runs ``body(aclient)`` in a new event loop on an asyncio client of the test's Redis."""

    def runner(body: Callable[[redis.asyncio.Redis], Awaitable[T]]) -> T:
        async def main() -> T:
            aclient = redis.asyncio.Redis.from_url(redis_server.url)
            try:
                return await body(aclient)
            finally:
                await close(aclient)

        return asyncio.run(main())

    yield runner


def test_sync_and_async_leases_exclude_each_other_and_share_fences(
    client: redis.Redis, run: Callable[..., Any]
) -> None:
    sync = Lock(client, "shared", ttl=10)

    async def body(aclient: redis.asyncio.Redis) -> None:
        alock = AsyncLock(aclient, "shared", ttl=10)
        first = await alock.acquire(blocking=False)
        with pytest.raises(LockNotAcquired, match="lock 'shared' is held"):
            sync.acquire(blocking=False)
        holders = await alock.holders()
        assert [h.token for h in holders] == [first.token]
        assert holders[0].info["pid"] and await alock.locked()
        await first.release()
        assert first.released and not await alock.locked()

        second = sync.acquire(blocking=False)
        with pytest.raises(LockNotAcquired):
            await alock.acquire(blocking=False)
        assert second.fence > first.fence
        second.release()
        third = await alock.acquire(blocking=False, info={"request": "r-1"})
        assert third.fence > second.fence
        assert sync.holders()[0].info["request"] == "r-1"
        await third.release()
        with pytest.raises(LockNotOwned, match="released already"):
            await third.release()

    run(body)


def test_a_waiting_async_acquire_is_woken_by_a_sync_release(
    client: redis.Redis, run: Callable[..., Any]
) -> None:
    """Non-fair and fair: the waiter is served by the push of the release, long before the
    holder's lease would have lapsed (30 s)."""
    for fair in (False, True):
        name = f"wake-{fair}"
        sync = Lock(client, name, ttl=30, fair=fair)
        held = sync.acquire()

        async def body(aclient: redis.asyncio.Redis) -> tuple[AsyncLease, float]:
            alock = AsyncLock(aclient, name, ttl=30, fair=fair)  # noqa: B023
            waiting = asyncio.create_task(alock.acquire(timeout=20))
            await asyncio.to_thread(wait_until_queued, client, sync)  # noqa: B023
            assert not waiting.done()
            await asyncio.to_thread(held.release)  # noqa: B023
            released = time.monotonic()
            lease = await waiting
            waited = time.monotonic() - released
            await lease.release()
            return lease, waited

        lease, waited = run(body)
        assert lease.fence > held.fence
        # (a liveness bound, stretched with the machine's load)
        assert waited < 5 * load_factor(), f"fair={fair}: served {waited:.2f}s after the release"


def test_an_async_waiter_gives_up_after_its_timeout(
    client: redis.Redis, run: Callable[..., Any]
) -> None:
    held = Lock(client, "busy", ttl=30).acquire()

    async def body(aclient: redis.asyncio.Redis) -> None:
        alock = AsyncLock(aclient, "busy", ttl=30)
        with pytest.raises(LockNotAcquired, match=r"gave up after 0.3s"):
            await alock.acquire(timeout=0.3)

    run(body)
    held.release()
    assert client.zcard("redislock:{busy}:queue") == 0  # it left the line


def test_hold_keeps_the_lease_alive_past_its_ttl_and_gives_it_back(
    client: redis.Redis, run: Callable[..., Any]
) -> None:
    async def body(aclient: redis.asyncio.Redis) -> AsyncLease:
        alock = AsyncLock(aclient, "kept", ttl=1)
        async with alock.hold(timeout=1) as lease:
            await asyncio.sleep(2.5)  # 2.5 ttls: held only if renewed
            lease.check()
            assert [h.token for h in await alock.holders()] == [lease.token]
        assert lease.released and lease._keeper is None
        return lease

    lease = run(body)
    assert not Lock(client, "kept", ttl=1).holders()
    assert not lease.lost


def test_a_lease_removed_by_an_operator_is_reported_lost(
    client: redis.Redis, run: Callable[..., Any]
) -> None:
    lost: list[tuple[str, str]] = []

    async def body(aclient: redis.asyncio.Redis) -> None:
        alock = AsyncLock(aclient, "taken-away", ttl=0.6)
        lease = await alock.acquire()
        lease.keep_alive(lambda gone, error: lost.append((gone.token, type(error).__name__)))
        assert Lock(client, "taken-away", ttl=1).release_tokens([lease.token]) == [lease.token]
        await asyncio.wait_for(lease._keeper, timeout=5)  # type: ignore[arg-type]
        assert lease.lost
        with pytest.raises(LockLost):
            lease.check()
        with pytest.raises(LockNotOwned):
            await lease.release()
        assert lease._keeper is None

    run(body)
    assert len(lost) == 1 and lost[0][1] == "LockLost"


def test_a_cancelled_acquire_leaves_no_lease_and_no_place_in_line(
    client: redis.Redis, run: Callable[..., Any]
) -> None:
    sync = Lock(client, "cancelled", ttl=30)
    held = sync.acquire()

    async def body(aclient: redis.asyncio.Redis) -> None:
        alock = AsyncLock(aclient, "cancelled", ttl=30)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await alock.acquire(timeout=20)
        await asyncio.sleep(0)  # the give-back task runs
        # A web request cancelled while its acquire was answered: the give-back drops it.
        waiting = asyncio.create_task(alock.acquire(blocking=False))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises((asyncio.CancelledError, LockNotAcquired)):
            await waiting
        # The give-backs are tasks of their own: every one ends before the loop closes.
        await until(lambda: asyncio.all_tasks() == {asyncio.current_task()}, "the give-backs ended")

    run(body)
    assert [h.token for h in sync.holders()] == [held.token]
    assert client.zcard("redislock:{cancelled}:queue") == 0, "the cancelled waiter's place stayed"
    held.release()
    sync.acquire(blocking=False).release()


@pytest.mark.parametrize("layout_name", ["shared", "lean"])
def test_an_acquire_cancelled_while_its_reply_is_late_gives_its_lease_back(
    redis_server: RedisServer,
    client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
    layout_name: str,
) -> None:
    """On a free lock the acquire's script makes a lease in Redis; its reply is held back by the
    proxy and the call is cancelled meanwhile (a client gone). The give-back drops that lease at
    once: the lock is free long before its ttl (600 s), and the late reply reaches nobody (the
    cancelled call's connection is closed): the client's next calls get their own answers. In
    the lean layout the lease is made on the fast path, and the give-back (the general path)
    finds it there."""
    layout.set_layout(client, "redislock", layout_name)
    request.addfinalizer(lambda: client.delete(layout.layout_key("redislock")))
    sync = Lock(client, "late", ttl=600)
    # No NOSCRIPT round trip among the delayed replies.
    for name in ("acquire", "release", "lean_acquire", "lean_release"):
        client.script_load(script(name).script)
    errors: list[dict[str, Any]] = []

    async def body(proxy: FaultProxy) -> None:
        main = asyncio.current_task()
        asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
        # The cancel closes the call's connection, so the give-back opens one: with no
        # handshake to wait for (RESP2, no CLIENT SETINFO) its release leaves at once, and the
        # socket timeout outlasts the late replies.
        aclient = redis.asyncio.Redis.from_url(
            proxy.url, protocol=2, socket_timeout=10, **NO_CLIENT_INFO
        )
        await aclient.ping()
        # The layout is read before the delay (a process reads it at most every 30 s).
        assert await layout.lean_allowed_async(aclient, "redislock") == (layout_name == "lean")
        alock = AsyncLock(aclient, "late", ttl=600)
        proxy.delay(replies=3.0)
        acquiring = asyncio.create_task(alock.acquire(blocking=False))
        # The script ran (the lease is in Redis) and its reply is on its way.
        await until(lambda: sync.holders(), "the lease to be made")
        assert not acquiring.done(), "the reply came back before the cancel: delay it longer"
        [made] = sync.holders()
        acquiring.cancel()
        with pytest.raises(asyncio.CancelledError):
            await acquiring
        # Given back in a task of its own, whose own reply is late too: the lease is gone from
        # Redis as soon as the release runs there.
        await until(lambda: not sync.holders(), "the lease to be given back")
        assert not sync.holders()
        proxy.heal()
        # The give-back ends once its late reply is in: nothing is left running.
        await until(lambda: asyncio.all_tasks() == {main}, "the give-back to end")
        # The same client goes on: each call gets its own reply, none the cancelled call's.
        lease = await alock.acquire(blocking=False)
        assert lease.fence > made.fence and lease.token != made.token
        assert [h.token for h in await alock.holders()] == [lease.token]
        with pytest.raises(LockNotAcquired):
            sync.acquire(blocking=False)
        await lease.release()
        assert not await alock.locked()
        await close(aclient)

    with (
        FaultProxy("127.0.0.1", redis_server.port) as proxy,
        caplog.at_level(logging.WARNING, logger="celery_redislock"),
    ):
        asyncio.run(body(proxy))
    assert not errors  # no task failed unseen (a late reply read as an error)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    sync.acquire(blocking=False).release()


def test_the_rest_of_the_lock_api(client: redis.Redis, run: Callable[..., Any]) -> None:
    """Re-entry, release_where, release_tokens, finish_job, pause, renew and the read lock,
    each beside its synchronous twin."""
    sync = Lock(client, "api", ttl=10)

    async def body(aclient: redis.asyncio.Redis) -> None:
        alock = AsyncLock(aclient, "api", ttl=10)
        once = await alock.acquire(owner="me")
        again = await alock.acquire(owner="me")
        assert again.token == once.token
        await again.release()
        assert not once.released and await alock.locked()
        await once.release()
        assert once.released

        lease = await alock.acquire(info={"task_id": "t-1"})
        assert await alock.release_where(task_id="t-1") == [lease.token]
        lease = await alock.acquire()
        assert await alock.release_tokens([lease.token]) == [lease.token]
        assert await alock.release_tokens([]) == []

        lease = await alock.acquire(job="job-1")
        await lease.release(finish_job="job-1", keep=60)
        with pytest.raises(JobFinished):
            sync.acquire(blocking=False, job="job-1")
        await alock.finish_job("job-2", keep=60)
        with pytest.raises(JobFinished):
            await alock.acquire(blocking=False, job="job-2")

        lease = await alock.acquire()
        before = lease.expires_at_ms
        await lease.renew(60)
        assert lease.expires_at_ms > before + 40_000
        assert 9 < await lease.pause(10) <= 10
        assert 9 < sync.paused_for() <= 10
        await lease.release()
        with pytest.raises(LockNotAcquired):
            await alock.acquire(blocking=False)  # paused
        client.delete("redislock:{api}:limits")
        assert await alock.paused_for() == 0

        readers = AsyncLock(aclient, "rw", ttl=10, mode="read")
        both = [await readers.acquire(blocking=False) for _ in range(2)]
        with pytest.raises(LockNotAcquired):
            Lock(client, "rw", ttl=10).acquire(blocking=False)
        for reader in both:
            await reader.release()

    run(body)


def test_an_async_list_of_leases_and_a_sync_set_exclude_each_other(
    client: redis.Redis, run: Callable[..., Any]
) -> None:
    """acquire_all's leases (synchronous) block the asyncio lock on either name."""
    leases = acquire_all([Lock(client, "a", ttl=10), Lock(client, "b", ttl=10)], blocking=False)

    async def body(aclient: redis.asyncio.Redis) -> None:
        for name in ("a", "b"):
            with pytest.raises(LockNotAcquired, match=f"lock '{name}' is held"):
                await AsyncLock(aclient, name, ttl=10).acquire(blocking=False)

    run(body)
    for lease in leases:
        lease.release()


def test_bad_arguments_are_refused_before_anything_is_sent(
    client: redis.Redis, run: Callable[..., Any]
) -> None:
    with pytest.raises(LockConfigError, match=r"redis.asyncio.Redis.*a redis.Redis goes to Lock"):
        AsyncLock(client, "x", ttl=1)  # type: ignore[arg-type]

    async def body(aclient: redis.asyncio.Redis) -> None:
        with pytest.raises(LockConfigError, match="mode must be 'read' or 'write'"):
            AsyncLock(aclient, "x", ttl=1, mode="exclusive")  # type: ignore[arg-type]
        with pytest.raises(LockConfigError, match="ttl"):
            AsyncLock(aclient, "x", ttl=-1)
        alock = AsyncLock(aclient, "x", ttl=1)
        with pytest.raises(LockConfigError, match="timeout makes no sense"):
            await alock.acquire(blocking=False, timeout=1)
        with pytest.raises(LockConfigError, match="release_where needs at least one field"):
            await alock.release_where()
        with pytest.raises(LockConfigError, match="pause"):
            await alock.pause(-1)

    run(body)
    assert client.keys("*") == []


def test_redis_down_is_a_backend_error_naming_the_lock(own_server: RedisServer) -> None:
    async def body() -> None:
        aclient = redis.asyncio.Redis.from_url(own_server.url, socket_connect_timeout=0.5)
        alock = AsyncLock(aclient, "gone", ttl=1)
        own_server.stop()
        try:
            with pytest.raises(Exception, match="lock 'gone': Redis failed") as failed:
                await alock.acquire(blocking=False)
            assert type(failed.value).__name__ == "LockBackendError"
        finally:
            await close(aclient)

    asyncio.run(body())


def test_claims_made_and_given_up_from_asyncio_are_the_cores(
    client: redis.Redis, run: Callable[..., Any]
) -> None:
    """A claim made by the asyncio API refuses the core's claim of another task (a producer's
    duplicate), is seen by the admin API, and once given up lets the other claim."""

    async def body(aclient: redis.asyncio.Redis) -> None:
        assert await aio.claim_state(aclient, "report") is None
        made = await aio.claim(aclient, "report", task_id="t-1", lifetime=60)
        assert made.status.name == "CLAIMED"
        other = claims.claim(
            client,
            "redislock",
            "report",
            task_id="t-2",
            lifetime=60,
            kind=ClaimKind.NEW,
            running_counts=False,
        )
        assert other.duplicate and other.holder == "t-1"
        state = await aio.claim_state(aclient, "report")
        assert state is not None and state.task_id == "t-1"
        listed = admin.list_claims(client)
        assert [(c.name, c.task_id) for c in listed] == [("report", "t-1")]
        assert await aio.release_claim(aclient, "report", "t-1") is None
        assert await aio.claim_state(aclient, "report") is None

    run(body)


def test_an_async_rate_limit_spends_the_tasks_budget(
    client: redis.Redis, run: Callable[..., Any]
) -> None:
    """Slots taken through the asyncio API and the synchronous one come from one bucket: two
    per second, burst 1, so each slot is 0.5 s after the one before, whoever took it."""
    sync = RateLimit(client, "api", "2/s")

    async def body(aclient: redis.asyncio.Redis) -> None:
        limit = aio.AsyncRateLimit(aclient, "api", "2/s")
        assert repr(limit) == "AsyncRateLimit('api', '2/1s', namespace='redislock')"
        first = await limit.reserve("r-1")
        second = sync.reserve("r-2")
        third = await limit.reserve("r-3", max_delay=0)
        assert first.granted and first.delay == 0
        assert second.slot_ms - first.slot_ms == 500
        assert not third.granted and 0.9 <= third.delay <= 1.0  # refused: nothing taken
        assert (await limit.reserve("r-1")).slot_ms == first.slot_ms  # asked twice: one slot
        asked = time.monotonic()
        usage = await limit.usage()
        again = sync.usage()
        # The same bucket read twice: apart by no more than the time between the two reads
        # (the server read its clock within each; 2 ms for the rounding to milliseconds).
        assert abs(usage.next_delay - again.next_delay) <= time.monotonic() - asked + 0.002
        assert (await limit.pause(5)).paused_for > 4
        assert sync.usage().paused_for > 4
        assert (await limit.resume()).paused_for == 0
        await limit.settle("r-1", 1)
        tenant = aio.AsyncRateLimit(aclient, "tenant", "1/s")
        both = await aio.reserve_all([(tenant, 1), (limit, 1)], "r-4")
        assert both.name == "api" and both.delay > 0.5
        with pytest.raises(LockConfigError, match="cost"):
            await limit.reserve("r-5", cost=-1)
        with pytest.raises(LockConfigError, match=r"redis\.asyncio\.Redis or"):
            aio.AsyncRateLimit(client, "api", "2/s")  # type: ignore[arg-type]

    run(body)


@pytest.mark.celery
def test_a_celery_task_and_an_asyncio_handler_exclude_each_other(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """A real worker's task holds ``hold:web``: the handler's lock is refused, then, waiting,
    served once the task ends, with a higher fence. Held by the handler, the task's lock is
    refused (``on_conflict="raise"``)."""
    workers(pool="threads", concurrency=2)
    url = lockapp.URL

    task = lockapp.hold.delay("web", 30)
    wait_started(lockapp, "web")
    task_fence = Lock(lockapp.r, "hold:web", ttl=1).holders()[0].fence

    async def handler() -> int:
        aclient = redis.asyncio.Redis.from_url(url)
        try:
            alock = AsyncLock(aclient, "hold:web", ttl=30)
            with pytest.raises(LockNotAcquired):
                await alock.acquire(blocking=False)
            waiting = asyncio.create_task(alock.acquire(timeout=30))
            await asyncio.to_thread(stop, lockapp, "web")
            async with await waiting as lease:
                refused = await asyncio.to_thread(lockapp.strict.delay, "web")
                with pytest.raises(LockNotAcquired, match="lock 'hold:web' is held"):
                    await asyncio.to_thread(refused.get, timeout=30)
                return lease.fence
        finally:
            await close(aclient)

    fence = asyncio.run(handler())
    assert task.get(timeout=30) == "return"
    assert fence > task_fence
    lockapp.r.delete("stop:web")
    assert lockapp.strict.delay("web").get(timeout=30) == "ran"
