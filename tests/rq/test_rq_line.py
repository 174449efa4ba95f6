"""``on_conflict="queue"`` with real ``rq worker`` processes: a job that finds its lock taken
waits in the lock's task line in Redis (off the queue, neither finished nor failed, no timer
retry) and is put back at the front of its queue the moment the lock is handed to it, whoever
frees the lock: the holder's horse, the ``LockWorker`` parent of a killed horse, or another
worker's sweeper after a whole worker died."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
import redis
import rqjobs
from helpers import lapse_at, wait_for
from rq import Queue
from rq.job import Job
from rqcheck import most_at_once_per_key, spans, started, status, wait_ended
from rqworkers import HAS_SPAWN

from celery_redislock import Lock
from celery_redislock.core import admin
from celery_redislock.core.handover import PUBLISH_WINDOW_S
from celery_redislock.core.lease import Lease
from celery_redislock.core.line import Handed, Parked, park
from celery_redislock.integrations.rq import UniqueQueue, outcome_of
from celery_redislock.integrations.rq.line import LINE_META, PutBack


def _line(conn: redis.Redis, name: str) -> list[str]:
    """The job ids parked in the task line of lock ``name``, in line order."""
    keys = Lock(conn, name, ttl=1).keys
    tokens = [t.decode() for t in conn.zrange(keys.all[2], 0, -1)]
    records = [conn.hget(keys.meta, f"q:{t}") for t in tokens]
    return [json.loads(r)["o"] for r in records if r is not None]


def _notes(conn: redis.Redis) -> list[dict]:
    """The signals the jobs' processes noted (tests/rqsignals.py), in order."""
    return [json.loads(raw) for raw in conn.lrange("signals", 0, -1)]


def _conflicts(conn: redis.Redis) -> dict[str, list[str]]:
    """The conflict actions each job signalled, in order."""
    found: dict[str, list[str]] = defaultdict(list)
    for note in _notes(conn):
        if note["signal"] == "conflict":
            found[note["job"]].append(note["action"])
    return found


def _holds(conn: redis.Redis, n: int = 1, kind: str = "in_line") -> int:
    """Waits until ``n`` jobs of ``kind`` started; the pid of the last one's horse."""
    wait_for(lambda: len(started(conn, kind)) >= n, f"{n} {kind} job(s) started", timeout=30)
    return int(started(conn, kind)[n - 1]["pid"])


def _parked(conn: redis.Redis, name: str, jobs: list[Job]) -> list[str]:
    """Waits until ``jobs`` all wait in the line of ``name``; the line, in order."""
    ids = {j.id for j in jobs}
    wait_for(lambda: set(_line(conn, name)) == ids, f"{len(ids)} job(s) parked", timeout=30)
    return _line(conn, name)


# Through a forking or spawning worker, the burst takes over 10 s.
_BURST_CLASSES = ["LockWorker", pytest.param("Worker", marks=pytest.mark.slow)] + [
    pytest.param("LockSpawnWorker", marks=pytest.mark.slow)
] * HAS_SPAWN


@pytest.mark.parametrize("worker_class", _BURST_CLASSES)
def test_a_burst_on_one_key_drains_in_line_order_one_at_a_time(rq_conn, rq_workers, worker_class):
    """The releasing horse puts the next job back: a plain ``Worker`` drains the line too."""
    rq_workers(name="pool", pool=3, worker_class=worker_class)
    q = Queue("default", connection=rq_conn)
    first = q.enqueue(rqjobs.in_line, "burst", hold=True)
    _holds(rq_conn)
    rest = [q.enqueue(rqjobs.in_line, "burst", 0.05) for _ in range(10)]
    line = _parked(rq_conn, "q:burst", rest)
    for job in rest:  # off the queue, neither finished nor failed
        wait_for(lambda job=job: status(job) == "scheduled", "RQ to keep the parked job")
        job.refresh()
        assert outcome_of(job) == {"outcome": "queued", "lock": "q:burst", "holders": [first.id]}
    rq_conn.set("stop:burst", 1)
    assert wait_ended([first, *rest], timeout=60) == ["finished"] * 11
    ran = sorted(spans(rq_conn, "in_line"), key=lambda r: r["start"])
    assert [r["job"] for r in ran] == [first.id, *line]  # in line order, each once
    assert most_at_once_per_key(ran) == {"burst": 1}
    # Each parked once and came back through its one hand-over: no retry, no second park.
    conflicts = _conflicts(rq_conn)
    assert {j.id: conflicts[j.id] for j in rest} == {j.id: ["queue"] for j in rest}
    assert first.id not in conflicts
    # The time in line counts as waiting: the last one waited for the nine runs before it.
    waited = {n["job"]: n["waited"] for n in _notes(rq_conn) if n["signal"] == "acquired"}
    assert waited[line[-1]] >= 9 * 0.05
    for job in rest:
        job.refresh()
        assert outcome_of(job) is None and LINE_META not in job.meta
        assert job.return_value() == "ran"


def test_a_cap_of_three_with_a_line_runs_three_at_a_time_and_every_job(rq_conn, rq_workers):
    rq_workers(name="pool", pool=4)
    q = Queue("default", connection=rq_conn)
    holders = [q.enqueue(rqjobs.capped_in_line, i, hold=True) for i in range(3)]
    _holds(rq_conn, 3, "capped_in_line")
    waiting = [q.enqueue(rqjobs.capped_in_line, i, 0.3) for i in range(3, 9)]
    _parked(rq_conn, "qcap", waiting)
    rq_conn.set("stop:qcap", 1)
    assert wait_ended([*holders, *waiting], timeout=60) == ["finished"] * 9
    ran = spans(rq_conn, "capped_in_line")
    assert sorted(r["job"] for r in ran) == sorted(j.id for j in [*holders, *waiting])
    assert most_at_once_per_key(ran) == {"qcap": 3}
    conflicts = _conflicts(rq_conn)
    assert all(conflicts[j.id] == ["queue"] for j in waiting)


def test_a_killed_horse_hands_the_lock_on_at_once(rq_conn, rq_workers):
    """``LockWorker``'s parent frees a SIGKILLed horse's lease and puts the next parked job
    back: it starts long before the lease (ttl 15 s) could have lapsed. So does a job that
    claimed its hand-over: its lease names its own horse."""
    rq_workers(name="pool", pool=2)
    q = Queue("default", connection=rq_conn)
    holder = q.enqueue(rqjobs.in_line, "kill", hold=True)
    pid = _holds(rq_conn)
    second = q.enqueue(rqjobs.in_line, "kill", hold=True)
    third = q.enqueue(rqjobs.in_line, "kill", 0.05)
    assert _parked(rq_conn, "q:kill", [second, third]) == [second.id, third.id]
    lapse = lapse_at(Lock(rq_conn, "q:kill", ttl=1))
    os.kill(pid, signal.SIGKILL)
    pid = _holds(rq_conn, 2)
    assert time.monotonic() < lapse, "handed on only as the killed horse's lease lapsed"
    assert started(rq_conn, "in_line")[1]["job"] == second.id
    lapse = lapse_at(Lock(rq_conn, "q:kill", ttl=1))
    os.kill(pid, signal.SIGKILL)
    _holds(rq_conn, 3)
    assert time.monotonic() < lapse, "handed on only as the killed horse's lease lapsed"
    assert wait_ended([holder, second, third]) == ["failed", "failed", "finished"]


@pytest.mark.slow  # about 4 s on 2 quiet cores
def test_a_whole_dead_worker_is_handed_on_by_another_workers_sweep(rq_conn, rq_workers):
    doomed = rq_workers(name="doomed")
    q = Queue("default", connection=rq_conn)
    holder = q.enqueue(rqjobs.in_line_short_ttl, "whole", hold=True)
    _holds(rq_conn)
    rq_workers(name="sweeps")
    waiting = q.enqueue(rqjobs.in_line_short_ttl, "whole")
    _parked(rq_conn, "q:whole", [waiting])
    doomed.kill()  # parent and horse: nobody releases, the lease lapses after its 3 s ttl
    # Then only the other worker's sweep hands it on: unswept, the job would never run.
    assert wait_ended([waiting], timeout=30) == ["finished"]
    assert [s["job"] for s in started(rq_conn, "in_line")] == [holder.id, waiting.id]


@pytest.mark.parametrize("how", ["admin", "put_back", "redislock"])
def test_a_forced_release_hands_the_lock_to_the_next_in_line_at_once(rq_conn, rq_workers, how):
    """An operator's release of a stuck holder hands the lock over as the holder's own release
    would: with no way to put the job back itself (the admin API alone, the ``redislock``
    command), a worker's sweeper does it at its next sweep; the admin API given a ``PutBack``
    does it at once. Not when the short lease handed to the job lapses unpublished (10 s)."""
    rq_workers(name="pool", pool=2)
    q = Queue("default", connection=rq_conn)
    holder = q.enqueue(rqjobs.in_line, "forced", hold=True)
    _holds(rq_conn)
    waiting = q.enqueue(rqjobs.in_line, "forced")
    _parked(rq_conn, "q:forced", [waiting])
    if how == "redislock":
        url = rq_conn.connection_pool.connection_kwargs
        command = [str(Path(sys.executable).parent / "redislock"), "--url"]
        command += [f"redis://{url['host']}:{url['port']}/{url.get('db', 0)}"]
        done = subprocess.run(
            [*command, "release", "q:forced", "--all"], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (done.stdout, done.stderr)
    else:
        put_back = {"handover": PutBack(rq_conn, None, rq_conn)} if how == "put_back" else {}
        assert admin.force_release(rq_conn, "q:forced", everything=True, **put_back).holders
    # The lease handed to the parked job lapses unpublished at the end of the publish window
    # (10 s): a start before then was a sweep's or the PutBack's, however slow the machine.
    lapse = lapse_at(Lock(rq_conn, "q:forced", ttl=30), default=PUBLISH_WINDOW_S)
    _holds(rq_conn, 2)
    assert time.monotonic() < lapse, "the parked job started only as its hand-over lapsed"
    assert started(rq_conn, "in_line")[1]["job"] == waiting.id
    rq_conn.set("stop:forced", 1)
    assert wait_ended([holder, waiting], timeout=30)[1] == "finished"


def test_a_job_past_max_wait_fails_without_running(rq_conn, rq_workers):
    rq_workers(name="pool", pool=2)
    q = Queue("default", connection=rq_conn)
    holder = q.enqueue(rqjobs.in_line, "late", hold=True)
    _holds(rq_conn)
    late = q.enqueue(rqjobs.impatient, "late")  # max_wait=1
    assert wait_ended([late], timeout=30) == ["failed"]
    error = late.latest_result().exc_string or ""
    assert "LockNotAcquired" in error and "longer than max_wait (1s)" in error
    assert started(rq_conn, "impatient") == []
    late.refresh()
    assert outcome_of(late) == {"outcome": "expired", "lock": "q:late", "holders": [holder.id]}
    assert _conflicts(rq_conn)[late.id] == ["queue", "expired"]
    rq_conn.set("stop:late", 1)
    assert wait_ended([holder]) == ["finished"]


def test_a_parked_job_nobody_puts_back_ends_expired_when_rqs_scheduler_runs_it(rq_conn, rq_workers):
    """Plain workers sweep nothing, so nobody publishes the expiry: the ``Retry``'s due time,
    far past the wait, is the fallback (brought forward here), and the job ends as expired."""
    rq_workers(name="pool", pool=2, worker_class="Worker")  # the pool runs RQ's scheduler
    q = Queue("default", connection=rq_conn)
    holder = q.enqueue(rqjobs.in_line, "fallback", hold=True)
    _holds(rq_conn)
    late = q.enqueue(rqjobs.impatient, "fallback")  # max_wait=1
    _parked(rq_conn, "q:fallback", [late])
    registry = q.scheduled_job_registry.key
    wait_for(lambda: rq_conn.zscore(registry, late.id) is not None, "RQ to keep the parked job")
    assert rq_conn.zscore(registry, late.id) - time.time() > 60  # due after wait + window
    time.sleep(1.5)  # past its max_wait of 1 s: time passing is the point (no sweeper acts)
    assert status(late) == "scheduled"  # no sweeper: still parked
    rq_conn.zadd(registry, {late.id: int(time.time())})
    assert wait_ended([late], timeout=30) == ["failed"]
    assert "longer than max_wait (1s)" in (late.latest_result().exc_string or "")
    assert started(rq_conn, "impatient") == []
    rq_conn.set("stop:fallback", 1)
    assert wait_ended([holder]) == ["finished"]


def test_a_full_line_fails_the_newcomer_with_line_full(rq_conn, rq_workers):
    rq_workers(name="pool", pool=2)
    q = Queue("default", connection=rq_conn)
    holder = q.enqueue(rqjobs.in_line, "full", hold=True)
    _holds(rq_conn)
    parked = [q.enqueue(rqjobs.short_line, "full") for _ in range(2)]  # max_waiting=2
    _parked(rq_conn, "q:full", parked)
    third = q.enqueue(rqjobs.short_line, "full")
    assert wait_ended([third], timeout=30) == ["failed"]
    assert "LineFull" in (third.latest_result().exc_string or "")
    third.refresh()
    assert outcome_of(third) == {"outcome": "full", "lock": "q:full", "holders": [holder.id]}
    rq_conn.set("stop:full", 1)
    assert wait_ended([holder, *parked], timeout=30) == ["finished"] * 3


def test_a_unique_job_keeps_its_claim_while_it_waits_in_line(rq_conn, rq_workers):
    rq_workers(name="pool", pool=2)
    q = UniqueQueue("default", connection=rq_conn)
    holder = q.enqueue(rqjobs.in_line, "uq", hold=True)
    _holds(rq_conn)
    first = q.enqueue(rqjobs.unique_in_line, "uq")
    _parked(rq_conn, "q:uq", [first])
    time.sleep(1.5)  # past the claim its enqueue made (allowance 1 s): only a kept one is left
    # Parked, off the queue, and still a duplicate: the same call gets the waiting job back.
    assert q.enqueue(rqjobs.unique_in_line, "uq").id == first.id
    rq_conn.set("stop:uq", 1)
    assert wait_ended([holder, first], timeout=30) == ["finished"] * 2
    assert [s["job"] for s in started(rq_conn, "in_line")] == [holder.id, first.id]
    assert q.enqueue(rqjobs.unique_in_line, "uq").id != first.id  # it ran: the key is free


def test_a_job_canceled_while_parked_gives_its_turn_to_the_next(rq_conn, rq_workers):
    """The lock goes to the next in line at once, not after the hand-over window (60 s)."""
    rq_workers(name="pool", pool=2)
    q = Queue("default", connection=rq_conn)
    holder = q.enqueue(rqjobs.in_line, "gone", hold=True)
    _holds(rq_conn)
    canceled = q.enqueue(rqjobs.in_line, "gone")
    after = q.enqueue(rqjobs.in_line, "gone")
    assert _parked(rq_conn, "q:gone", [canceled, after]) == [canceled.id, after.id]
    Job.fetch(canceled.id, connection=rq_conn).cancel()
    rq_conn.set("stop:gone", 1)
    assert wait_ended([holder, after], timeout=20) == ["finished"] * 2
    assert status(canceled) == "canceled"
    assert [s["job"] for s in started(rq_conn, "in_line")] == [holder.id, after.id]


def test_a_hand_over_delivered_twice_queues_the_job_once(rq_conn, rq_workers):
    """A hand-over published again (its publisher died before confirming it) finds the job
    queued already: it is on its queue once, marked with the hand-over it is to claim."""
    pool = rq_workers(name="pool", pool=2)
    q = Queue("default", connection=rq_conn)
    q.enqueue(rqjobs.in_line, "twice", hold=True)
    _holds(rq_conn)
    waiting = q.enqueue(rqjobs.in_line, "twice")
    _parked(rq_conn, "q:twice", [waiting])
    wait_for(lambda: status(waiting) == "scheduled", "RQ to keep the parked job")
    wait_for(lambda: rq_conn.zcard(q.scheduled_job_registry.key) == 1, "...in its registry")
    pool.kill()  # nobody takes the job off its queue now...
    # ...once Redis noticed that the workers' blocking pops died with them.
    wait_for(lambda: rq_conn.info("clients")["blocked_clients"] == 0, "dead workers' pops gone")
    meta = Lock(rq_conn, "q:twice", ttl=1).keys.meta
    [field] = [f.decode() for f in rq_conn.hkeys(meta) if f.startswith(b"p:")]
    handed = Handed(field[2:], json.loads(rq_conn.hget(meta, field))["x"], False)
    put_back = PutBack(rq_conn, None, rq_conn)
    put_back(handed)
    put_back(handed)
    assert [i.decode() for i in rq_conn.lrange(q.key, 0, -1)] == [waiting.id]
    assert status(waiting) == "queued"
    waiting.refresh()
    assert waiting.meta[LINE_META]["token"] == handed.token
    assert waiting.meta[LINE_META]["state"] == "handed"
    assert rq_conn.zrange(q.scheduled_job_registry.key, 0, -1) == []


def test_a_replaced_parked_job_handed_on_as_replaced_ends_canceled(rq_conn, rq_workers):
    """A job replaced under its unique key left the line (unique_claim.lua); its producer's
    cancel may have lost against its own Retry being scheduled, as here where nobody cancels
    it: the sweeper's hand-over marked replaced cancels it, off the scheduled registry, never
    queued to run (twice: the same end)."""
    pool = rq_workers(name="pool", pool=2)
    q = Queue("default", connection=rq_conn)
    q.enqueue(rqjobs.in_line, "replaced", hold=True)
    _holds(rq_conn)
    waiting = q.enqueue(rqjobs.in_line, "replaced")
    _parked(rq_conn, "q:replaced", [waiting])
    wait_for(lambda: status(waiting) == "scheduled", "RQ to keep the parked job")
    pool.kill()
    wait_for(lambda: rq_conn.info("clients")["blocked_clients"] == 0, "dead workers' pops gone")
    meta = Lock(rq_conn, "q:replaced", ttl=1).keys.meta
    [field] = [f.decode() for f in rq_conn.hkeys(meta) if f.startswith(b"p:")]
    handed = Handed(field[2:], json.loads(rq_conn.hget(meta, field))["x"], True, replaced=True)
    put_back = PutBack(rq_conn, None, rq_conn)
    put_back(handed)
    put_back(handed)
    assert status(waiting) == "canceled"
    assert rq_conn.zrange(q.scheduled_job_registry.key, 0, -1) == []
    assert rq_conn.lrange(q.key, 0, -1) == []


def test_a_claimed_hand_over_lasts_a_ttl_and_names_its_claimant(rq_conn):
    """What the killed-claimant cases above rest on (the core's claim): the lease a job claims
    is renewed as its own (the ttl from the claim, not the rest of the hand-over window) and
    records the process that claimed it (a parent's release by pid finds it)."""
    handed: list[Handed] = []
    lock = Lock(rq_conn, "q:claim", ttl=3, handover=handed.append, handover_window=60)
    holder = lock.acquire(owner="holder")
    place = park(lock, "payload", owner="job", info={"task_id": "job", "runs_in": "parker"})
    assert isinstance(place, Parked)
    holder.release()
    assert [h.token for h in handed] == [place.token]
    claimed = park(lock, "payload", token=place.token, owner="job", info={"runs_in": "claimant"})
    assert isinstance(claimed, Lease)
    [holding] = lock.holders()
    assert holding.token == place.token and holding.info["runs_in"] == "claimant"
    assert holding.expires_in <= 3


def test_a_job_that_only_parked_is_no_rerun_so_a_newer_copy_supersedes_it(rq_conn):
    """Each park returns RQ's Retry, which RQ counts in number_of_retries; the job's body never
    ran, so it is not a re-run: a copy replaced meanwhile (say, while its horse was still
    returning, too late to cancel) skips itself when the lock is handed to it, as on Celery.
    An RQ retry beyond the parks (its body ran and failed) still runs."""
    from celery_redislock.integrations.rq.running import _PARKS_META, _delivery

    job = Job.create(rqjobs.report, args=("k",), connection=rq_conn)
    job.meta[_PARKS_META] = 2
    job.number_of_retries = 2
    assert not _delivery(job, ("k",), {}).republished
    job.number_of_retries = 3  # one retry more than the parks: its body ran before
    assert _delivery(job, ("k",), {}).republished
