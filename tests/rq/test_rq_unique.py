"""Unique RQ jobs: one job per key from many producers, through every way into a queue, the
duplicate actions, and the claim's end when the job starts, finishes or ends without running."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap

import pytest
import redis
import rqjobs
from helpers import free_port, wait_for
from rq import Queue
from rq.decorators import job as rq_job
from rq.job import Job, Retry
from rqcheck import spans, started, status, wait_ended
from rqworkers import TESTS

from celery_redislock import Lock
from celery_redislock.errors import DuplicateTask
from celery_redislock.integrations.rq import SKIPPED, UniqueQueue, outcome_of
from celery_redislock.integrations.rq.job import spec_of

PRODUCER = textwrap.dedent(
    """
    import sys, time, redis, rqjobs
    from celery_redislock.integrations.rq import UniqueQueue
    conn = redis.Redis.from_url(sys.argv[1])
    while not conn.exists("go"):
        time.sleep(0.001)
    print(UniqueQueue("default", connection=conn).enqueue(rqjobs.report, "2026-11-22").id)
    """
)


def test_producers_racing_get_one_job_and_it_runs_once(rq_conn, rq_server, rq_workers):
    env = {"PYTHONPATH": str(TESTS)}
    producers = [
        subprocess.Popen(
            [sys.executable, "-c", PRODUCER, rq_server.url],
            stdout=subprocess.PIPE,
            env={**os.environ, **env},
        )
        for _ in range(6)
    ]
    rq_conn.set("go", 1)
    ids = {p.communicate(timeout=60)[0].decode().strip() for p in producers}
    assert all(p.returncode == 0 for p in producers)
    assert len(ids) == 1 and "" not in ids
    assert Queue("default", connection=rq_conn).count == 1
    rq_workers(name="w0")
    (job_id,) = ids
    assert wait_ended([Job.fetch(job_id, connection=rq_conn)]) == ["finished"]
    assert [s["job"] for s in spans(rq_conn, "report")] == [job_id]


def test_a_running_copy_is_returned_until_it_finishes(rq_conn, rq_workers):
    q = UniqueQueue("default", connection=rq_conn)
    first = q.enqueue(rqjobs.report, "d", 1.5)
    rq_workers(name="w0")
    wait_for(lambda: started(rq_conn, "report"), "the first copy runs")
    again = q.enqueue(rqjobs.report, "d", 1.5)  # running now: until_finished returns it
    assert again.id == first.id
    assert wait_ended([first]) == ["finished"]
    later = q.enqueue(rqjobs.report, "d", 0.0)
    assert later.id != first.id
    assert wait_ended([later]) == ["finished"]
    assert len(spans(rq_conn, "report")) == 2


def test_a_job_enqueued_from_a_work_horse_is_confirmed_before_the_horse_ends(rq_conn, rq_workers):
    """A work horse ends with os._exit, which runs no exit handler: a unique job it enqueued
    has its claim confirmed before the enqueue returns there, not left to the confirmation
    thread (held back here for 60 s)."""
    rq_workers(name="w0", env={"REDISLOCK_TEST_CONFIRM_LINGER": "60"})
    parent = Queue("default", connection=rq_conn).enqueue(rqjobs.enqueue_report, "from-horse")
    assert wait_ended([parent]) == ["finished"]
    (claim,) = rq_conn.scan_iter(match="*report*:queued")
    assert rq_conn.get(claim).decode() == parent.return_value()
    assert rq_conn.pttl(claim) > 30_000, "confirmed: it lasts its lifetime, not the window"


def test_every_way_into_the_queue_is_checked(rq_conn):
    q = UniqueQueue("default", connection=rq_conn)
    first = q.enqueue(rqjobs.report, "w")
    assert q.enqueue_call(rqjobs.report, args=("w",)).id == first.id
    assert q.enqueue_job(q.create_job(rqjobs.report, args=("w",))).id == first.id
    batch = q.enqueue_many([Queue.prepare_data(rqjobs.report, (day,)) for day in ("w", "x", "x")])
    assert batch[0].id == first.id
    assert batch[1].id == batch[2].id != first.id  # the second "x" is the first one's duplicate
    delayed = rq_job("default", connection=rq_conn, queue_class=UniqueQueue)(rqjobs.report)
    assert delayed.delay("w").id == first.id
    scheduled = q.enqueue_in(dt.timedelta(seconds=60), rqjobs.report, "later")
    assert q.enqueue(rqjobs.report, "later").id == scheduled.id
    assert (
        q.enqueue_at(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=60), rqjobs.report, "later").id
        == scheduled.id
    )
    assert q.count == 2  # "w" and "x"; "later" waits in the scheduled registry
    # A plain Queue checks nothing: that is what UniqueQueue is for.
    assert Queue("default", connection=rq_conn).enqueue(rqjobs.report, "w").id != first.id


def test_raise_names_the_copy_and_a_started_job_frees_its_key(rq_conn, rq_workers):
    q = UniqueQueue("default", connection=rq_conn)
    first = q.enqueue(rqjobs.refresh, "r")
    with pytest.raises(DuplicateTask) as dup:
        q.enqueue(rqjobs.refresh, "r")
    assert dup.value.task_id == first.id and dup.value.state == "queued"
    assert dup.value.name.startswith("rqjobs.refresh:")
    rq_workers(name="w0")
    assert wait_ended([first]) == ["finished"]
    # until_started: the key was freed as the job started.
    second = q.enqueue(rqjobs.refresh, "r")
    assert second.id != first.id


def test_replace_takes_the_queued_copy_off_and_a_late_start_skips_itself(rq_conn, rq_workers):
    q = UniqueQueue("default", connection=rq_conn)
    first = q.enqueue(rqjobs.digest, "p")
    second = q.enqueue(rqjobs.digest, "p")
    assert second.id != first.id
    assert status(first) == "canceled" and q.job_ids == [second.id]
    # Had the cancel been too late (the old copy already taken by a worker), the old copy
    # finds itself superseded as it starts: put it back on the queue by hand to see that.
    Queue("default", connection=rq_conn).enqueue_job(Job.fetch(first.id, connection=rq_conn))
    rq_workers(name="w0")
    assert wait_ended([first, second]) == ["finished", "finished"]
    old = Job.fetch(first.id, connection=rq_conn)
    assert old.return_value() == SKIPPED
    # (the superseding copy ran first here, so it may have gone already: "-")
    assert outcome_of(old) in (
        {"outcome": "superseded", "lock": "digest:p", "holders": holders}
        for holders in ([second.id], ["-"])
    )
    assert [s["job"] for s in spans(rq_conn, "digest")] == [second.id]


def test_a_failed_job_rq_retries_stays_unique_until_it_finished(rq_conn, rq_workers):
    q = UniqueQueue("default", connection=rq_conn)
    first = q.enqueue(rqjobs.flaky, "f", retry=Retry(max=1, interval=2))
    rq_workers(name="w0")
    wait_for(lambda: rq_conn.get("runs:flaky:f") == b"1", "the first run failed")
    wait_for(lambda: status(first) in ("scheduled", "queued"), "RQ retries it")
    assert q.enqueue(rqjobs.flaky, "f").id == first.id  # still a duplicate while it waits
    assert wait_ended([first], timeout=30) == ["finished"]
    assert [s["job"] for s in spans(rq_conn, "flaky")] == [first.id]


@pytest.mark.slow  # about 4 s on 2 quiet cores
def test_a_failed_enqueue_gives_its_claim_up(rq_conn, rq_server, monkeypatch):
    monkeypatch.setenv("REDISLOCK_URL", rq_server.url)  # the claims live here
    dead = redis.Redis(port=free_port(), socket_connect_timeout=1)
    with pytest.raises(redis.ConnectionError):
        UniqueQueue("default", connection=dead).enqueue(rqjobs.report, "e")
    # Had the claim stayed, this call would be handed a job id that was never queued.
    q = UniqueQueue("default", connection=rq_conn)
    job = q.enqueue(rqjobs.report, "e")
    assert q.job_ids == [job.id]


def test_the_claim_holder_runs_when_a_superseded_copy_holds_the_run_lease(rq_conn, rq_workers):
    """Issue 24, item 10, on RQ: the copy holding the claim, refused the run lease by a
    superseded copy that has yet to step aside, comes back (a conflict retry) and runs."""
    q = UniqueQueue("default", connection=rq_conn)
    job = q.enqueue(rqjobs.report, "window", 0.0)
    spec = spec_of(rqjobs.report)
    assert spec is not None
    name = spec.unique_name(("window", 0.0), {})
    lease = Lock(rq_conn, name, ttl=30).acquire(
        blocking=False, owner="superseded", info={"task_id": "superseded"}
    )
    try:
        rq_workers(name="w0")
        wait_for(lambda: status(job) in ("scheduled", "finished"), "the holder met the lease")
        assert status(job) == "scheduled", "it comes back instead of being skipped"
        assert outcome_of(Job.fetch(job.id, connection=rq_conn)) is None
    finally:
        lease.release()  # the superseded copy stepped aside
    assert wait_ended([job], timeout=30) == ["finished"]
    assert Job.fetch(job.id, connection=rq_conn).return_value() != SKIPPED
    assert [s["job"] for s in spans(rq_conn, "report")] == [job.id]
