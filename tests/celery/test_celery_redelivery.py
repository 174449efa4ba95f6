"""Another delivery of a task's message: never run beside the first, never dropped while it is
unknown whether the first finished (issue: nothing lost, nothing doubled).

A broker delivers an ``acks_late`` message again when the worker running it dies (RabbitMQ at
once; a Redis broker after ``visibility_timeout``) or when it outlives the visibility timeout.
The copy finds the first delivery's lease (same task id): it comes back once that lease may have
lapsed, then runs if the first did not finish, and is dropped if it did.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType

import pytest
import redis
from faultproxy import FaultProxy
from helpers import wait_for
from workers import Worker

from celery_redislock import Lock, lock_for
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.scripts import script

ACKS_LATE = {"LOCKAPP_ACKS_LATE": "1", "LOCKAPP_TTL": "6"}


def _signals(lockapp: ModuleType, task_id: str) -> list[str]:
    return [
        entry.decode().split(":", 1)[1]
        for entry in lockapp.r.lrange("signal:lock_conflict", 0, -1)
        if entry.decode().startswith(f"{task_id}:")
    ]


def _watch_lease_gone(lockapp: ModuleType, name: str, token: str) -> float:
    """Waits until the lease ``token`` of ``hold:<name>`` is gone; returns when (time.time())."""
    lock = lock_for(lockapp.hold, (name,))
    wait_for(
        lambda: token not in [h.token for h in lock.holders()], "the dead run's lease lapsed", 30
    )
    return time.time()


@pytest.mark.faults
@pytest.mark.slow
def test_whole_worker_killed_redelivery_runs_after_the_dead_lease_lapses(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """Redis broker, the whole worker SIGKILLed mid-run: the broker redelivers after the
    visibility timeout while the dead run's lease still lives (ttl 12 s > 2 s). The copy must
    neither run beside that lease nor be dropped: it runs once the lease lapsed, and the task
    ends SUCCESS. (On 2dbb8d2 the copy was acknowledged and dropped: PENDING for ever.)"""
    env = {**ACKS_LATE, "LOCKAPP_VT": "2", "LOCKAPP_TTL": "12"}
    first_worker = workers(name="w1", env=env)
    result = lockapp.hold.apply_async(("k", 60.0))
    wait_for(lambda: lockapp.r.llen("started:k") == 1, "first delivery running", 30)
    token = lock_for(lockapp.hold, ("k",)).holders()[0].token
    first_worker.kill()  # main process and pool together: nobody releases the lease
    lockapp.r.set("stop:k", 1)  # the next run of the body ends at once
    # Older kombu restores overdue unacked messages only as a worker starts: start w2 once the
    # message is overdue.
    wait_for(
        lambda: lockapp.r.zcount("unacked_index", "-inf", time.time() - 2.0) > 0,
        "the dead run's message overdue",
        10,
    )
    workers(name="w2", env=env)  # restores the overdue unacked message
    wait_for(lambda: "await" in _signals(lockapp, result.id), "the copy waited", 30)
    gone_at = _watch_lease_gone(lockapp, "k", token)
    assert result.get(timeout=30) == "return"
    assert result.state == "SUCCESS"
    starts = [float(t) for t in lockapp.r.lrange("started-at:k", 0, -1)]
    assert len(starts) == 2
    assert starts[1] >= gone_at - 0.05, "the copy ran while the dead run's lease was live"
    # The copy that waited ran (2 starts, SUCCESS) rather than being dropped. (With a 2 s
    # visibility timeout the broker may restore one of its waiting messages once more; that
    # extra copy is dropped by the finish record the run left: a drop signal may follow.)


def test_copy_of_a_finished_delivery_is_dropped_not_run_again(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """The same message delivered again after its first delivery ran to its end (its ack lost
    with its worker): it is dropped, and the first run's result stands."""
    workers(name="w1", env=ACKS_LATE)
    first = lockapp.hold.apply_async(("f", 0.0))
    assert first.get(timeout=30) == "return"
    lockapp.hold.apply_async(("f", 0.0), task_id=first.id)  # the redelivery
    wait_for(lambda: "drop" in _signals(lockapp, first.id), "the copy dropped", 30)
    assert lockapp.r.llen("started:f") == 1
    assert first.state == "SUCCESS" and first.get(timeout=5) == "return"


def test_retry_of_a_finished_delivery_still_runs(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """A run that called self.retry() is not 'finished': its retry (same task id) runs."""
    workers(name="w1", env=ACKS_LATE)
    result = lockapp.hold.apply_async(("t", 0.0, "retry"))
    assert result.get(timeout=30) == "retry"
    assert lockapp.r.lrange("ended:t", 0, -1) == [
        f"{result.id}:retry:0".encode(),
        f"{result.id}:retry:1".encode(),
    ]


@pytest.mark.slow
def test_visibility_timeout_copy_waits_for_the_running_delivery_then_is_dropped(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """acks_late and a 1 s visibility timeout: the broker hands the message of a task running
    for longer to a worker again. The copy never runs beside the first; it waits while the first
    renews, and is dropped once the first finished (not before: a first delivery that died
    would leave it to run)."""
    env = {"LOCKAPP_ACKS_LATE": "1", "LOCKAPP_VT": "1"}
    workers(name="w1", env=env)
    first = lockapp.hold.apply_async(("v", 30.0))
    wait_for(lambda: lockapp.r.llen("started:v") == 1, "first delivery running", 30)
    # The fault: the task outlives the visibility timeout (its unacked message is overdue).
    wait_for(
        lambda: lockapp.r.zcount("unacked_index", "-inf", time.time() - 1.0) > 0,
        "the running task's message overdue",
        10,
    )
    workers(name="w2", env=env)
    wait_for(
        lambda: "await" in _signals(lockapp, first.id),
        "the broker redelivered the running task and the copy waited",
        60,
    )
    assert "drop" not in _signals(lockapp, first.id)
    assert lockapp.r.llen("started:v") == 1
    lockapp.r.set("stop:v", 1)
    assert first.get(timeout=30) == "return"
    wait_for(lambda: "drop" in _signals(lockapp, first.id), "the copy dropped after", 60)
    assert lockapp.r.llen("started:v") == 1
    assert first.state == "SUCCESS"


@pytest.mark.slow
def test_copy_of_a_task_that_is_not_acks_late_runs_after_the_first(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """Without acks_late a message is acknowledged as it starts, so no broker delivers it
    twice; a second message with the same id (sent again by hand) waits for the first run and
    then runs: never beside it, never dropped."""
    workers(name="w1")
    workers(name="w2")
    first = lockapp.hold.apply_async(("r", 1.0))
    wait_for(lambda: lockapp.r.llen("started:r") == 1, "first delivery running", 30)
    lockapp.hold.apply_async(("r", 0.0), task_id=first.id)
    wait_for(lambda: lockapp.r.llen("started:r") == 2, "the copy ran", 30)
    first_end = float(lockapp.r.lrange("started-at:r", 0, 0)[0]) + 1.0
    assert float(lockapp.r.lrange("started-at:r", 1, 1)[0]) >= first_end - 0.05
    assert "await" in _signals(lockapp, first.id)


@pytest.mark.faults
def test_lost_reply_on_acquire_under_retry_policy_runs_the_task_once(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """The worker's acquire runs in Redis and its reply is lost (connection reset after Redis
    answered). redis-py sends it again: the same token gets the same lease back, so the task
    runs, once. (On 2dbb8d2 the second run found the task's own lease, the delivery was dropped
    as a running copy and the task stayed RETRY/PENDING for ever.)"""
    host, port = lockapp.URL.split("//", 1)[1].split("/", 1)[0].split(":")
    with FaultProxy(host, int(port)) as proxy:
        workers(
            name="w1",
            env={
                "LOCKAPP_LOCK_URL": f"{proxy.url}?socket_timeout=1",
                "LOCKAPP_BACKEND_POLICY": "retry",
            },
        )
        for name in ("acquire", "release", "renew"):  # loaded: the first EVALSHA runs
            lockapp.r.script_load(script(name).script)
        before = proxy.seen("EVALSHA")
        proxy.reset_after(1, command="EVALSHA")
        result = lockapp.hold.apply_async(("o", 0.0))
        assert result.get(timeout=30) == "return"
        assert proxy.faults == 1 and proxy.seen("EVALSHA") > before
    assert lockapp.r.llen("started:o") == 1
    assert not lock_for(lockapp.hold, ("o",)).holders()


@pytest.mark.faults
def test_lock_redis_restarted_mid_run_the_task_sees_it_lost_and_fences_grow(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """The lock Redis restarts without persistence while a task holds its lease: the lease is
    gone (the documented window: another copy may now run), the task is told (LockLost from
    check(), the lock_lost signal), and the next holder's fence is still greater."""
    with RedisServer() as lock_redis:
        workers(env={"LOCKAPP_LOCK_URL": lock_redis.url, "LOCKAPP_TTL": "3"})
        result = lockapp.watch_lease.delay("rs", 60)
        wait_for(lambda: lockapp.r.exists("lease:rs"), "the task holds its lease", 30)
        fence = int(lockapp.r.hget("lease:rs", "fence"))
        lock_redis.restart()
        assert result.get(timeout=15) == "lost"
        wait_for(lambda: lockapp.r.llen("signal:lock_lost") == 1, "lock_lost signalled", 15)
        after = Lock(redis.Redis.from_url(lock_redis.url), "hold:rs", ttl=3).acquire(blocking=False)
        assert after.fence > fence
        after.release()
