"""The lock's API on a real Redis: arguments, modes, reentrancy, fences, release, inspection."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from conftest import wait_for, wait_until_queued

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
from celery_redislock.core.keys import LockKeys


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
    assert 0.15 < time.monotonic() - start < 2
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
    assert got and got[0] > first.fence


def _take_and_note(lock: Lock, order: list[int], i: int) -> None:
    with lock.acquire(timeout=10):
        order.append(i)  # while holding: the order of holders, not of threads waking


@pytest.mark.parametrize("fair", [False, True])
def test_release_wakes_a_blocked_waiter_at_once(client: redis.Redis, fair: bool) -> None:
    lock = Lock(client, "handoff", ttl=30, fair=fair)
    lease = lock.acquire()
    woke: list[float] = []
    waiter = threading.Thread(
        target=lambda: (lock.acquire(timeout=10), woke.append(time.monotonic()))
    )
    waiter.start()
    wait_until_queued(client, lock)
    released = time.monotonic()
    lease.release()
    waiter.join(10)
    # The fallback would wake it after 1 s (the lease has 30 s left): this is the push.
    assert woke and woke[0] - released < 0.5


def test_waiter_gets_the_lock_when_a_dead_holders_lease_expires(client: redis.Redis) -> None:
    Lock(client, "crashed", ttl=0.5).acquire()  # never released
    start = time.monotonic()
    lease = Lock(client, "crashed", ttl=5).acquire(timeout=5)
    assert 0.4 < time.monotonic() - start < 2.5
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
    assert order == [0, 1, 2, 3]


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
    waiter.join()
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


def test_release_where_wakes_a_waiter(client: redis.Redis) -> None:
    lock = Lock(client, "job", ttl=30)
    lock.acquire(info={"task_id": "t-1"})
    got = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=5)))
    waiter.start()
    wait_until_queued(client, lock)
    start = time.monotonic()
    lock.release_where(task_id="t-1")
    waiter.join(5)
    assert got and time.monotonic() - start < 0.5


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
    c = redis.Redis(port=1, socket_connect_timeout=0.2)
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
    with pytest.raises(LockNotAcquired) as waited:
        lock.acquire(timeout=0.05, owner="task-1", reentrant=False)
    assert waited.value.owner_expires_in is not None
    if mode == "read" or limit:
        other = lock.acquire(blocking=False, owner="task-2", reentrant=False)
        other.release()
    first.release()
    again = lock.acquire(blocking=False, owner="task-1", reentrant=False)
    assert again.token != first.token and again.fence > first.fence
    assert [h.count for h in lock.holders()] == [1]
    with pytest.raises(LockConfigError, match="reentrant must be True or False"):
        lock.acquire(owner="x", reentrant="no")  # type: ignore[arg-type]
