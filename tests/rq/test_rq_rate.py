"""``rate=`` on RQ jobs with real ``rq worker`` processes: the fleet-wide limit holds at the
starts the jobs record, a slot seconds ahead brings the job back once (a ``Retry`` through the
scheduler, its reservation kept), and ``max_delay`` fails a job that would wait longer."""

from __future__ import annotations

import json
import re

import pytest
import redis
import rqjobs
from helpers import most_in_window
from rq import Queue
from rqcheck import wait_ended

from celery_redislock import RateLimit
from celery_redislock.integrations.rq.running import RATE_META


def _starts(conn: redis.Redis, kind: str) -> list[float]:
    return sorted(json.loads(raw)["start"] for raw in conn.lrange(f"spans:{kind}", 0, -1))


@pytest.mark.slow  # about 8 s on 2 quiet cores
def test_a_burst_keeps_the_rate_across_workers(rq_conn, rq_workers):
    rq_workers(name="w1")
    rq_workers(name="w2")
    q = Queue("default", connection=rq_conn)
    jobs = [q.enqueue(rqjobs.rated, n) for n in range(6)]
    assert wait_ended(jobs, timeout=90) == ["finished"] * 6
    starts = _starts(rq_conn, "rated")
    assert len(starts) == 6
    # The promise, at the slots Redis handed out (each request's record, 'slot_us cost', kept
    # 30 s past its slot): never two in 1.2 s; and no job started before its slot (the i-th
    # start is at or after the i-th slot). A start may come late on a busy machine, so the
    # starts themselves may come closer than 1.2 s.
    slots = sorted(
        int(rq_conn.get(key).split()[0]) / 1e6 for key in rq_conn.scan_iter(match="*rated*}:r:*")
    )
    assert len(slots) == 6 and most_in_window(slots, 1.2 - 1e-6) <= 1, slots
    assert all(start >= slot - 0.002 for start, slot in zip(starts, slots, strict=True))
    # Slots more than 2 s ahead came back through RQ's scheduler, once each, with their
    # reservation; the rest waited in the horse (the first, at least: its slot was free). How
    # many came back depends on how fast the workers took the burst (on a busy machine, none
    # may have found its slot 2 s ahead); the next test brings one back for sure.
    came_back = _came_back(rq_conn)
    assert len(came_back) == len(set(came_back)) < 6
    for job in jobs:
        assert RATE_META not in job.get_meta()
    assert starts[-1] - starts[0] < 30  # reached, not starved (6 at 1/1.2 s: about 6.4 s)


@pytest.mark.slow  # about 10 s on 2 quiet cores
def test_a_slot_seconds_ahead_brings_the_job_back_once(rq_conn, rq_workers):
    rq_workers(name="w1")
    q = Queue("default", connection=rq_conn)
    first = q.enqueue(rqjobs.rated, 0)
    assert wait_ended([first], timeout=90) == ["finished"]
    (record,) = (key.decode() for key in rq_conn.scan_iter(match="*rated*}:r:*"))
    namespace, name = re.fullmatch(r"(.*):\{(.*)\}:r:.*", record).groups()  # the job's limit
    limit = RateLimit(rq_conn, name, "1/1.2s", namespace=namespace)
    for n in range(6):  # booked 7.2 s ahead: the next job's slot is more than 2 s away
        limit.reserve(f"booked-{n}")
    later = q.enqueue(rqjobs.rated, 1)
    assert wait_ended([later], timeout=90) == ["finished"]
    assert _came_back(rq_conn) == [later.id], "back through the scheduler once; the first not"
    (slot_key,) = (
        key.decode()
        for key in rq_conn.scan_iter(match="*rated*}:r:*")
        if key.decode() != record and "booked-" not in key.decode()
    )
    slot = int(rq_conn.get(slot_key).split()[0]) / 1e6
    assert _starts(rq_conn, "rated")[-1] >= slot - 0.002, "it started at its slot, not before"
    assert RATE_META not in later.get_meta()


def _came_back(conn: redis.Redis) -> list[str]:
    return [
        n["job"]
        for n in map(json.loads, conn.lrange("signals", 0, -1))
        if n["signal"] == "conflict" and n["action"] == "rate"
    ]


def test_a_start_past_max_delay_fails(rq_conn, rq_workers):
    rq_workers(name="w1")
    q = Queue("default", connection=rq_conn)
    first = q.enqueue(rqjobs.rated_impatient)
    assert wait_ended([first], timeout=30) == ["finished"]
    second = q.enqueue(rqjobs.rated_impatient)
    assert wait_ended([second], timeout=30) == ["failed"]
    second.refresh()
    assert "max_delay" in (second.exc_info or "")
    assert len(rq_conn.lrange("spans:rated_impatient", 0, -1)) == 1
