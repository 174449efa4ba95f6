"""How a lease ends (issue 10, defects 7 and 8): leaving a ``with`` block after the lease
lapsed, checking or releasing a lease that is not held, and the fence mark a lock leaves behind.

Each test says which defect it proves and how the code as of commit 2dbb8d2 failed it; the few
that guard behaviour 2dbb8d2 already had say so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
import redis
from helpers import wait_for

from celery_redislock import JobFinished, Lease, Lock, LockNotOwned

Enter = Callable[[Lock], AbstractContextManager[Lease]]
ENTERS: list[Enter] = [lambda lock: lock.acquire(), lambda lock: lock]
ENTER_IDS = ["with-lock.acquire()", "with-lock"]
DAY_MS = 86_400_000


def _lapse(lock: Lock) -> None:
    """Waits until the lock's only lease has lapsed in Redis (nothing renews it)."""
    wait_for(lambda: not lock.holders(), "the lease lapsed", 30)


# -- defect 7: leaving a with block ------------------------------------------------------------


@pytest.mark.parametrize("enter", ENTERS, ids=ENTER_IDS)
def test_the_body_s_exception_reaches_the_caller_after_the_lease_lapsed(
    client: redis.Redis, caplog: pytest.LogCaptureFixture, enter: Enter
) -> None:
    """Defect 7: the body raised, and the release on the way out fails because the lease has
    lapsed. The caller gets the body's exception; the failed release is logged. At 2dbb8d2 the
    caller got LockNotOwned, the ValueError surviving only as its ``__context__``."""
    lock = Lock(client, "ending", ttl=0.2)
    with (
        caplog.at_level(logging.WARNING, logger="celery_redislock"),
        pytest.raises(ValueError, match="the body's own") as raised,
        enter(lock),
    ):
        _lapse(lock)
        raise ValueError("the body's own")
    assert type(raised.value) is ValueError
    logged = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("celery_redislock") and r.levelno >= logging.WARNING
    ]
    assert any("'ending'" in m and "ValueError" in m for m in logged), logged
    # Nothing of the failed release is left behind: the name is free.
    Lock(client, "ending", ttl=30).acquire(blocking=False).release()


@pytest.mark.parametrize("enter", ENTERS, ids=ENTER_IDS)
def test_a_clean_exit_after_the_lease_lapsed_still_raises(
    client: redis.Redis, enter: Enter
) -> None:
    """Defect 7, the other half of the rule: when the body did not raise, a release that fails
    is the caller's business and raises LockNotOwned (the work in the block may have run
    unprotected). (A guard: 2dbb8d2 raised here too.)"""
    lock = Lock(client, "ending-clean", ttl=0.2)
    with pytest.raises(LockNotOwned, match="'ending-clean'"), enter(lock):
        _lapse(lock)


def test_check_of_a_released_lease_raises(client: redis.Redis) -> None:
    """Defect 7: ``check()`` on a lease that was released says it is not held. At 2dbb8d2 it
    passed silently until the ttl the lease once had would have run out."""
    lock = Lock(client, "checked", ttl=30)
    lease = lock.acquire()
    lease.check()
    lease.release()
    with pytest.raises(LockNotOwned, match="released"):
        lease.check()


def test_releasing_through_a_lock_of_another_namespace_names_both(client: redis.Redis) -> None:
    """Defect 7: a lease of lock 'res' in one namespace given to lock 'res' of another is
    refused with a message that names both namespaces, and the lease stays held. At 2dbb8d2
    the message said "belongs to lock 'res', not 'res'"."""
    mine = Lock(client, "res", ttl=30, namespace="ns-one")
    other = Lock(client, "res", ttl=30, namespace="ns-two")
    lease = mine.acquire()
    with pytest.raises(LockNotOwned) as refused:
        other.release(lease)
    message = str(refused.value)
    assert "'ns-one'" in message and "'ns-two'" in message, message
    assert not lease.released
    assert [h.token for h in mine.holders()] == [lease.token]
    lease.release()
    assert not mine.holders()


# -- defect 8: the fence mark ----------------------------------------------------------------------


def test_the_fence_mark_outlives_the_lock_by_a_day(client: redis.Redis) -> None:
    """Defect 8: once the lock is released, its meta key (the fence mark) is kept for the
    default ``fence_keep``, a day, and holds the last fence issued. At 2dbb8d2 it was kept
    1 s."""
    lock = Lock(client, "fenced", ttl=5)
    first = lock.acquire()
    first.release()
    last = lock.acquire()
    last.release()
    assert last.fence > first.fence
    assert client.hget(lock.keys.meta, "fence") == str(last.fence).encode()
    assert DAY_MS - 10_000 < client.pttl(lock.keys.meta) <= DAY_MS


def test_fences_keep_growing_after_the_server_clock_stepped_back(client: redis.Redis) -> None:
    """Defect 8: a fence mark 10 minutes ahead of the server's clock is what a lock leaves when
    the clock then steps back by 10 minutes (an NTP step, a VM resume, a failover). Some time
    after the last lease (more than the 1 s the mark was kept at 2dbb8d2) the next fence is
    still greater than the mark. At 2dbb8d2 the mark was gone by then and the new fence, taken
    from the clock, was 10 minutes' worth of microseconds smaller."""
    lock = Lock(client, "stepped", ttl=5)
    lock.acquire().release()
    seconds, micros = client.time()
    mark = seconds * 1_000_000 + micros + 600_000_000
    client.hset(lock.keys.meta, "fence", mark)
    time.sleep(1.2)  # the lock unused for longer than 2dbb8d2 kept the mark
    lease = lock.acquire()
    assert lease.fence > mark
    lease.release()


def test_fence_keep_is_configurable(client: redis.Redis) -> None:
    """Defect 8: how long the mark is kept is ``Lock(..., fence_keep=)``; never less than a
    live lease needs. At 2dbb8d2 ``Lock`` took no ``fence_keep``."""
    lock = Lock(client, "brief-mark", ttl=2, fence_keep=0.3)
    lease = lock.acquire()
    assert client.pttl(lock.keys.meta) >= 2000, "the mark outlives a live lease"
    lease.release()
    assert client.pttl(lock.keys.meta) <= 300
    time.sleep(0.35)  # fence_keep passing is the point
    assert not client.exists(lock.keys.meta), "the mark lapsed after fence_keep"


def test_a_lease_re_entered_all_day_keeps_a_small_record(client: redis.Redis) -> None:
    """Re-entries and partial releases note their request ids (so a retried call counts once),
    but only the last few: the record of a lease re-entered thousands of times stays small."""
    lock = Lock(client, "busy-owner", ttl=30)
    leases = [lock.acquire(owner="o") for _ in range(200)]
    record = client.hget(lock.keys.meta, f"l:{leases[0].token}")
    assert record is not None and len(record.split(b"|")[3].split()) <= 16
    assert lock.holders()[0].count == 200
    for lease in leases[:-1]:
        lease.release()
    assert lock.holders()[0].count == 1
    leases[-1].release()
    assert not lock.locked()


def test_release_records_the_job_finished_in_the_same_step(client: redis.Redis) -> None:
    """A delivery that gives its lease back with finish_job leaves the next delivery of the
    same job either the lease or the record, never neither; a lapsed lease still records it."""
    lock = Lock(client, "jobs", ttl=5)
    lease = lock.acquire(owner="t1", reentrant=False, job="t1.0.0")
    lease.release(finish_job="t1.0.0", keep=60)
    with pytest.raises(JobFinished) as refused:
        lock.acquire(blocking=False, owner="t1", reentrant=False, job="t1.0.0")
    assert refused.value.job == "t1.0.0" and refused.value.name == "jobs"
    lock.acquire(blocking=False, owner="t1", reentrant=False, job="t1.1.0").release()  # a retry
    short = Lock(client, "jobs-lapsed", ttl=0.2)
    lapsed = short.acquire(job="t2.0.0")
    wait_for(lambda: not short.holders(), "the lease lapsed", 30)
    with pytest.raises(LockNotOwned):
        lapsed.release(finish_job="t2.0.0", keep=60)
    with pytest.raises(JobFinished):
        short.acquire(blocking=False, job="t2.0.0")
    assert 55_000 < client.pttl(short.keys.done) <= 60_000
