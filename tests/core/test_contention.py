"""Several real processes contending for one lock: exclusion, caps and read/write sharing."""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections.abc import Callable

import pytest
import redis
from helpers import wait_for, wait_until_queued

from celery_redislock import Lease, Lock, LockNotAcquired
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core import lock_base

PROCESSES = 4


def _run_all(target: Callable[..., None], *args: object, count: int = PROCESSES) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=target, args=(i, *args)) for i in range(count)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0, f"worker exited with {p.exitcode}"


def _increment(_: int, url: str, rounds: int, fair: bool) -> None:
    client = redis.Redis.from_url(url)
    lock = Lock(client, "counter", ttl=10, fair=fair)
    for _ in range(rounds):
        with lock.acquire(timeout=60) as lease:
            value = int(client.get("value") or 0)  # a non-atomic read-modify-write
            time.sleep(0.001)
            client.set("value", value + 1)
            client.rpush("fences", lease.fence)


@pytest.mark.parametrize("fair", [False, True])
def test_no_lost_update(client: redis.Redis, redis_server: object, fair: bool) -> None:
    rounds = 50
    _run_all(_increment, redis_server.url, rounds, fair)  # type: ignore[attr-defined]
    assert int(client.get("value") or 0) == PROCESSES * rounds
    fences = [int(f) for f in client.lrange("fences", 0, -1)]
    assert fences == sorted(fences) and len(set(fences)) == len(fences)


def _enter_and_leave(
    _: int, url: str, name: str, mode: str, limit: int | None, rounds: int
) -> None:
    """Counts holders with atomic INCR/DECR and records the highest count seen and any
    reader-with-writer overlap."""
    client = redis.Redis.from_url(url)
    lock = Lock(client, name, ttl=10, mode=mode, limit=limit)  # type: ignore[arg-type]
    mine, other = ("readers", "writers") if mode == "read" else ("writers", "readers")
    for _ in range(rounds):
        with lock.acquire(timeout=60):
            now = client.incr(mine)
            client.zadd("max", {mine: now}, gt=True)  # new members are added, others only grow
            if int(client.get(other) or 0) > 0:
                client.incr("overlap")
            time.sleep(0.01)
            client.decr(mine)


def test_cap_never_exceeded_and_reached(client: redis.Redis, redis_server: object) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    _run_all(_enter_and_leave, url, "api", "write", 3, 15, count=6)
    assert client.zscore("max", "writers") == 3
    assert client.get("overlap") is None


def test_readers_overlap_writers_alone(client: redis.Redis, redis_server: object) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_enter_and_leave, args=(i, url, "cache", "read", None, 20))
        for i in range(4)
    ]
    procs += [
        ctx.Process(target=_enter_and_leave, args=(i, url, "cache", "write", None, 10))
        for i in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert client.get("overlap") is None  # no reader ever saw a writer, nor a writer a reader
    assert client.zscore("max", "readers") >= 2  # readers did share
    assert client.zscore("max", "writers") == 1  # writers never did


def _wait_forever(_: int, url: str, fair: bool) -> None:
    Lock(redis.Redis.from_url(url), "line", ttl=30, fair=fair).acquire()


def _kill_queued_waiters(client: redis.Redis, url: str, lock: Lock, count: int = 1) -> None:
    """Starts ``count`` processes blocked in ``lock``'s line, in turn, then SIGKILLs them."""
    ctx = multiprocessing.get_context("fork")
    doomed = []
    for i in range(count):
        doomed.append(ctx.Process(target=_wait_forever, args=(i, url, lock.fair)))
        doomed[-1].start()
        wait_until_queued(client, lock, i + 1)
    for process in doomed:
        process.kill()
    for process in doomed:
        process.join(5)
        assert process.exitcode is not None


@pytest.mark.faults
def test_a_killed_waiter_drops_out_of_line_within_3s(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    """docs/failures.md: "a waiter dies while blocked: it drops out of line within 3 s" (fair
    mode: see the next test)."""
    lock = Lock(client, "line", ttl=30)
    lease = lock.acquire()
    _kill_queued_waiters(client, redis_server.url, lock)

    def out_of_line() -> bool:
        # A lapsed place is swept by the next call on the lock: a newcomer's try does it.
        with pytest.raises(LockNotAcquired):
            lock.acquire(blocking=False)
        return client.zcard(lock.keys.all[2]) == 0  # the line

    # 3 s after the kill at the latest (its last refresh came before), 0.5 s margin for a loaded
    # machine.
    wait_for(out_of_line, "the dead waiter dropped out of line", timeout=3.0 + 0.5)
    lease.release()  # nobody is left in line to be handed or woken
    lock.acquire(blocking=False).release()


@pytest.mark.faults
def test_a_lease_handed_to_a_killed_fair_waiter_lapses_within_3s(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    """docs/failures.md, fair mode: "a lease handed to it [a dead waiter] lapses within 3 s", and
    a dead waiter "drops out of line within 3 s". Two waiters die in line: the first is handed
    the lock; the second must be out of line by the time that lease lapses, or it would be
    handed the lock in turn (3 s more)."""
    lock = Lock(client, "line", ttl=30, fair=True)
    lease = lock.acquire()
    _kill_queued_waiters(client, redis_server.url, lock, count=2)
    lease.release()  # handed to the first dead waiter, which never claims its full ttl
    (handed,) = lock.holders()
    assert handed.token != lease.token and handed.expires_in <= 3.0
    assert client.zcard(lock.keys.all[2]) == 1  # the second one still stands in line
    # The next taker gets in as that lease lapses (the 60 s: liveness only); meanwhile every
    # holder is noted: a lease handed to the second dead waiter would be held for 3 s.
    taken: list[Lease] = []
    taker = threading.Thread(target=lambda: taken.append(lock.acquire(timeout=60)))
    taker.start()
    seen: set[str] = set()

    def taker_in() -> bool:
        seen.update(holder.token for holder in lock.holders())
        return not taker.is_alive()

    wait_for(taker_in, "the next taker got the lock", timeout=90)
    assert taken, "the next taker gave up"
    taken[0].release()
    # Nobody held it between the first dead waiter and the taker: the second dead waiter was
    # out of line by the time that lease lapsed, never handed the lock in turn.
    assert seen <= {handed.token, taken[0].token}, "the lock was handed to the second dead waiter"
    assert client.zcard(lock.keys.all[2]) == 0


# A lost wake-up must not hide behind the waiters' fallback (a fresh look every second, and
# when the holder's lease would lapse): in the stress processes both are pushed out past the
# patient waiters' timeout, so a lost wake-up makes a patient waiter give up, whatever the
# machine's speed (it waits its whole patience; a wait ended by a push is over in a fraction
# of a second, even on a loaded machine). A waiter's place in line lasts as long as its
# longest block, as it does.
_STRESS_SLICE_S = 120.0
_STRESS_TTL_S = 240
_PATIENCE_S = 30.0


def _stress(i: int, url: str, fair: bool, rounds: int) -> None:
    """Random readers and writers with random patience, recording any forbidden overlap and
    every patient waiter that waited its whole patience (a wake-up lost: nothing else wakes it
    in time)."""
    lock_base._WAIT_SLICE_S = _STRESS_SLICE_S
    lock_base.QUEUE_ENTRY_MS = lock_base.WAKE_LIST_MS = int(_STRESS_SLICE_S * 1000) + 2000
    rng = random.Random(i)
    client = redis.Redis.from_url(url)
    locks = {
        "read": Lock(client, "stress", ttl=_STRESS_TTL_S, mode="read", fair=fair),
        "write": Lock(client, "stress", ttl=_STRESS_TTL_S, fair=fair),
    }
    for _ in range(rounds):
        mode = "read" if rng.random() < 0.6 else "write"
        timeout = rng.choice([0.0, 0.002, 0.02, _PATIENCE_S])
        start = time.monotonic()
        try:
            lease = locks[mode].acquire(timeout=timeout)
        except LockNotAcquired:
            client.incr("gave_up")
            if timeout == _PATIENCE_S:
                client.incr("patient_gave_up")
            continue
        if time.monotonic() - start >= _PATIENCE_S:
            # Its whole patience: only the last look at the deadline let it in.
            client.incr("patient_gave_up")
        holders = client.incr(mode)
        if (mode == "write" and holders > 1) or int(client.get(_other(mode)) or 0) > 0:
            client.incr("overlap")
        time.sleep(rng.random() * 0.003)
        client.decr(mode)
        lease.release()
        client.incr("done")


def _other(mode: str) -> str:
    return "write" if mode == "read" else "read"


@pytest.mark.parametrize("fair", [False, True])
def test_random_waiters_keep_every_rule(
    client: redis.Redis, redis_server: object, fair: bool
) -> None:
    rounds = 80
    _run_all(_stress, redis_server.url, fair, rounds, count=6)  # type: ignore[attr-defined]
    assert client.get("overlap") is None
    assert client.get("patient_gave_up") is None, "a wake-up was lost"
    assert int(client.get("done") or 0) + int(client.get("gave_up") or 0) == 6 * rounds
    # Whoever gave up left the line: only the fence mark (and unread wake-ups) remain, and
    # each of them expires (docs/design.md: a key lives as long as its last lease or waiter).
    left = {k.decode() for k in client.keys("redislock:{stress}:*")}
    assert left - {"redislock:{stress}:wake"} <= {"redislock:{stress}:meta"} | {
        k for k in left if k.startswith("redislock:{stress}:w:")
    }
    for key in left:
        assert client.pttl(key) != -1, f"{key} never expires"  # -2: it expired meanwhile
    assert set(client.hkeys("redislock:{stress}:meta")) <= {b"fence", b"g"}
