"""RQ jobs under faults: a horse SIGKILLed (with and without the parent-side release), the job
timeout, a worker SIGKILLed while its horse lives on and RQ requeues the job, and a lock Redis
apart from the queues' (unreachable, too)."""

from __future__ import annotations

import contextlib
import os
import re
import signal

import pytest
import redis
import rqjobs
from helpers import alive, free_port, wait_for
from rq import Queue
from rq.job import Job
from rqcheck import spans, started, status, wait_ended
from rqworkers import HAS_SPAWN

from celery_redislock import Lock
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.integrations.rq import SKIPPED, outcome_of


def _lock(url: str, key: str) -> Lock:
    return Lock(redis.Redis.from_url(url), f"h:{key}", ttl=6)


def _horse(conn: redis.Redis, kind: str = "hold", n: int = 1, timeout: float = 30) -> int:
    wait_for(lambda: len(started(conn, kind)) >= n, f"{n} {kind} job(s) started", timeout)
    return int(started(conn, kind)[n - 1]["pid"])


@pytest.fixture
def orphans():
    """Pids of horses a test orphaned (their worker SIGKILLed): killed at teardown."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("worker_class", ["LockWorker"] + ["LockSpawnWorker"] * HAS_SPAWN)
def test_a_killed_horse_is_released_by_the_parent_at_once(
    rq_conn, rq_server, rq_workers, worker_class
):
    workers = [rq_workers(name=f"w{i}", worker_class=worker_class) for i in range(2)]
    q = Queue("default", connection=rq_conn)
    first = q.enqueue(rqjobs.hold_long, "a")
    pid = _horse(rq_conn)
    waiting = q.enqueue(rqjobs.hold_long, "a")
    lock = _lock(rq_server.url, "a")
    wait_for(lambda: rq_conn.zcard(lock.keys.all[2]) == 1, "the second copy waits in line")
    os.kill(pid, signal.SIGKILL)
    # Promise: freed as soon as RQ's wait4 on the horse returns, not left to lapse (the ttl is
    # 30 s: with 6 s, a parent slow to see the death on a busy machine found the lease lapsed
    # and had nothing to release). The parent logs a release only of a lease still there.
    wait_for(lambda: len(started(rq_conn, "hold")) == 2, "the waiting copy starts", timeout=60)
    released = f"lock 'h:a' released: horse {pid} running"
    wait_for(lambda: any(released in w.log() for w in workers), "the parent's release logged", 30)
    assert wait_ended([first]) == ["failed"]
    rq_conn.set("stop:a", 1)
    assert wait_ended([waiting]) == ["finished"]


@pytest.mark.slow
def test_without_the_worker_class_a_killed_horse_lapses_within_ttl(rq_conn, rq_server, rq_workers):
    rq_workers(name="w0", worker_class="Worker")
    q = Queue("default", connection=rq_conn)
    job = q.enqueue(rqjobs.hold, "b")
    pid = _horse(rq_conn)
    lock = _lock(rq_server.url, "b")
    client = redis.Redis.from_url(rq_server.url)
    [holder] = lock.holders()
    assert holder.expires_in <= 6  # it lapses within its ttl, unless renewed
    expires_at_ms = client.zscore(lock.keys.leases, holder.token)  # (a renewal: only later)
    assert expires_at_ms is not None
    os.kill(pid, signal.SIGKILL)
    assert wait_ended([job]) == ["failed"]  # RQ saw its horse die...
    # ...and nobody freed the lease: it lapses on its own, not before its expiry on Redis's
    # clock (a release would free it sooner; the 60 s: liveness only).
    wait_for(lambda: not lock.locked(), "the dead horse's lease lapses", timeout=60)
    seconds, micros = client.time()
    assert seconds * 1000 + micros / 1000 >= expires_at_ms - 1, "freed before it lapsed"


@pytest.mark.parametrize("worker_class", ["LockWorker", "rqjobs.PlainWorker"])
def test_the_job_timeout_ends_the_hold(rq_conn, rq_server, rq_workers, worker_class):
    rq_workers(name="w0", worker_class=worker_class)
    q = Queue("default", connection=rq_conn)
    job = q.enqueue(rqjobs.hold, "t", job_timeout=2)
    _horse(rq_conn)
    lock = _lock(rq_server.url, "t")
    assert lock.locked()
    assert wait_ended([job], timeout=20) == ["failed"]
    assert "JobTimeoutException" in (job.latest_result().exc_string or "")
    # The horse's finally released it (no lapse: the ttl is 6 s).
    assert not lock.locked()


@pytest.mark.slow
def test_a_copy_requeued_beside_its_orphaned_horse_waits_and_is_dropped_once_it_finished(
    rq_conn, rq_server, rq_workers, orphans
):
    w0 = rq_workers(name="w0")
    q = Queue("default", connection=rq_conn)
    job = q.enqueue(rqjobs.hold, "o")
    pid = _horse(rq_conn)
    orphans.append(pid)
    w0.kill_parent()  # its horse, in a process group of its own, runs on
    w0.forget_scheduler(rq_conn)
    assert alive(pid)
    # What RQ's abandoned-job handling does with a job that may be retried: queue it again.
    q.enqueue_job(Job.fetch(job.id, connection=rq_conn))
    rq_workers(name="w1")
    lock = _lock(rq_server.url, "o")
    wait_for(
        lambda: Job.fetch(job.id, connection=rq_conn).meta.get("redislock_waits", 0) >= 2,
        "the copy found its orphan's lease twice",
        timeout=30,
    )
    assert len(started(rq_conn, "hold")) == 1  # never beside the orphan, which renews its lease
    assert [h.info["pid"] for h in lock.holders()] == [str(pid)]
    rq_conn.set("stop:o", 1)
    wait_for(lambda: not alive(pid), "the orphan ends")
    wait_for(
        lambda: outcome_of(Job.fetch(job.id, connection=rq_conn)) is not None,
        "the copy is dropped",
        timeout=30,
    )
    copy = Job.fetch(job.id, connection=rq_conn)
    assert outcome_of(copy) == {"outcome": "finished", "lock": "h:o", "holders": [job.id]}
    # (the outcome is noted as the copy returns; RQ stores what it returned just after)
    wait_for(lambda: copy.return_value(refresh=True) == SKIPPED, "the copy's result is stored")
    assert len(spans(rq_conn, "hold")) == 1


@pytest.mark.slow
def test_a_copy_requeued_beside_its_orphaned_horse_runs_once_the_orphan_died(
    rq_conn, rq_server, rq_workers, orphans
):
    w0 = rq_workers(name="w0")
    q = Queue("default", connection=rq_conn)
    job = q.enqueue(rqjobs.hold, "d")
    pid = _horse(rq_conn)
    orphans.append(pid)
    w0.kill_parent()
    w0.forget_scheduler(rq_conn)
    q.enqueue_job(Job.fetch(job.id, connection=rq_conn))
    w1 = rq_workers(name="w1")
    wait_for(
        lambda: Job.fetch(job.id, connection=rq_conn).meta.get("redislock_waits", 0) >= 1,
        "the copy found its orphan's lease",
        timeout=30,
    )
    os.kill(pid, signal.SIGKILL)  # the orphan dies: nothing releases its lease, it lapses
    _horse(rq_conn, n=2, timeout=60)  # (liveness only)
    # It lapses within its ttl (6 s); the copy looks again at most a ttl/3-doubled backoff
    # later, capped by the lapse (plus up to 0.5 s of jitter): no look it announced was later.
    looks = [float(s) for s in re.findall(r"this one looks again in ([0-9.]+)s", w1.log())]
    assert looks and max(looks) <= 6 + 0.5, looks
    rq_conn.set("stop:d", 1)
    wait_for(lambda: status(job) == "finished", "the copy finishes", timeout=30)
    assert len(spans(rq_conn, "hold")) == 1  # the orphan was killed before it noted its end


def test_the_lock_redis_may_be_another_server(rq_conn, rq_workers, tmp_path):
    with RedisServer() as locks:
        rq_workers(name="w0", env={"REDISLOCK_URL": locks.url})
        q = Queue("default", connection=rq_conn)
        job = q.enqueue(rqjobs.hold, "s")
        _horse(rq_conn)
        assert _lock(locks.url, "s").locked()
        assert rq_conn.keys("redislock:*") == []
        rq_conn.set("stop:s", 1)
        assert wait_ended([job]) == ["finished"]
        assert not _lock(locks.url, "s").locked()


@pytest.mark.parametrize(("policy", "ending"), [("fail", "failed"), ("run", "finished")])
def test_an_unreachable_lock_redis_follows_the_backend_policy(rq_conn, rq_workers, policy, ending):
    env = {
        "REDISLOCK_URL": f"redis://127.0.0.1:{free_port()}",
        "REDISLOCK_ON_BACKEND_ERROR": policy,
    }
    rq_workers(name="w0", env=env)
    q = Queue("default", connection=rq_conn)
    job = q.enqueue(rqjobs.exclusive, "down", 0.0)
    assert wait_ended([job], timeout=30) == [ending]
    if ending == "failed":
        assert "LockBackendError" in (job.latest_result().exc_string or "")
    else:
        assert len(spans(rq_conn, "exclusive")) == 1


def test_a_horse_forked_while_the_sweeper_is_inside_the_connection_pool_runs_its_job(
    rq_conn, rq_workers
):
    """The sweeper thread of a ``LockWorker``'s main process uses RQ's connection (the lock
    client too, without REDISLOCK_URL); a horse forked in the instant that thread is inside its
    connection pool would inherit the pool taken (redis-py 8 takes the pool's lock as it resets
    it for the horse) and hang at its first call. Here the sweeper holds the pool as the worker
    forks, for certain: the fork must wait for the sweeper's call (the fork guard)."""
    # (No scheduler: a fork of its own. The job has no lock: the parent makes no call before
    # the fork while the sweeper holds the pool.)
    worker = rq_workers(name="w1", worker_class="rqjobs.ForkNotingWorker", scheduler=False)
    rq_conn.set("fork:note", 1)
    job = Queue("default", connection=rq_conn).enqueue(rqjobs.pid)
    assert wait_ended([job]) == ["finished"]
    assert [e.decode() for e in rq_conn.lrange("fork:events", 0, -1)] == [
        "fork waits",
        "released",
        "forked",
    ]
    horse = Job.fetch(job.id, connection=rq_conn).return_value()
    assert isinstance(horse, int) and horse != worker.pid  # ran in a horse
