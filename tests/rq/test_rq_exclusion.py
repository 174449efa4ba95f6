"""RQ jobs under real ``rq worker`` processes: exclusion per key, caps, read/write, retries and
the visible skip, for every worker class."""

from __future__ import annotations

import pytest
import redis
import rqjobs
from helpers import wait_for, wait_until_queued
from rq import Queue
from rq.job import Job
from rqcheck import most_at_once_per_key, spans, started, wait_ended
from rqworkers import HAS_SPAWN

from celery_redislock import Lock
from celery_redislock.errors import LockNotAcquired
from celery_redislock.integrations.rq import SKIPPED, outcome_of

# Through RQ's own forking worker or a spawning one, the load test takes over 10 s on a loaded
# machine.
WORKER_CLASSES = ["LockWorker", "SimpleWorker", pytest.param("Worker", marks=pytest.mark.slow)] + [
    pytest.param("LockSpawnWorker", marks=pytest.mark.slow)
] * HAS_SPAWN


@pytest.mark.parametrize("worker_class", WORKER_CLASSES)
def test_one_per_key_under_load_and_every_job_runs(rq_conn, rq_workers, worker_class):
    for n in range(3):
        rq_workers(name=f"w{n}", worker_class=worker_class)
    q = Queue("default", connection=rq_conn)
    jobs = [q.enqueue(rqjobs.exclusive, f"k{i % 3}", 0.05) for i in range(15)]
    assert wait_ended(jobs, timeout=90) == ["finished"] * 15
    ran = spans(rq_conn, "exclusive")
    assert sorted(r["job"] for r in ran) == sorted(j.id for j in jobs)
    assert most_at_once_per_key(ran) == {"k0": 1, "k1": 1, "k2": 1}
    assert [j.return_value() for j in jobs] == ["ran"] * 15


def test_a_worker_pool_runs_them_too(rq_conn, rq_workers):
    rq_workers(name="pool", pool=2)
    q = Queue("default", connection=rq_conn)
    jobs = [q.enqueue(rqjobs.exclusive_retry, f"p{i % 2}", 0.2) for i in range(6)]
    assert wait_ended(jobs, timeout=90) == ["finished"] * 6
    ran = spans(rq_conn, "exclusive_retry")
    assert sorted(r["job"] for r in ran) == sorted(j.id for j in jobs)
    assert most_at_once_per_key(ran) == {"p0": 1, "p1": 1}


def test_cap_is_reached_and_never_exceeded(rq_conn, rq_workers):
    for n in range(3):
        rq_workers(name=f"w{n}")
    q = Queue("default", connection=rq_conn)
    jobs = [q.enqueue(rqjobs.capped, i, 0.4) for i in range(9)]
    assert wait_ended(jobs, timeout=90) == ["finished"] * 9
    # Three workers, a cap of two: the third job in hand always waits.
    assert most_at_once_per_key(spans(rq_conn, "capped")) == {"cap": 2}


def test_readers_overlap_and_no_writer_beside_them(rq_conn, rq_server, rq_workers):
    for n in range(3):
        rq_workers(name=f"w{n}")
    q = Queue("default", connection=rq_conn)
    readers = [q.enqueue(rqjobs.reader, "doc", hold=True) for _ in range(2)]
    wait_for(lambda: len(started(rq_conn, "reader")) == 2, "both readers hold the lock at once")
    writer = q.enqueue(rqjobs.writer, "doc", 0.2)
    lock = Lock(redis.Redis.from_url(rq_server.url), "rw:doc", ttl=15)
    wait_until_queued(rq_conn, lock)  # the writer waits in line behind the two readers
    assert started(rq_conn, "writer") == []
    assert sorted(h.mode for h in lock.holders()) == ["read", "read"]
    rq_conn.set("stop:doc", 1)
    assert wait_ended([*readers, writer]) == ["finished"] * 3
    (w,) = spans(rq_conn, "writer")
    assert all(r["end"] <= w["start"] for r in spans(rq_conn, "reader"))


@pytest.mark.slow
def test_conflict_retries_are_never_dropped(rq_conn, rq_server, rq_workers):
    for n in range(2):
        rq_workers(name=f"w{n}")
    q = Queue("default", connection=rq_conn)
    # The test holds the lock until a job met it (two workers alone may run the jobs one after
    # the other on a busy machine, and none would retry).
    held = Lock(redis.Redis.from_url(rq_server.url), "r:one", ttl=60).acquire()
    jobs = [q.enqueue(rqjobs.exclusive_retry, "one", 0.3) for _ in range(4)]

    def met() -> bool:
        for j in jobs:
            j.refresh()
        return any(j.meta.get("redislock_conflicts") for j in jobs)

    wait_for(met, "a job met the lock held", 60)
    held.release()
    assert wait_ended(jobs, timeout=120) == ["finished"] * 4
    ran = spans(rq_conn, "exclusive_retry")
    assert sorted(r["job"] for r in ran) == sorted(j.id for j in jobs)
    assert most_at_once_per_key(ran) == {"one": 1}
    for j in jobs:
        j.refresh()
    retried = [j for j in jobs if j.meta.get("redislock_conflicts")]
    assert retried, "two workers on one key: some job must have met the lock held"


def test_skip_is_a_visible_outcome(rq_conn, rq_server, rq_workers):
    rq_workers(name="w0")
    q = Queue("default", connection=rq_conn)
    lock = Lock(redis.Redis.from_url(rq_server.url), "s:busy", ttl=30)
    with lock.acquire(owner="test", info={"task_id": "the-test"}):
        job = q.enqueue(rqjobs.exclusive_skip, "busy")
        assert outcome_of(job) is None  # queued: nothing to say yet
        assert wait_ended([job]) == ["finished"]
    # On the very Job that enqueue returned (its meta cached at enqueue), as on a fetched one.
    skipped = {"outcome": "skipped", "lock": "s:busy", "holders": ["the-test"]}
    assert outcome_of(job) == skipped
    assert outcome_of(Job.fetch(job.id, connection=rq_conn)) == skipped
    assert job.return_value() == SKIPPED
    assert spans(rq_conn, "exclusive_skip") == []


def test_raise_fails_the_job_naming_the_lock(rq_conn, rq_server, rq_workers):
    rq_workers(name="w0")
    q = Queue("default", connection=rq_conn)
    lock = Lock(redis.Redis.from_url(rq_server.url), "r:busy", ttl=30)
    with lock.acquire(owner="test", info={"task_id": "the-test"}):
        job = q.enqueue(rqjobs.exclusive_raise, "busy")
        assert wait_ended([job]) == ["failed"]
    assert "LockNotAcquired" in (job.latest_result().exc_string or "")
    assert "'r:busy' is held by the-test" in job.latest_result().exc_string
    assert spans(rq_conn, "exclusive_raise") == []


def test_a_direct_call_takes_the_lock_too(rq_server, rq_conn, monkeypatch):
    monkeypatch.setenv("REDISLOCK_URL", rq_server.url)
    lock = Lock(redis.Redis.from_url(rq_server.url), "r:direct", ttl=30)
    with lock.acquire(), pytest.raises(LockNotAcquired, match="r:direct"):
        rqjobs.exclusive_raise("direct")


def test_a_call_that_cannot_make_its_lock_name_fails_and_the_worker_goes_on(rq_conn, rq_workers):
    """LockWorker makes a job's locks before it forks the job's horse (so that the horse makes
    its own from one it inherits): a call whose lock name cannot be made fails in its horse,
    saying why, and the worker runs the next job."""
    rq_workers(name="w0")
    q = Queue("default", connection=rq_conn)
    bad = q.enqueue(rqjobs.exclusive)  # no key: the template "x:{key}" cannot be filled
    good = q.enqueue(rqjobs.exclusive, "fine", 0.0)
    assert wait_ended([bad, good]) == ["failed", "finished"]
    failure = bad.latest_result().exc_string or ""
    assert "LockConfigError" in failure and "cannot derive its lock key" in failure
    assert [span["key"] for span in spans(rq_conn, "exclusive")] == ["fine"]


def test_a_worker_without_rqs_scheduler_says_so_as_it_starts(rq_conn, rq_workers):
    """A conflict retry (and every other job that comes back later) is a scheduled job: with no
    scheduler it would stay SCHEDULED for ever, so a LockWorker started without one warns,
    naming the fix; started with one (or in a pool, which runs one), it does not."""
    without = rq_workers(name="w0", scheduler=False)
    with_one = rq_workers(name="w1")
    pool = rq_workers(name="pool", pool=1)
    warning = "runs no RQ scheduler"
    assert warning in without.log()
    assert "--with-scheduler" in without.log() and "with_scheduler=True" in without.log()
    assert warning not in with_one.log()
    assert warning not in pool.log()
