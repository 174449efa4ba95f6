"""The lock's API on a real Redis: arguments, modes, reentrancy, fences, release, inspection."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis
from faultproxy import FaultProxy
from helpers import wait_for, wait_until_queued
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redislock import (
    Lease,
    Lock,
    LockBackendError,
    LockConfigError,
    LockNotAcquired,
    LockNotOwned,
    LockUpgradeError,
    Mode,
    RedisLockError,
    iter_locks,
)
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core import lock_base
from celery_redislock.core.keys import LockKeys

LUA = Path(__file__).resolve().parents[2] / "celery_redislock" / "core" / "lua"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ttl": 0}, r"ttl must be a number of seconds from 0\.1 to 604800 \(7 days\), got 0"),
        ({"ttl": -1.5}, "ttl must be a number of seconds from 0.1 .*, got -1.5"),
        ({"ttl": "10"}, "ttl must be a number of seconds from 0.1 .*, got '10'"),
        ({"ttl": True}, "ttl must be a number of seconds from 0.1 .*, got True"),
        ({"ttl": 1, "limit": 0}, "limit must be None or an integer >= 1, got 0"),
        ({"ttl": 1, "limit": 2.5}, "limit must be None or an integer >= 1, got 2.5"),
        ({"ttl": 1, "mode": "exclusive"}, "mode must be 'read' or 'write', got 'exclusive'"),
        ({"ttl": 1, "fair": 1}, "fair must be True or False, got 1"),
        ({"ttl": 1, "namespace": "a{b"}, "namespace must be a non-empty string without"),
    ],
)
def test_bad_arguments_raise_at_construction(
    client: redis.Redis, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(LockConfigError, match=message) as info:
        Lock(client, "job", **kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", ["", None, "}x"])
def test_bad_name(client: redis.Redis, name: object) -> None:
    with pytest.raises(LockConfigError, match="name must"):
        Lock(client, name, ttl=1)  # type: ignore[arg-type]


def test_client_must_be_a_redis_client() -> None:
    with pytest.raises(LockConfigError, match=r"client must be a redis\.Redis .* got str") as info:
        Lock("redis://localhost", "job", ttl=1)  # type: ignore[arg-type]
    assert info.value.name == "job"


def test_the_rarer_keywords_are_checked_by_name(client: redis.Redis) -> None:
    """``namespace``, ``fence_keep``, ``handover``... are grouped (LockExtras), still keywords: a
    misspelt one is refused as Python refuses an unknown keyword."""
    lock = Lock(client, "job", ttl=1, namespace="other", fence_keep=60, handover_window=5)
    assert (lock.namespace, lock.fence_keep, lock.handover_window) == ("other", 60, 5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'fence_kep'"):
        Lock(client, "job", ttl=1, fence_kep=60)  # type: ignore[call-arg]


def test_bad_acquire_arguments(client: redis.Redis) -> None:
    lock = Lock(client, "job", ttl=1)
    with pytest.raises(LockConfigError, match="timeout must be a number of seconds from 0 "):
        lock.acquire(timeout=-1)
    with pytest.raises(LockConfigError, match="timeout makes no sense with blocking=False"):
        lock.acquire(blocking=False, timeout=1)
    with pytest.raises(LockConfigError, match="owner must be a non-empty string"):
        lock.acquire(owner="")


def test_mutex_excludes_and_reports_the_name(client: redis.Redis) -> None:
    lock = Lock(client, "report", ttl=5)
    lease = lock.acquire()
    with pytest.raises(LockNotAcquired, match="lock 'report' is held") as info:
        lock.acquire(blocking=False)
    assert info.value.name == "report"
    start = time.monotonic()
    with pytest.raises(LockNotAcquired, match=r"gave up after 0.2s"):
        lock.acquire(timeout=0.2)
    assert 0.15 < time.monotonic() - start < 30  # (the upper bound: liveness only)
    lease.release()
    lock.acquire(blocking=False).release()


def test_zero_timeout_tries_once(client: redis.Redis) -> None:
    lock = Lock(client, "once", ttl=5)
    with lock.acquire(timeout=0), pytest.raises(LockNotAcquired):
        lock.acquire(timeout=0)
    assert client.zcard(LockKeys.of("redislock", "once").all[2]) == 0  # nobody left queued


def test_cap_admits_limit_holders(client: redis.Redis) -> None:
    lock = Lock(client, "api", ttl=5, limit=3)
    leases = [lock.acquire(blocking=False) for _ in range(3)]
    with pytest.raises(LockNotAcquired):
        lock.acquire(blocking=False)
    assert len(lock.holders()) == 3
    leases[0].release()
    lock.acquire(blocking=False)


def test_readers_share_writers_exclude(client: redis.Redis) -> None:
    read = Lock(client, "cache", ttl=5, mode="read")
    write = Lock(client, "cache", ttl=5, mode="write")
    readers = [read.acquire(blocking=False) for _ in range(10)]
    with pytest.raises(LockNotAcquired):
        write.acquire(blocking=False)
    for lease in readers:
        lease.release()
    writer = write.acquire(blocking=False)
    with pytest.raises(LockNotAcquired):
        read.acquire(blocking=False)
    writer.release()


def test_bounded_readers(client: redis.Redis) -> None:
    read = Lock(client, "cache", ttl=5, mode="read", limit=2)
    read.acquire(blocking=False)
    read.acquire(blocking=False)
    with pytest.raises(LockNotAcquired):
        read.acquire(blocking=False)


def test_queued_writer_is_not_starved_by_new_readers(client: redis.Redis) -> None:
    read = Lock(client, "cache", ttl=5, mode="read")
    write = Lock(client, "cache", ttl=5)
    first = read.acquire()
    got: list[float] = []
    writer = threading.Thread(target=lambda: got.append(write.acquire(timeout=5).fence))
    writer.start()
    wait_until_queued(client, write)
    with pytest.raises(LockNotAcquired):
        read.acquire(blocking=False)  # a new reader yields to the queued writer
    first.release()
    writer.join(5)
    assert not writer.is_alive()
    assert got and got[0] > first.fence


def _take_and_note(lock: Lock, order: list[int], i: int) -> None:
    with lock.acquire(timeout=10):
        order.append(i)  # while holding: the order of holders, not of threads waking


def _no_fallback_look(monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiter's fallback look (every second) pushed out to 120 s: what wakes it sooner is a
    push or its holder's expiry, however slow the machine."""
    monkeypatch.setattr(lock_base, "_WAIT_SLICE_S", 120.0)
    monkeypatch.setattr(lock_base, "QUEUE_ENTRY_MS", 122_000)
    monkeypatch.setattr(lock_base, "WAKE_LIST_MS", 122_000)


@pytest.mark.parametrize("fair", [False, True])
def test_release_wakes_a_blocked_waiter_at_once(
    client: redis.Redis, fair: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The waiter's fallback look pushed out to 120 s, and the lease's lapse to 240 s: only the
    # release's push wakes it before its 60 s run out, however slow the machine.
    _no_fallback_look(monkeypatch)
    lock = Lock(client, "handoff", ttl=240, fair=fair)
    lease = lock.acquire()
    woke: list[float] = []
    waiter = threading.Thread(
        target=lambda: (lock.acquire(timeout=60).release(), woke.append(time.monotonic()))
    )
    waiter.start()
    wait_until_queued(client, lock)
    released = time.monotonic()
    lease.release()
    waiter.join(90)
    assert not waiter.is_alive()
    # Unwoken, it would get in only at its deadline's last look, 60 s on.
    assert woke and woke[0] - released < 30, "the release did not wake the waiter"


@pytest.mark.parametrize("fair", [False, True])
def test_waiter_gets_the_lock_when_a_dead_holders_lease_expires(
    client: redis.Redis, fair: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/failures.md: a holder dies, "waiters wake at that moment" (its lease's expiry)."""
    _no_fallback_look(monkeypatch)
    Lock(client, "crashed", ttl=0.3, fair=fair).acquire()  # never released
    start = time.monotonic()
    lease = Lock(client, "crashed", ttl=5, fair=fair).acquire(timeout=60)
    took = time.monotonic() - start
    # The lease lapses at 0.3 s; a waiter that only looked at its fallback would take 120 s.
    assert 0.25 < took < 30
    lease.release()


def test_fair_mode_serves_in_arrival_order(client: redis.Redis) -> None:
    lock = Lock(client, "line", ttl=30, fair=True)
    lease = lock.acquire()
    order: list[int] = []
    threads = []
    for i in range(4):
        t = threading.Thread(target=_take_and_note, args=(lock, order, i))
        t.start()
        threads.append(t)
        wait_until_queued(client, lock, i + 1)
    lease.release()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert order == [0, 1, 2, 3]


def _hold_until(
    lock: Lock, name: str, got: dict[str, Lease], order: list[str], go: threading.Event
) -> None:
    """A waiter that, once it holds the lock, keeps it until ``go`` is set."""
    lease = lock.acquire(timeout=30)
    got[name] = lease
    order.append(name)  # while holding: the order of holders
    go.wait(30)
    lease.release()


def _blocked_clients(client: redis.Redis) -> int:
    """Clients blocked in a command such as BLPOP, as the server counts them."""
    return int(client.info("clients")["blocked_clients"])


def test_a_non_fair_release_wakes_one_waiter_of_three(client: redis.Redis) -> None:
    """docs/core.md: "release pushes one signal, which wakes the longest-blocked waiter"."""
    lock = Lock(client, "herd", ttl=30)
    first = lock.acquire()
    blocked = _blocked_clients(client)  # any left blocked by other tests' threads
    got: dict[str, Lease] = {}
    order: list[str] = []
    go = threading.Event()
    threads = [
        threading.Thread(target=_hold_until, args=(lock, str(i), got, order, go)) for i in range(3)
    ]
    for t in threads:
        t.start()
    wait_until_queued(client, lock, 3)
    wait_for(lambda: _blocked_clients(client) >= blocked + 3, "3 waiters blocked")
    # Keyspace events count the wake-ups popped: a woken waiter that finds the lock taken again
    # goes back to waiting, so only the pops tell one wake-up from a herd.
    client.config_set("notify-keyspace-events", "Kl")
    events = client.pubsub()
    try:
        events.subscribe(f"__keyspace@0__:{lock.keys.all[4]}")  # the wake-up list
        assert events.get_message(timeout=5) is not None  # subscribed
        first.release()
        wait_for(lambda: got, "a waiter took the lock")
        # Observation window, shorter than the 1 s fallback: time for a herd to show.
        time.sleep(0.3)
        popped = []
        while (message := events.get_message(timeout=0.05)) is not None:
            popped.append(message["data"])
    finally:
        events.close()
        client.config_set("notify-keyspace-events", "")
    assert popped.count(b"lpop") == 1, popped
    (winner,) = got.values()
    assert [h.token for h in lock.holders()] == [winner.token]
    assert client.zcard(lock.keys.all[2]) == 2  # the other two still stand in line
    assert sum(t.is_alive() for t in threads) == 3
    go.set()  # each release now hands on to the next
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert sorted(order) == ["0", "1", "2"]


def test_a_wake_up_lost_with_a_dead_waiter_costs_the_others_at_most_the_fallback(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    """docs/failures.md: a waiter dies while blocked; "if it took a wake-up with it, the other
    waiters look again within 1 s". The dead waiter is a client that pops the wake-up list."""
    lock = Lock(client, "lost-wake", ttl=30)
    first = lock.acquire()
    blocked = _blocked_clients(client)  # any left blocked by other tests' threads
    thief = redis.Redis.from_url(redis_server.url)
    stolen: list[object] = []
    taker = threading.Thread(
        target=lambda: stolen.append(thief.blpop([lock.keys.all[4]], timeout=10))
    )
    taker.start()
    # Blocked first, the thief is served first (Redis serves the longest-blocked client).
    wait_for(lambda: _blocked_clients(client) >= blocked + 1, "the thief blocked")
    got_at: list[float] = []
    waiter = threading.Thread(
        target=lambda: (lock.acquire(timeout=10), got_at.append(time.monotonic()))
    )
    waiter.start()
    wait_until_queued(client, lock)
    wait_for(lambda: _blocked_clients(client) >= blocked + 2, "the waiter blocked")
    released = time.monotonic()
    first.release()
    taker.join(5)
    assert not taker.is_alive()
    assert stolen and stolen[0] is not None  # the wake-up went to the dead waiter
    waiter.join(5)
    assert not waiter.is_alive()
    thief.close()
    # The waiter's own look, at most 1 s after it blocked; 0.4 s margin for a loaded machine.
    assert got_at and got_at[0] - released < 1.0 + 0.4


@pytest.mark.faults
def test_fair_newcomer_never_overtakes_a_waiter_handed_the_lock(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    """docs/core.md, fair mode: "a newcomer never overtakes a queued waiter", also between the
    release and the waiter waking; and "the waiter claims the full ttl as it wakes"."""
    lock = Lock(client, "queue", ttl=30, fair=True)
    first = lock.acquire()
    with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        slow_client = redis.Redis.from_url(proxy.url)
        slow = Lock(slow_client, "queue", ttl=30, fair=True)
        got: list[Lease] = []
        waiter = threading.Thread(target=lambda: got.append(slow.acquire(timeout=10)))
        waiter.start()
        wait_until_queued(client, lock)
        # Everything the waiter sends and gets is 1 s late (its wake-up too, and a fallback look
        # that would claim the lease), so the checks below run after the release and before it
        # wakes.
        proxy.delay(requests=1.0, replies=1.0)
        first.release()
        (handed,) = lock.holders()
        assert handed.token != first.token and handed.expires_in <= 3.0  # a place in line's life
        with pytest.raises(LockNotAcquired):
            lock.acquire(blocking=False)
        with pytest.raises(LockNotAcquired):
            lock.acquire(timeout=0.05)
        assert not got  # still before the waiter woke
        proxy.heal()  # what is held back still comes late; its claim then does not
        waiter.join(5)
        assert not waiter.is_alive()
        slow_client.close()
    assert got and got[0].token == handed.token
    (claimed,) = lock.holders()
    assert 29 < claimed.expires_in <= 30  # the full ttl, claimed as it woke
    lock.release(got[0])  # its own client went with the proxy


def test_fair_release_hands_over_to_every_queued_reader_that_fits(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/core.md: fair mode hands the lease over to the head of the line, "several readers at
    once, when they fit", then wakes exactly those waiters, each claiming the full ttl."""
    _no_fallback_look(monkeypatch)
    write = Lock(client, "shelf", ttl=30, fair=True)
    read = Lock(client, "shelf", ttl=30, mode="read", fair=True)
    first = write.acquire()
    got: dict[str, Lease] = {}
    order: list[str] = []
    go = threading.Event()
    threads = []
    for name, lock in [("r1", read), ("r2", read), ("r3", read), ("w", write), ("r4", read)]:
        t = threading.Thread(target=_hold_until, args=(lock, name, got, order, go))
        t.start()
        threads.append(t)
        wait_until_queued(client, write, len(threads))  # arrival order is line order
    released = time.monotonic()
    first.release()
    # Handed over inside the release: the three readers at the head hold the lock now; the
    # writer behind them does not fit, and the reader behind the writer keeps its place.
    assert sorted(h.mode for h in write.holders()) == ["read"] * 3
    assert client.zcard(write.keys.all[2]) == 2
    wait_for(lambda: len(got) == 3, "the three readers woke", 60)
    # Woken by the push, not the fallback look (pushed out to 120 s).
    assert time.monotonic() - released < 30
    assert sorted(got) == ["r1", "r2", "r3"]
    assert sorted(h.token for h in write.holders()) == sorted(lease.token for lease in got.values())
    # Each claimed the full ttl (a place in line's life, unclaimed, is 122 s here).
    assert all(20 < h.expires_in <= 30 for h in write.holders())
    go.set()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert order[3:] == ["w", "r4"]


def test_reentry_by_owner(client: redis.Redis) -> None:
    lock = Lock(client, "sync:42", ttl=5)
    outer = lock.acquire(owner="task-1")
    inner = lock.acquire(owner="task-1")
    assert inner.token == outer.token and inner.fence == outer.fence
    assert lock.holders()[0].count == 2
    with pytest.raises(LockNotAcquired):
        lock.acquire(blocking=False, owner="task-2")
    inner.release()
    assert lock.holders()[0].count == 1
    outer.release()
    assert lock.holders() == []


def test_same_thread_without_owner_is_not_reentrant(client: redis.Redis) -> None:
    lock = Lock(client, "plain", ttl=5)
    with lock, pytest.raises(LockNotAcquired):
        lock.acquire(blocking=False)


def test_read_to_write_upgrade_is_refused(client: redis.Redis) -> None:
    Lock(client, "doc", ttl=5, mode="read").acquire(owner="me")
    with pytest.raises(LockUpgradeError, match="holds a read lease and asked for write"):
        Lock(client, "doc", ttl=5).acquire(owner="me")


def test_writer_reentering_as_reader_keeps_its_write_lease(client: redis.Redis) -> None:
    write = Lock(client, "doc", ttl=5).acquire(owner="me")
    read = Lock(client, "doc", ttl=5, mode="read").acquire(owner="me")
    assert read.token == write.token
    assert [h.mode for h in Lock(client, "doc", ttl=5).holders()] == ["write"]


def test_release_of_a_lease_not_held_names_the_lock(client: redis.Redis) -> None:
    lock = Lock(client, "twice", ttl=5)
    lease = lock.acquire()
    lease.release()
    with pytest.raises(LockNotOwned, match="lock 'twice' is not held") as info:
        lease.release()
    assert info.value.name == "twice" and info.value.token == lease.token


def test_release_never_touches_another_holders_lease(client: redis.Redis) -> None:
    lock = Lock(client, "mine", ttl=0.2)
    stale = lock.acquire()
    wait_for(lambda: not lock.holders(), "the lease expired")  # someone else may take it now
    fresh = Lock(client, "mine", ttl=5).acquire(blocking=False)
    with pytest.raises(LockNotOwned):
        stale.release()
    assert [h.token for h in lock.holders()] == [fresh.token]


def test_context_managers(client: redis.Redis) -> None:
    lock = Lock(client, "ctx", ttl=5)
    with lock as lease:
        assert lock.holders()[0].token == lease.token
    assert not lock.locked()
    with lock.acquire() as lease:
        assert lock.locked()
    assert not lock.locked()


def test_fences_increase_across_release_expiry_and_deleted_keys(client: redis.Redis) -> None:
    lock = Lock(client, "fenced", ttl=0.1, fence_keep=0.2)  # 0.1 s: the shortest ttl
    fences = []
    tokens = set()
    for step in range(30):
        lease = lock.acquire(timeout=2)
        fences.append(lease.fence)
        tokens.add(lease.token)
        if step % 3 == 0:
            lease.release()
        elif step % 3 == 1:
            wait_for(lambda: not lock.holders(), "the lease expired")
        else:
            lease.release()
            # Every key of the lock goes, the fence mark too.
            wait_for(lambda: not client.keys("redislock:{fenced}*"), "the lock's keys expired")
    assert fences == sorted(set(fences))
    assert len(tokens) == 30


def test_fences_are_shared_by_all_modes(client: redis.Redis) -> None:
    read = Lock(client, "rw", ttl=5, mode="read")
    write = Lock(client, "rw", ttl=5)
    a, b = read.acquire(), read.acquire()
    a.release()
    b.release()
    c = write.acquire()
    assert a.fence < b.fence < c.fence


def test_no_key_outlives_the_lock(client: redis.Redis) -> None:
    lock = Lock(client, "tidy", ttl=5, fair=True)
    lease = lock.acquire()
    waiter = threading.Thread(target=lambda: lock.acquire(timeout=5).release())
    waiter.start()
    wait_until_queued(client, lock)
    lease.release()
    waiter.join(5)
    assert not waiter.is_alive()
    keys = {k.decode() for k in client.keys("*")}
    assert keys <= {"redislock:{tidy}:meta"}
    # The fence mark (and the tokens last released) stay a day: a clock step back stays safe.
    assert set(client.hkeys("redislock:{tidy}:meta")) == {b"fence", b"g"}
    assert 86_390_000 < client.pttl("redislock:{tidy}:meta") <= 86_400_000


def test_keys_of_a_lock_share_one_cluster_slot(client: redis.Redis) -> None:
    from redis.crc import key_slot

    keys = LockKeys.of("redislock", "sync:{odd}name}")
    slots = {key_slot(k.encode()) for k in [*keys.all, keys.waiter("abc")]}
    assert len(slots) == 1


def test_release_where_frees_what_a_dead_process_held(client: redis.Redis) -> None:
    lock = Lock(client, "job", ttl=30, limit=3)
    killed = lock.acquire(info={"task_id": "t-1", "pid": 4242})
    other = lock.acquire(info={"task_id": "t-2"})
    assert lock.release_where(task_id="t-1", pid=4242) == [killed.token]
    assert [h.token for h in lock.holders()] == [other.token]
    assert lock.release_where(task_id="nope") == []
    with pytest.raises(LockConfigError, match="at least one field"):
        lock.release_where()


def test_release_where_wakes_a_waiter(client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_fallback_look(monkeypatch)
    lock = Lock(client, "job", ttl=30)
    lock.acquire(info={"task_id": "t-1"})
    got = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=60)))
    waiter.start()
    wait_until_queued(client, lock)
    start = time.monotonic()
    lock.release_where(task_id="t-1")
    waiter.join(60)
    assert not waiter.is_alive()
    # Woken by the release's push: its fallback look would come at 120 s, the lapse at 30 s.
    assert got and time.monotonic() - start < 25


def test_holders_show_owner_info_and_expiry(client: redis.Redis) -> None:
    lock = Lock(client, "seen", ttl=10, mode="read")
    lease = lock.acquire(owner="o-1", info={"task_id": "abc"})
    (holder,) = lock.holders()
    assert holder.token == lease.token and holder.fence == lease.fence
    assert holder.mode == "read" and holder.owner == "o-1" and holder.count == 1
    assert holder.info["task_id"] == "abc" and "host" in holder.info and "pid" in holder.info
    assert 9 < holder.expires_in <= 10


def test_iter_locks_lists_the_namespace(client: redis.Redis) -> None:
    Lock(client, "a", ttl=5).acquire()
    Lock(client, "b:{x}", ttl=5).acquire()
    Lock(client, "c", ttl=5, namespace="other").acquire()
    assert sorted(iter_locks(client)) == ["a", "b:{x}"]
    assert list(iter_locks(client, "other")) == ["c"]


def test_decoded_responses_client(redis_server: object) -> None:
    c = redis.Redis.from_url(redis_server.url, decode_responses=True)  # type: ignore[attr-defined]
    lock = Lock(c, "text", ttl=5, fair=True)
    with lock.acquire() as lease:
        assert isinstance(lease.token, str) and lock.holders()[0].token == lease.token


def test_redis_down_is_a_backend_error_naming_the_lock() -> None:
    # No redis-py retries: its default policy would spend some 7 s reconnecting first.
    c = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    with pytest.raises(LockBackendError, match="lock 'down': Redis failed") as info:
        Lock(c, "down", ttl=1).acquire()
    assert isinstance(info.value, RedisLockError) and info.value.name == "down"
    assert isinstance(info.value.__cause__, redis.ConnectionError)


def test_fair_waiter_granted_without_its_wake_up_leaves_nothing_behind(
    client: redis.Redis,
) -> None:
    """A releaser that dies between handing the lock over and waking the new holder: the waiter
    finds its lease on its next look, and leaves no stale place in line behind."""
    from celery_redislock.core.scripts import run

    lock = Lock(client, "handover", ttl=5, fair=True)
    first = lock.acquire()
    got: list[Lease] = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=10)))
    waiter.start()
    wait_until_queued(client, lock)
    # Hand over, never notify.
    run("release", client, lock.keys.all, [first.token, lock._spec, "0", "r1"])
    waiter.join(10)
    assert not waiter.is_alive()
    assert got and [h.token for h in lock.holders()] == [got[0].token]
    assert client.zcard(lock.keys.all[2]) == 0
    got[0].release()
    lock.acquire(blocking=False).release()


def test_reentry_through_a_lock_of_the_other_mode_reports_the_leases_mode(
    client: redis.Redis,
) -> None:
    write = Lock(client, "doc", ttl=5).acquire(owner="job-1")
    again = Lock(client, "doc", ttl=5, mode="read").acquire(owner="job-1")
    assert again.token == write.token and again.mode == "write"


@pytest.mark.parametrize(("mode", "limit"), [("write", None), ("read", None), ("write", 3)])
def test_non_reentrant_owner_holds_at_most_one_lease(
    client: redis.Redis, mode: Mode, limit: int | None
) -> None:
    lock = Lock(client, "once", ttl=5, mode=mode, limit=limit)
    first = lock.acquire(owner="task-1", reentrant=False)
    # Even where another holder would fit (readers, a cap of 3), the same owner is refused, and
    # told so (with the time its lease has left) in the same step that refused it.
    with pytest.raises(LockNotAcquired, match="by owner 'task-1' already") as refused:
        lock.acquire(blocking=False, owner="task-1", reentrant=False)
    assert refused.value.owner_expires_in is not None
    assert 4 < refused.value.owner_expires_in <= 5
    # A blocking call is told at once too: it would wait on itself.
    asked = time.monotonic()
    with pytest.raises(LockNotAcquired) as waited:
        lock.acquire(timeout=30, owner="task-1", reentrant=False)
    assert time.monotonic() - asked < 20  # (it would wait out its 30 s)
    assert waited.value.owner_expires_in is not None
    if mode == "read" or limit:
        other = lock.acquire(blocking=False, owner="task-2", reentrant=False)
        other.release()
    else:  # a mutex: another owner is refused too, as held by someone else (no time left given)
        with pytest.raises(LockNotAcquired, match=r"lock 'once' is held$") as held:
            lock.acquire(blocking=False, owner="task-2", reentrant=False)
        assert held.value.owner_expires_in is None
    first.release()
    again = lock.acquire(blocking=False, owner="task-1", reentrant=False)
    assert again.token != first.token and again.fence > first.fence
    assert [h.count for h in lock.holders()] == [1]
    with pytest.raises(LockConfigError, match="reentrant must be True or False"):
        lock.acquire(owner="x", reentrant="no")  # type: ignore[arg-type]


def test_the_lock_records_outlive_a_lease_renewed_after_a_hand_over(client: redis.Redis) -> None:
    """The meta key (lease records, fence mark) outlives every live lease by the grace period,
    also when it was last extended for the previous holder and the new holder renews before the
    leases key needs extending (renew.lua then leaves the meta key alone). Raw script calls with
    a 1.5 s ttl, so that the gap shows within two seconds."""
    from celery_redislock.core.protocol import AcquireArgs, AcquireReply, AcquireStatus
    from celery_redislock.core.scripts import run

    lock = Lock(client, "outlive", ttl=30)
    spec = "w 1 1500 0 1500 1"  # ttl 1.5 s, a place in line 1.5 s, fence_keep 1 ms

    def try_acquire(token: str, *, wait: bool = False, woke: bool = False) -> AcquireStatus:
        args = AcquireArgs(token=token, spec=spec, wait=wait, woke=woke, info="{}").encode()
        return AcquireReply.decode(run("acquire", client, lock.keys.all, args)).status

    assert try_acquire("a") is AcquireStatus.HELD  # the meta key lives 4 s from now
    assert try_acquire("w", wait=True) is AcquireStatus.NOT_HELD  # queued
    time.sleep(0.8)  # a's hold: time passing is the point (the meta key's life runs down)
    run("release", client, lock.keys.all, ["a", spec, "1", "ra"])
    assert try_acquire("w", wait=True, woke=True) is AcquireStatus.HELD
    time.sleep(1.2)  # less than a ttl: the leases key still lives long enough for a renewal
    [expiry] = run("renew", client, lock.keys.all[:2], ["1500", "w"]).split()
    (sec, usec), meta_left = client.time(), client.pttl(lock.keys.meta)
    now_ms = sec * 1000 + usec // 1000
    assert meta_left + now_ms >= int(expiry) + 1000 - 50, "the lease records lapse before it"
    run("release", client, lock.keys.all, ["w", spec, "1", "rw"])


def test_numbers_go_to_redis_as_exact_integers(client: redis.Redis) -> None:
    """The scripts' int(): a fence (server microseconds, 16 digits), an expiry and a negative
    whole number are written digit for digit; a fraction is rounded, as it always was."""
    part = (LUA / "_time.lua").read_text()
    body = "return {int(1795824040507368), int(1795824070507), int(-7), int(2.5), int(2.7)}"
    got = [x.decode() for x in client.eval(part + "\n" + body, 0)]
    assert got == ["1795824040507368", "1795824070507", "-7", "2", "3"]
