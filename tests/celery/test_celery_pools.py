"""Skips, retries, waits, lost leases, and the three pools, with real workers."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from types import ModuleType

import pytest
import redis
from celery import chain, chord, group
from celery.exceptions import ChordError
from helpers import wait_for, wait_until_queued
from workers import Worker

from celery_redislock import Lock, LockBackendError, LockNotAcquired, TaskSkipped, lock_for
from celery_redislock.contrib.redis_server import RedisServer

POOLS = {
    "prefork": [{"pool": "prefork", "concurrency": 2}],
    "threads": [{"pool": "threads", "concurrency": 2}],
    "solo": [{"pool": "solo", "name": "w1"}, {"pool": "solo", "name": "w2"}],
}


@pytest.mark.slow  # about 9 s on 2 quiet cores
@pytest.mark.parametrize("pool", sorted(POOLS))
def test_pool_renews_while_running_skips_duplicates_and_releases(
    lockapp: ModuleType, workers: Callable[..., Worker], pool: str
) -> None:
    # A ttl of 3 s, renewed every second: a renewal late by 2 s on a busy machine still lands
    # (with 1 s, 2 CPU burners made one lease lapse and the late copy ran).
    for options in POOLS[pool]:
        workers(env={"LOCKAPP_TTL": "3"}, **options)
    lock = lock_for(lockapp.hold, ("p",))
    first = lockapp.hold.delay("p", 60)
    wait_for(lambda: lockapp.r.llen("started:p") == 1, "first run started", 30)
    (holder,) = lock.holders()
    time.sleep(7.5)  # an observation window of 2.5 ttls: only renewal can keep the lease
    assert [h.token for h in lock.holders()] == [holder.token]
    late = lockapp.hold.delay("p", 0)
    with pytest.raises(TaskSkipped) as skipped:
        late.get(timeout=30)
    assert skipped.value.name == "hold:p"
    assert skipped.value.holders == [first.id]
    lockapp.r.set("stop:p", 1)
    assert first.get(timeout=30) == "return"
    wait_for(lambda: not lock.locked(), "released", 30)
    assert lockapp.r.llen("started:p") == 1


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_lost_lease_is_seen_by_the_task_logged_and_signalled(
    lockapp: ModuleType, workers: Callable[..., Worker], pool: str
) -> None:
    worker = workers(pool=pool, env={"LOCKAPP_TTL": "1.5"})
    result = lockapp.watch_lease.delay("l", 30)
    wait_for(lambda: lockapp.r.exists("lease:l"), "the task read its lease", 30)
    lease = {k.decode(): v.decode() for k, v in lockapp.r.hgetall("lease:l").items()}
    assert lease["name"] == "hold:l" and lease["mode"] == "write" and int(lease["fence"]) > 0
    lock = lock_for(lockapp.watch_lease, ("l", 30))
    lockapp.r.delete(*lock.keys.all)  # the lease vanishes (flush, failover, a bad script)
    assert result.get(timeout=10) == "lost"  # within one heartbeat (0.5 s) + the task's poll
    lost = [m.decode() for m in lockapp.r.lrange("lost:l", 0, -1)]
    assert lost == [f"lease {lease['token']} of lock 'hold:l' was lost"]
    assert lockapp.r.lrange("signal:lock_lost", 0, -1) == [f"{result.id}:hold:l".encode()]
    assert "ERROR" in worker.log() and "lease on lock 'hold:l' lost" in worker.log()


def test_retry_on_conflict_does_not_spend_the_task_retry_budget(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers()
    lockapp.hold.delay("q", 60)
    wait_for(lambda: lockapp.r.llen("started:q") == 1, "holder running", 30)
    dup = lockapp.duplicate.delay("q")
    retried = f"{dup.id}:retry".encode()
    # More conflict retries than its own max_retries (3) allows, and it is still retrying.
    wait_for(
        lambda: lockapp.r.lrange("signal:lock_conflict", 0, -1).count(retried) >= 5,
        "five conflict retries",
        30,
    )
    lockapp.r.set("stop:q", 1)
    assert dup.get(timeout=30) == "ran"
    assert lockapp.r.lrange("dup-retries:q", 0, -1) == [b"0"]  # request.retries untouched
    lockapp.r.delete("stop:q")
    lockapp.hold.delay("q", 60)
    wait_for(lambda: lockapp.r.llen("started:q") == 2, "holder running again", 30)
    counted = lockapp.counted_duplicate.delay("q")
    with pytest.raises(LockNotAcquired, match="lock 'hold:q' is held"):
        counted.get(timeout=30)  # asked to count: its own budget of 2 ran out
    assert (
        lockapp.r.lrange("signal:lock_conflict", 0, -1).count(f"{counted.id}:retry".encode()) == 3
    )
    lockapp.r.set("stop:q", 1)


def test_wait_on_conflict_runs_when_the_holder_ends(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers(pool="threads", concurrency=3)
    lock = lock_for(lockapp.hold, ("w",))
    holder = lockapp.hold.delay("w", 60)
    wait_for(lambda: lockapp.r.llen("started:w") == 1, "holder running", 30)
    waiter = lockapp.waits_and_notes.delay("w")
    wait_until_queued(lockapp.r, lock)  # blocked in the lock's line, not run
    gives_up = lockapp.waiting_briefly.delay("w")
    with pytest.raises(LockNotAcquired, match=r"held by .* after waiting 0.3s"):
        gives_up.get(timeout=30)
    assert lockapp.r.llen("started:waited:w") == 0
    stopped_at = time.time()
    lockapp.r.set("stop:w", 1)  # the holder could not end before this
    assert holder.get(timeout=30) == "return"
    assert waiter.get(timeout=30) == "ran"
    assert float(lockapp.r.lindex("started-at:waited:w", 0)) >= stopped_at


@pytest.mark.slow  # about 5 s on 2 quiet cores
def test_raise_on_conflict_fails_the_task_naming_the_holder(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers()
    holder = lockapp.hold.delay("x", 60)
    wait_for(lambda: lockapp.r.llen("started:x") == 1, "holder running", 30)
    with pytest.raises(LockNotAcquired, match=f"lock 'hold:x' is held by {holder.id}"):
        lockapp.strict.delay("x").get(timeout=30)
    lockapp.r.set("stop:x", 1)


def test_a_skipped_run_is_an_answer_that_get_groups_chains_and_errbacks_see(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """A skipped run ends FAILURE with TaskSkipped naming the lock and its holder: ``.get()``
    raises it at once (the bound is a liveness bound: SKIPPED as a state of its own left it
    waiting for ever), a group, a chord and a chain answer, a ``link_error`` callback runs, and the
    worker logs it at INFO as expected, with no traceback."""
    worker = workers()
    holder = lockapp.hold.delay("s", 60)
    wait_for(lambda: lockapp.r.llen("started:s") == 1, "holder running", 30)
    skipped = lockapp.hold.delay("s", 0)
    with pytest.raises(TaskSkipped, match=f"skipped: lock 'hold:s' is held by {holder.id}") as e:
        skipped.get(timeout=30)
    assert (e.value.name, e.value.holders, e.value.outcome) == ("hold:s", [holder.id], "skipped")
    assert skipped.state == "FAILURE"
    assert isinstance(skipped.get(propagate=False), TaskSkipped)
    assert lockapp.r.lrange("signal:lock_conflict", 0, -1) == [f"{skipped.id}:skip".encode()]

    with pytest.raises(TaskSkipped):
        group(lockapp.hold.si("s", 0), lockapp.hold.si("s", 0)).apply_async().get(timeout=30)
    # (ChordError naming it, or the error itself: as the Celery release reports a failed member)
    with pytest.raises((ChordError, TaskSkipped), match="skipped: lock 'hold:s'"):
        chord([lockapp.hold.si("s", 0), lockapp.echo.si("h")])(lockapp.echo.s()).get(timeout=30)
    links = chain(lockapp.hold.si("s", 0), lockapp.echo.si("after")).apply_async()
    with pytest.raises(TaskSkipped):
        links.get(timeout=30)
    # (.get() raised the first link's error as soon as it was stored: the later one follows)
    wait_for(lambda: links.state == "FAILURE", "the chain's later link is marked failed", 30)
    failed = lockapp.hold.apply_async(("s", 0), link_error=lockapp.note_errback.s())
    wait_for(lambda: lockapp.r.lrange("errback", 0, -1) == [failed.id.encode()], "errback ran", 30)
    assert lockapp.r.lrange("echo", 0, -1) == [b"'h'"], "no step after a skipped one ran"
    assert lockapp.r.llen("started:s") == 1

    wait_for(lambda: "raised expected: TaskSkipped" in worker.log(), "logged as expected", 10)
    log = worker.log()
    assert f"{skipped.id}] skipped: lock 'hold:s' is held by {holder.id}" in log
    # (The chord's failure is Celery's own ERROR line; no run of the task logs one.)
    assert not re.search(r"(ERROR|WARNING)/\S+\] Task lockapp\.hold\[", log), log
    lockapp.r.set("stop:s", 1)
    assert holder.get(timeout=30) == "return"


def test_a_skipped_eager_run_answers_alike(lockapp: ModuleType) -> None:
    """``apply()`` (and ``task_always_eager``): the same FAILURE with TaskSkipped."""
    lease = lock_for(lockapp.hold, ("e",)).acquire(blocking=False)
    try:
        result = lockapp.hold.apply(("e", 0))
        assert result.state == "FAILURE"
        with pytest.raises(TaskSkipped, match="lock 'hold:e' is held by"):
            result.get()
    finally:
        lease.release()
    assert lockapp.r.llen("started:e") == 0


def test_redis_for_locks_down_fails_the_task_by_default(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    # Locks on a Redis nobody listens on; broker and results still work.
    worker = workers(env={"LOCKAPP_LOCK_URL": "redis://127.0.0.1:1/0"})
    with pytest.raises(LockBackendError, match="Redis failed"):
        lockapp.hold.delay("d", 0).get(timeout=30)
    assert lockapp.r.llen("started:d") == 0  # never ran unlocked
    wait_for(lambda: "LockBackendError" in worker.log(), "the failure logged", 10)


@pytest.mark.slow  # about 4 s on 2 quiet cores
def test_locks_on_another_redis_than_the_broker(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    with RedisServer() as lock_redis:
        workers(name="w1", env={"LOCKAPP_LOCK_URL": lock_redis.url})
        workers(name="w2", env={"LOCKAPP_LOCK_URL": lock_redis.url})
        lock = Lock(redis.Redis.from_url(lock_redis.url), "hold:o", ttl=30)
        first = lockapp.hold.delay("o", 60)
        wait_for(lambda: lockapp.r.llen("started:o") == 1, "holder running", 30)
        assert [h.info["task_id"] for h in lock.holders()] == [first.id]
        assert not lock_for(lockapp.hold, ("o",)).locked()  # nothing on the broker's Redis
        late = lockapp.hold.delay("o", 0)
        with pytest.raises(TaskSkipped):
            late.get(timeout=30)
        lockapp.r.set("stop:o", 1)
        assert first.get(timeout=30) == "return"
        wait_for(lambda: not lock.locked(), "released", 5)


@pytest.mark.faults
@pytest.mark.slow
def test_lock_redis_paused_past_the_lease_the_task_sees_it_lost(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    with RedisServer() as lock_redis:
        workers(env={"LOCKAPP_LOCK_URL": lock_redis.url, "LOCKAPP_TTL": "1.5"})
        result = lockapp.watch_lease.delay("z", 30)
        wait_for(lambda: lockapp.r.exists("lease:z"), "the task holds its lease", 30)
        lock_redis.pause()
        try:
            # While Redis is still frozen, the task learns its lease may have lapsed.
            assert result.get(timeout=10) == "lost"
        finally:
            lock_redis.resume()
        wait_for(lambda: lockapp.r.llen("signal:lock_lost") == 1, "lock_lost signalled", 15)
        fresh = Lock(redis.Redis.from_url(lock_redis.url), "hold:z", ttl=1)
        wait_for(lambda: not fresh.locked(), "the lapsed lease gone", 30)


@pytest.mark.slow
def test_max_hold_stops_renewal_and_the_task_sees_the_lease_lapse(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    worker = workers()
    result = lockapp.held_briefly.delay("mh", 30)
    assert result.get(timeout=60) == "lost"
    assert "reached its maximum hold; no longer renewed" in worker.log()
    assert "lapsed before Redis answered" not in worker.log()  # (stopped, not lost)
    # Redis lets it lapse within the lease's drift margin after the task saw it lost.
    lock = lock_for(lockapp.held_briefly, ("mh", 30))
    wait_for(lambda: not lock.locked(), "the lease lapsed in Redis", 30)
