"""Enqueue-time uniqueness with real workers, a real beat and several producer processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from celery import chain, chord, group
from conftest import wait_for
from kombu.exceptions import OperationalError
from producers import burst
from workers import TESTS, Worker

from celery_redislock import DuplicateTask
from celery_redislock.contrib.redis_server import RedisServer


def claim_key(name: str) -> str:
    return f"redislock:{{{name}}}:queued"


def started(lockapp: ModuleType, name: str) -> list[str]:
    return [t.decode() for t in lockapp.r.lrange(f"started:{name}", 0, -1)]


def stop(lockapp: ModuleType, name: str) -> None:
    lockapp.r.set(f"stop:{name}", 1)


# -- many producers --------------------------------------------------------------------------


def test_until_finished_one_run_while_running_for_four_producers(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers()
    first = lockapp.unique_finished.delay("burst", 60)
    wait_for(lambda: started(lockapp, "burst"), "the first copy runs")
    ids = burst("lockapp.unique_finished", ("burst", 60))
    assert len(ids) == 400
    assert set(ids) == {first.id}, "every producer got the running task's id back"
    stop(lockapp, "burst")
    assert first.get(timeout=20) == "ran"
    assert started(lockapp, "burst") == [first.id]
    assert lockapp.r.llen("celery") == 0, "nothing else was queued"


@pytest.mark.parametrize("task", ["unique_started", "unique_both", "unique_finished"])
def test_one_queued_copy_for_four_producers(
    lockapp: ModuleType, workers: Callable[..., Worker], task: str
) -> None:
    ids = burst(f"lockapp.{task}", ("queued",))  # no worker yet: every copy would wait
    assert len(set(ids)) == 1, "every producer got the same task id"
    assert lockapp.r.llen("celery") == 1, "one message was queued"
    workers()
    result = lockapp.app.AsyncResult(ids[0])
    assert result.get(timeout=20) == "ran"
    assert started(lockapp, "queued") == [ids[0]]


def test_until_started_lets_one_more_queue_while_one_runs(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers(concurrency=1)
    running = lockapp.unique_started.delay("window", 60)
    wait_for(lambda: started(lockapp, "window"), "the first copy runs")
    queued = {lockapp.unique_started.delay("window", 0).id for _ in range(20)}
    assert len(queued) == 1 and running.id not in queued
    stop(lockapp, "window")
    lockapp.app.AsyncResult(queued.pop()).get(timeout=20)
    assert len(started(lockapp, "window")) == 2


def test_until_and_while_running_queues_one_that_runs_after(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers(concurrency=2)  # a free process: only the run lock keeps the second waiting
    running = lockapp.unique_both.delay("pair", 1.0)
    wait_for(lambda: started(lockapp, "pair"), "the first copy runs")
    second = {lockapp.unique_both.delay("pair", 0).id for _ in range(20)}
    assert len(second) == 1 and running.id not in second
    assert lockapp.app.AsyncResult(second.pop()).get(timeout=30) == "ran"
    assert len(started(lockapp, "pair")) == 2
    seen = [int(n) for n in lockapp.r.lrange("seen:both:pair", 0, -1)]
    assert seen == [1, 1], "the queued copy waited for the running one"


# -- every producer ----------------------------------------------------------------------------


@pytest.mark.parametrize("beat_app", ["lockapp", "beatapp"])
def test_beat_ticks_are_unique(
    lockapp: ModuleType,
    workers: Callable[..., Worker],
    celery_server: RedisServer,
    tmp_path: Path,
    beat_app: str,
) -> None:
    """A real beat fires every 0.3 s while the job runs: one run, nothing queued behind it.
    ``beatapp`` cannot import the task; it reads the task's options from what the worker
    published in Redis."""
    worker = workers()
    log_path = tmp_path / "beat.log"
    env = {
        **os.environ,
        "LOCKAPP_REDIS_URL": celery_server.url,
        "LOCKAPP_BEAT": "0.3",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "celery", "-A", beat_app, "beat", "-l", "info",
               "-s", str(tmp_path / "schedule")]  # fmt: skip
    with open(log_path, "wb") as log:
        beat = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(
            lambda: log_path.read_text().count("Sending due task") >= 5, "beat ticked 5 times", 30
        )
    finally:
        beat.send_signal(signal.SIGTERM)
        beat.wait(timeout=20)
    assert len(started(lockapp, "beat")) == 1
    # Not merely skipped when delivered: never published.
    assert len(re.findall(r"Task lockapp\.unique_finished\[\S+\] received", worker.log())) == 1
    assert lockapp.r.llen("celery") == 0
    stop(lockapp, "beat")


def test_send_task_by_name_and_delay_agree(lockapp: ModuleType) -> None:
    first = lockapp.unique_finished.delay("named")
    by_name = lockapp.app.send_task("lockapp.unique_finished", kwargs={"name": "named"})
    assert by_name.id == first.id


def test_canvas(lockapp: ModuleType, workers: Callable[..., Worker]) -> None:
    workers()
    # Distinct keys in a group and a chord header: all run, and the chord body follows.
    members = [lockapp.unique_finished.si(f"g{i}") for i in range(3)]
    assert group(members).apply_async().get(timeout=20) == ["ran"] * 3
    body = lockapp.unique_strict.s()
    header = [lockapp.unique_finished.si(f"c{i}") for i in range(3)]
    assert chord(header)(body.clone(args=())).get(timeout=20) == ["ran"] * 3
    # A chain's links are published one after the other: the same key twice is no duplicate.
    links = chain(lockapp.unique_finished.si("link"), lockapp.unique_finished.si("link"))
    assert links.apply_async().get(timeout=20) == "ran"
    assert len(started(lockapp, "link")) == 2
    # A duplicate member would leave the group waiting forever: it raises instead.
    running = lockapp.unique_finished.delay("busy", 60)
    with pytest.raises(DuplicateTask) as caught:
        group(lockapp.unique_finished.si("busy", 60), lockapp.unique_finished.si("g9")).delay()
    assert caught.value.task_id == running.id
    stop(lockapp, "busy")


# -- retries, revokes, ETA, replace ------------------------------------------------------------


def test_retry_keeps_the_key_and_runs(lockapp: ModuleType, workers: Callable[..., Worker]) -> None:
    workers()
    job = lockapp.unique_finished.delay("retry", 0, 1.5)
    wait_for(lambda: started(lockapp, "retry"), "the first run starts")
    wait_for(lambda: lockapp.r.exists(claim_key("fin:retry")), "the retry is queued")
    again = {lockapp.unique_finished.delay("retry", 0, 1.5).id for _ in range(10)}
    assert again == {job.id}, "the retry waiting on its countdown is the same job"
    assert job.get(timeout=20) == "ran"
    assert started(lockapp, "retry") == [job.id, job.id]
    assert lockapp.r.lrange("ended:retry", 0, -1) == [f"{job.id}:1".encode()]


def test_revoke_before_start_frees_the_key_at_once(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    worker = workers()
    waiting = lockapp.unique_finished.apply_async(("revoked",), countdown=60)
    assert lockapp.unique_finished.delay("revoked").id == waiting.id
    wait_for(lambda: waiting.id in worker.log(), "the worker holds the message for its ETA")
    waiting.revoke()
    wait_for(lambda: not lockapp.r.exists(claim_key("fin:revoked")), "the key is free", 5)
    fresh = lockapp.unique_finished.delay("revoked")
    assert fresh.id != waiting.id
    assert fresh.get(timeout=20) == "ran"


def test_countdown_past_the_allowance_stays_unique(lockapp: ModuleType) -> None:
    # briefly_unique allows 1 s in the queue beyond its countdown.
    first = lockapp.briefly_unique.apply_async(("eta",), countdown=3)
    pttl = lockapp.r.pttl(claim_key("eta:eta"))
    assert 3000 < pttl <= 4000, "the claim lasts the countdown plus the allowance"
    time.sleep(1.5)  # past the allowance alone: the countdown is what keeps it
    assert lockapp.briefly_unique.delay("eta").id == first.id


def test_expires_bounds_the_claim(lockapp: ModuleType) -> None:
    lockapp.unique_finished.apply_async(("expiring",), expires=2)
    assert 0 < lockapp.r.pttl(claim_key("fin:expiring")) <= 2000


def test_replace_runs_only_the_last_of_a_burst(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    ids = [lockapp.debounced.delay("deb", n).id for n in range(10)]
    assert len(set(ids)) == 10
    workers()
    assert lockapp.app.AsyncResult(ids[-1]).get(timeout=20) == 9
    wait_for(lambda: lockapp.r.llen("celery") == 0, "every message was delivered")
    assert started(lockapp, "deb") == [ids[-1]]


def test_replace_revokes_a_waiting_copy(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers()
    ids = [lockapp.debounced.apply_async(("soon", n), countdown=1).id for n in range(5)]
    assert lockapp.app.AsyncResult(ids[-1]).get(timeout=20) == 4
    assert started(lockapp, "soon") == [ids[-1]]
    replies = lockapp.app.control.inspect(timeout=5).revoked() or {}
    revoked = {task_id for ids_ in replies.values() for task_id in ids_}
    assert set(ids[:-1]) <= revoked, "each replaced copy was revoked"
    # A revoke that reaches the worker after the countdown is over is caught by the check at
    # start instead (the claim names a newer copy): the copy ends SKIPPED, never runs.
    states = {lockapp.app.AsyncResult(task_id).state for task_id in ids[:-1]}
    assert states <= {"REVOKED", "SKIPPED"}, states


# -- faults ------------------------------------------------------------------------------------


def test_publish_failure_leaves_no_claim(lockapp: ModuleType, free_port: int) -> None:
    lockapp.app.conf.broker_url = f"redis://127.0.0.1:{free_port}/0"
    try:
        with lockapp.app.connection_for_write() as conn, pytest.raises(OperationalError):
            lockapp.unique_finished.apply_async(("nobroker",), connection=conn, retry=False)
    finally:
        lockapp.app.conf.broker_url = lockapp.URL
    assert not lockapp.r.exists(claim_key("fin:nobroker"))


def test_killed_worker_does_not_block_past_the_lease(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    worker = workers(env={"LOCKAPP_TTL": "2"})
    job = lockapp.unique_finished.delay("killed", 60)
    wait_for(lambda: started(lockapp, "killed"), "the job runs")
    assert lockapp.unique_finished.delay("killed").id == job.id
    worker.kill()  # SIGKILL to the whole worker: the message is acked, and lost
    wait_for(
        lambda: lockapp.unique_finished.delay("killed").id != job.id,
        "a new copy is accepted once the run lease lapses",
        10,
    )


@pytest.fixture
def free_port() -> Iterator[int]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_revoke_of_a_message_still_in_the_broker_frees_the_key_when_discarded(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    worker = workers(concurrency=1)  # prefetches one message beyond the one it runs
    lockapp.hold.delay("busy", 60)
    wait_for(lambda: started(lockapp, "busy"), "the worker is busy")
    reserved = lockapp.unique_finished.delay("reserved")
    wait_for(lambda: reserved.id in worker.log(), "the next message is prefetched")
    in_broker = lockapp.unique_finished.delay("in-broker")
    assert lockapp.app.control.revoke(in_broker.id, reply=True, timeout=5)
    assert lockapp.r.exists(claim_key("fin:in-broker")), "no worker holds it yet"
    stop(lockapp, "busy")
    wait_for(lambda: not lockapp.r.exists(claim_key("fin:in-broker")), "discarded and freed")
    assert reserved.get(timeout=20) == "ran"
    assert started(lockapp, "in-broker") == []


def test_no_copy_slips_in_while_a_retry_is_being_published(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """Between the end of the run (its lease given back) and the retry's publish, the job is
    still claimed: a call then gets the retrying job back."""
    workers()
    job = lockapp.retried_after_a_pause.delay("gap")
    wait_for(lambda: lockapp.r.llen("retry-gap") == 1, "the run ended and its retry is pending")
    assert lockapp.retried_after_a_pause.delay("gap").id == job.id
    lockapp.r.set("retry-gap:go", 1)
    assert job.get(timeout=20) == "ran"
    assert started(lockapp, "gap") == [job.id, job.id]
