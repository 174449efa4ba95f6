"""A lock's cap set at runtime (``set_limits(cap=...)``, ``redislock limit set NAME --cap N``):
it takes the place of a ``limit`` of 2 or more at the next acquisition and at each hand-over,
leaves exclusive locks alone, and is refused when it is not a cap."""

from __future__ import annotations

import threading

import pytest
import redis
from helpers import wait_for

from celery_redislock import Lock, LockConfigError, LockNotAcquired
from celery_redislock.core.admin import clear_limits, describe_rate, set_limits


def test_a_cap_applies_at_the_next_acquisition_until_cleared(client: redis.Redis) -> None:
    lock = Lock(client, "api", ttl=30, limit=3)
    first = lock.acquire(blocking=False)
    assert set_limits(client, "api", cap=1).cap == 1
    with pytest.raises(LockNotAcquired):
        lock.acquire(blocking=False)
    set_limits(client, "api", cap=2)
    second = lock.acquire(blocking=False)
    with pytest.raises(LockNotAcquired):
        lock.acquire(blocking=False)
    clear_limits(client, "api")
    third = lock.acquire(blocking=False)  # the code's 3 again
    with pytest.raises(LockNotAcquired):
        lock.acquire(blocking=False)
    for lease in (first, second, third):
        lease.release()


def test_a_lowered_cap_keeps_the_leases_held_and_hands_on_one_at_a_time(
    client: redis.Redis,
) -> None:
    lock = Lock(client, "api", ttl=30, limit=2)
    a, b = lock.acquire(), lock.acquire()
    set_limits(client, "api", cap=1)
    got: list[object] = []

    def wait() -> None:
        got.append(lock.acquire(timeout=20))

    waiters = [threading.Thread(target=wait) for _ in range(2)]
    for t in waiters:
        t.start()
    a.release()  # 1 left held: a cap of 1 hands nothing on
    assert got == [] and len(lock.holders()) == 1
    b.release()  # none held: one waiter, not both
    wait_for(lambda: len(got) == 1, "one waiter handed the lock")
    assert len(lock.holders()) == 1
    with pytest.raises(LockNotAcquired):  # full at 1, though the code says 2
        lock.acquire(blocking=False)
    got[0].release()  # type: ignore[attr-defined]
    for t in waiters:
        t.join(20)
    assert len(got) == 2
    got[1].release()  # type: ignore[attr-defined]


def test_an_exclusive_lock_ignores_a_cap(client: redis.Redis) -> None:
    lock = Lock(client, "nightly", ttl=30)
    held = lock.acquire()
    set_limits(client, "nightly", cap=5)
    with pytest.raises(LockNotAcquired):
        lock.acquire(blocking=False)
    held.release()


@pytest.mark.parametrize("cap", [0, -1, True, 2.5, "3", 1_000_001])
def test_a_bad_cap_is_refused_and_nothing_is_written(client: redis.Redis, cap: object) -> None:
    with pytest.raises(LockConfigError, match="cap must be an integer from 1 to 1,000,000"):
        set_limits(client, "api", cap=cap)  # type: ignore[arg-type]
    assert client.keys("*") == []
    assert describe_rate(client, "api").cap is None
