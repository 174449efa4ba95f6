"""The RQ integration's signals, sent from the horse with the Celery side's arguments, and the
kill switch."""

from __future__ import annotations

import json

import redis
import rqjobs
from helpers import wait_for
from rq import Queue
from rqcheck import most_at_once_per_key, spans, started, wait_ended

from celery_redislock import Lock
from celery_redislock.core.signal import Signal
from celery_redislock.integrations.rq import UniqueQueue


def _signals(conn: redis.Redis) -> list[dict]:
    return [json.loads(s) for s in conn.lrange("signals", 0, -1)]


def test_acquired_released_and_conflict_are_sent_from_the_horse(rq_conn, rq_server, rq_workers):
    rq_workers(name="w0")
    q = Queue("default", connection=rq_conn)
    ran = q.enqueue(rqjobs.exclusive, "sig", 0.3)
    assert wait_ended([ran]) == ["finished"]
    lock = Lock(redis.Redis.from_url(rq_server.url), "s:busy", ttl=30)
    with lock.acquire(info={"task_id": "the-test"}):
        skipped = q.enqueue(rqjobs.exclusive_skip, "busy")
        assert wait_ended([skipped]) == ["finished"]
    got = _signals(rq_conn)
    acquired, released, conflict = got
    assert acquired["signal"] == "acquired" and acquired["job"] == ran.id
    assert acquired["task"] == "rqjobs.exclusive" and acquired["lock"] == "x:sig"
    assert 0 <= acquired["waited"] < 5
    assert released["signal"] == "released" and released["job"] == ran.id
    assert 0.3 <= released["held"] < 5  # the body slept 0.3 s with the lease held
    assert conflict == {
        "signal": "conflict",
        "task": "rqjobs.exclusive_skip",
        "job": skipped.id,
        "lock": "s:busy",
        "action": "skip",
        "holders": ["the-test"],
    }


def test_the_kill_switch_turns_locks_and_claims_off(rq_conn, rq_workers, monkeypatch):
    for n in range(2):
        rq_workers(name=f"w{n}", env={"REDISLOCK_DISABLED": "1"})
    monkeypatch.setenv("REDISLOCK_DISABLED", "1")
    q = UniqueQueue("default", connection=rq_conn)
    assert q.enqueue(rqjobs.report, "k").id != q.enqueue(rqjobs.report, "k").id
    holds = [q.enqueue(rqjobs.hold, "off") for _ in range(2)]
    wait_for(lambda: len(started(rq_conn, "hold")) == 2, "both copies run at once, unlocked")
    rq_conn.set("stop:off", 1)
    assert wait_ended(holds) == ["finished", "finished"]
    assert most_at_once_per_key(spans(rq_conn, "hold")) == {"off": 2}
    assert rq_conn.keys("redislock:*") == []
    assert _signals(rq_conn) == []


def test_a_receiver_that_raises_is_logged_and_skipped(caplog):
    sig = Signal("test")
    calls = []
    sig.connect(lambda sender, **kw: 1 / 0)
    sig.connect(lambda sender, **kw: calls.append(kw) or "ok")
    results = sig.send(sender="s", x=1)
    assert calls == [{"x": 1}] and results[1] == ("ok", None)
    assert isinstance(results[0][1], ZeroDivisionError)
    assert "signal test: receiver" in caplog.text
    assert sig.disconnect(sig.receivers[0]) and len(sig.receivers) == 1
    assert not sig.disconnect(print)
