"""Enqueue-time uniqueness with real workers, a real beat and several producer processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from celery import Celery, chain, chord, group
from celery.exceptions import ChordError
from helpers import free_port, is_skipped, started, stop, wait_for
from kombu.exceptions import OperationalError
from producers import burst
from workers import TESTS, Worker

from celery_redislock import DuplicateTask, LockBackendError, LockNotAcquired, lock_for
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.keys import LockKeys


def claim_key(name: str) -> str:
    return LockKeys.of("redislock", name).queued


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


@pytest.mark.slow  # about 4 s on 2 quiet cores
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


@pytest.mark.slow  # about 5 s on 2 quiet cores
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
        "PYTHONFAULTHANDLER": "1",  # SIGABRT writes every thread's stack to the log
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
        try:
            beat.wait(timeout=20)
        except subprocess.TimeoutExpired:
            # Celery's beat saves its schedule in its SIGTERM handler, which can hang when the
            # signal lands inside a publish (a lock the interrupted frame holds). Not what this
            # test is about: the stacks go to the log, for whoever looks into it.
            beat.send_signal(signal.SIGABRT)
            beat.wait(timeout=10)
            warnings.warn(
                f"beat did not stop on SIGTERM; its stacks:\n{log_path.read_text()[-6000:]}",
                stacklevel=1,
            )
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
    # The group's results are read from the backend's store, not through the result consumer's
    # pub/sub: on Celery 5.3.6 in the loaded lowest-versions run, the consumer missed three
    # results that the worker had stored (all three succeeded within 15 ms).
    results = group(members).apply_async().results
    wait_for(
        lambda: all(r.backend.get_task_meta(r.id)["status"] == "SUCCESS" for r in results),
        "the group's three members succeeded",
        timeout=20,
    )
    assert [r.backend.get_task_meta(r.id)["result"] for r in results] == ["ran"] * 3
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


def test_a_duplicate_step_of_a_workflow_is_an_answer(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """Issue 43, item 1: a duplicate whose id is fixed in a workflow never hands back another
    copy's id (the workflow would wait for ever). Published by the caller (a chain's first
    link, a call with callbacks): DuplicateTask at publish. Published by Celery's worker as
    the previous step ends (a chain's next link, a link callback): its run fails at once with
    DuplicateTask, unrun, and the chain's later links fail with it. A plain call still gets
    the running copy's result. The bounds are liveness bounds: before, each waited for ever."""
    workers(concurrency=2)
    running = lockapp.unique_finished.delay("wf", 60)
    wait_for(lambda: started(lockapp, "wf"), "the first copy runs")

    with pytest.raises(DuplicateTask, match=running.id) as caught:
        chain(lockapp.unique_finished.si("wf", 60), lockapp.echo.si("after")).apply_async()
    assert caught.value.task_id == running.id
    with pytest.raises(DuplicateTask, match=running.id):
        lockapp.unique_finished.apply_async(("wf", 60), link=lockapp.echo.si("callback"))

    steps = chain(
        lockapp.echo.si("first"), lockapp.unique_finished.si("wf", 60), lockapp.echo.si("last")
    ).apply_async()
    with pytest.raises(DuplicateTask, match=f"a copy \\({running.id}\\) is already running"):
        steps.get(timeout=30)
    assert steps.parent.state == "FAILURE" and steps.parent.parent.get(timeout=5) == "first"

    # A group that a chain's link before it publishes: its duplicate member fails, unrun.
    fanned = chain(
        lockapp.echo.si("fan"), group(lockapp.unique_finished.si("wf", 60), lockapp.echo.si("g"))
    ).apply_async()
    with pytest.raises(DuplicateTask, match=running.id):
        fanned.get(timeout=30)
    # A chord's body, published by the result backend as the header ends: the chord fails.
    header = [lockapp.echo.si("h1"), lockapp.echo.si("h2")]
    with pytest.raises(ChordError, match=f"DuplicateTask.*{running.id}"):
        chord(header)(lockapp.unique_finished.si("wf", 60)).get(timeout=30)

    callback = lockapp.unique_finished.si("wf", 60)
    callback.freeze()
    assert lockapp.echo.apply_async(("parent",), link=callback).get(timeout=30) == "parent"
    # The callback's answer is stored by a worker before this process subscribes to it: Celery
    # 5.3's result consumer can miss such a result until its timeout (celery#4039), so wait for
    # the stored state, then .get() answers from it.
    answer = lockapp.app.AsyncResult(callback.id)
    wait_for(answer.ready, "the link callback's answer is stored", 30)
    with pytest.raises(DuplicateTask, match=running.id):
        answer.get(timeout=30)

    assert lockapp.unique_finished.delay("wf", 60).id == running.id, "a plain call: unchanged"
    stop(lockapp, "wf")
    assert running.get(timeout=30) == "ran"
    assert started(lockapp, "wf") == [running.id], "no duplicate ran"
    assert sorted(lockapp.r.lrange("echo", 0, -1)) == sorted(
        [b"'first'", b"'fan'", b"'g'", b"'h1'", b"'h2'", b"'parent'"]
    )


# -- retries, revokes, ETA, replace ------------------------------------------------------------


@pytest.mark.slow  # about 3 s on 2 quiet cores
def test_retry_keeps_the_key_and_runs(lockapp: ModuleType, workers: Callable[..., Worker]) -> None:
    """The retry's publish extends the claim to cover its countdown: briefly_finished allows
    0.5 s in the queue and retries with a 2.5 s countdown, so a claim of the allowance alone
    would lapse 2 s before the retry runs, and a call then would publish a second copy."""
    workers()
    job = lockapp.briefly_finished.delay("retry", 2.5)
    wait_for(lambda: started(lockapp, "retry"), "the first run starts")
    waited_from = time.monotonic()
    # Every call until the retry starts (and once after: it then runs) gets the same job back.
    while len(started(lockapp, "retry")) < 2:
        assert lockapp.briefly_finished.delay("retry", 2.5).id == job.id
        assert time.monotonic() - waited_from < 20, "the retry did not start"
        time.sleep(0.05)
    assert lockapp.briefly_finished.delay("retry", 2.5).id == job.id
    # The calls covered the countdown, well past the 0.5 s allowance (a retry run before its
    # countdown would make this loop prove nothing).
    assert time.monotonic() - waited_from > 1.5
    stop(lockapp, "retry")
    assert job.get(timeout=20) == "ran"
    assert started(lockapp, "retry") == [job.id, job.id]
    assert lockapp.r.llen("celery") == 0, "no other copy was queued"


def test_revoke_before_start_frees_the_key_at_once(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    worker = workers()
    waiting = lockapp.unique_finished.apply_async(("revoked",), countdown=60)
    assert lockapp.unique_finished.delay("revoked").id == waiting.id
    wait_for(lambda: waiting.id in worker.log(), "the worker holds the message for its ETA")
    waiting.revoke()
    wait_for(lambda: not lockapp.r.exists(claim_key("fin:revoked")), "the key is free", 30)
    fresh = lockapp.unique_finished.delay("revoked")
    assert fresh.id != waiting.id
    assert fresh.get(timeout=20) == "ran"


def test_countdown_past_the_allowance_stays_unique(lockapp: ModuleType) -> None:
    # briefly_unique allows 1 s in the queue beyond its countdown.
    first = lockapp.briefly_unique.apply_async(("eta",), countdown=3)
    pttl = lockapp.r.pttl(claim_key("eta:eta"))
    assert 3000 < pttl <= 4000, "the claim lasts the countdown plus the allowance"
    # Past the allowance alone (1.5 s of the claim gone): the countdown is what keeps it.
    wait_for(lambda: lockapp.r.pttl(claim_key("eta:eta")) <= pttl - 1500, "1.5 s of the claim")
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


@pytest.mark.slow
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
    # start instead (the claim names a newer copy): the copy ends skipped, never runs.
    results = [lockapp.app.AsyncResult(task_id) for task_id in ids[:-1]]
    assert all(r.state == "REVOKED" or is_skipped(r) for r in results), [r.state for r in results]


# -- faults ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_publish_failure_leaves_no_claim(lockapp: ModuleType, free_port: int) -> None:
    # A connection of its own to no broker: the app's broker URL stays as it is (changed and
    # put back, Celery 5.3 kept a producer pool made for the dead port, and every later test of
    # this process that published failed).
    nobroker = lockapp.app.connection_for_write(f"redis://127.0.0.1:{free_port}/0")
    with nobroker as conn, pytest.raises(OperationalError):
        lockapp.unique_finished.apply_async(("nobroker",), connection=conn, retry=False)
    assert not lockapp.r.exists(claim_key("fin:nobroker"))


@pytest.mark.faults
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


@pytest.fixture(name="free_port")
def a_free_port() -> int:
    return free_port()


@pytest.mark.slow
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


@pytest.mark.slow  # about 5 s on 2 quiet cores
def test_a_message_an_old_worker_discards_as_unregistered_gives_its_claim_up(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """A rolling deploy: a worker of the old code, without the new unique task, takes its
    message and discards it (Celery's "Received unregistered task"). The claim goes with the
    message, so the next call is published and run instead of being handed the dead id."""
    dead = lockapp.unique_finished.delay("deploy")
    assert lockapp.unique_finished.delay("deploy").id == dead.id  # queued: a duplicate
    old = workers(name="old", app="olddeploy")  # (started after: it takes the message at once)
    wait_for(lambda: dead.state == "FAILURE", "the old worker discards it", timeout=60)
    assert "Received unregistered task of type 'lockapp.unique_finished'" in old.log()
    given_up = "discarded unrun (unregistered here): its unique key 'fin:deploy' is given up"
    wait_for(lambda: given_up in old.log(), "the old worker gives its claim up", 60)
    assert not lockapp.r.exists(claim_key("fin:deploy"))
    old.stop()
    workers(name="new")
    fresh = lockapp.unique_finished.delay("deploy")
    assert fresh.id != dead.id
    assert fresh.get(timeout=60) == "ran"
    assert started(lockapp, "deploy") == [fresh.id]


def test_a_message_a_worker_rejects_as_unreadable_gives_its_claim_up(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """A message in a serializer the worker does not accept is rejected unrun (Celery's
    ``task_rejected``): its claim goes with it."""
    worker = workers()
    dead = lockapp.unique_finished.apply_async(("unreadable",), serializer="pickle")
    given_up = "rejected unrun: its unique key 'fin:unreadable' is given up"
    wait_for(lambda: given_up in worker.log(), "the worker gives its claim up", 60)
    assert not lockapp.r.exists(claim_key("fin:unreadable"))
    fresh = lockapp.unique_finished.delay("unreadable")
    assert fresh.id != dead.id
    assert fresh.get(timeout=60) == "ran"
    assert started(lockapp, "unreadable") == [fresh.id]


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


# -- endings that do not run, a running copy, the check at start -------------------------------


def conflicts_of(lockapp: ModuleType, task_id: str) -> list[str]:
    """The lock_conflict actions lockapp noted for ``task_id`` (worker and producer alike)."""
    notes = [n.decode() for n in lockapp.r.lrange("signal:lock_conflict", 0, -1)]
    return [n.split(":", 1)[1] for n in notes if n.startswith(f"{task_id}:")]


def test_the_claim_is_given_up_when_the_job_ends_without_running(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """Skipped (its lock held), failed at start (LockBackendError, policy "fail"), or out of
    conflict retries: the job is over, so its queued claim goes and the next call publishes.
    A claim left behind would refuse every call for its allowance (600 s)."""
    workers()
    # Each claim goes just after the state is stored: polled, 5 s is only a cap.
    # Skipped: this process holds the run lock.
    held = lock_for(lockapp.unique_locked, ("skip",)).acquire(blocking=False, owner="test")
    skipped = lockapp.unique_locked.delay("skip")
    wait_for(lambda: is_skipped(skipped), "the copy is skipped", 20)
    wait_for(lambda: not lockapp.r.exists(claim_key("hold:skip")), "the skip gives up the claim", 5)
    held.release()
    fresh = lockapp.unique_locked.delay("skip")
    assert fresh.id != skipped.id
    assert fresh.get(timeout=20) == "ran"
    assert started(lockapp, "skip") == [fresh.id]

    # Failed at start: the lease's key holds a value of another type, so Redis refuses the
    # acquire (LockBackendError) while the claim's own key still answers.
    leases = LockKeys.of("redislock", "hold:down").leases
    lockapp.r.set(leases, "not a sorted set")
    failed = lockapp.unique_locked.delay("down")
    with pytest.raises(LockBackendError):
        failed.get(timeout=20)
    wait_for(lambda: not lockapp.r.exists(claim_key("hold:down")), "the failure gives it up", 5)
    lockapp.r.delete(leases)
    fresh = lockapp.unique_locked.delay("down")
    assert fresh.id != failed.id
    assert fresh.get(timeout=20) == "ran"
    assert started(lockapp, "down") == [fresh.id]

    # Out of conflict retries (lock max_retries=2): LockNotAcquired, as the caller gets it.
    held = lock_for(lockapp.unique_locked_retrying, ("busy",)).acquire(blocking=False, owner="t")
    gave_up = lockapp.unique_locked_retrying.delay("busy")
    with pytest.raises(LockNotAcquired, match="gave up after 2 conflict retries"):
        gave_up.get(timeout=20)
    wait_for(lambda: not lockapp.r.exists(claim_key("hold:busy")), "giving up frees it", 5)
    held.release()
    fresh = lockapp.unique_locked_retrying.delay("busy")
    assert fresh.id != gave_up.id
    assert fresh.get(timeout=20) == "ran"
    assert started(lockapp, "busy") == [fresh.id]


def test_a_running_copy_is_kept_and_a_superseded_copy_does_not_run(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers()
    # A copy whose claim another id holds: a producer without celery_redislock publishes it
    # unchecked while a checked copy waits in a queue no worker consumes yet.
    queued = lockapp.unique_finished.apply_async(("sup",), queue="parked")
    plain = Celery("plain", broker=lockapp.URL, set_as_current=False)
    try:
        stray = plain.send_task("lockapp.unique_finished", ("sup",))
    finally:
        plain.close()
    wait_for(lambda: is_skipped(lockapp.app.AsyncResult(stray.id)), "the stray skipped", 20)
    assert conflicts_of(lockapp, stray.id) == ["superseded"]
    assert started(lockapp, "sup") == []
    assert lockapp.r.get(claim_key("fin:sup")) == queued.id.encode(), "the newer keeps its claim"
    consume_parked(lockapp)
    assert queued.get(timeout=20) == "ran"
    assert started(lockapp, "sup") == [queued.id]

    # Against a running copy: replace does not replace it, raise says it runs. A copy that
    # were published would land in a queue nobody consumes.
    running = lockapp.replacing_finished.delay("rr", 60)
    strict = lockapp.strict_finished.delay("sr", 60)
    wait_for(lambda: started(lockapp, "rr") and started(lockapp, "sr"), "both copies run", 20)
    assert lockapp.replacing_finished.apply_async(("rr",), queue="nobody").id == running.id
    with pytest.raises(DuplicateTask) as raised:
        lockapp.strict_finished.apply_async(("sr",), queue="nobody")
    err = raised.value
    assert err.task_id == strict.id and err.state == "running"
    assert 0 < err.expires_in <= 30, "what its lease has left (ttl 30 s), not a queued claim"
    assert lockapp.r.llen("nobody") == 0, "neither call was published"
    notes = [n.decode() for n in lockapp.r.lrange("signal:lock_conflict", 0, -1)]
    assert sum(n.endswith(":existing") for n in notes) == 1, "replace answered as existing"
    stop(lockapp, "rr")
    stop(lockapp, "sr")
    assert running.get(timeout=20) == "ran" and strict.get(timeout=20) == "ran"
    assert started(lockapp, "rr") == [running.id] and started(lockapp, "sr") == [strict.id]


def consume_parked(lockapp: ModuleType) -> None:
    """The worker starts consuming queue ``parked``: asked again until it answers (a broadcast
    sent before its control consumer listens is not heard; adding a consumer twice is harmless)."""
    wait_for(
        lambda: lockapp.app.control.add_consumer("parked", reply=True, timeout=2, limit=1),
        "the worker consumes queue 'parked'",
        30,
    )


@pytest.mark.slow  # about 4 s on 2 quiet cores
def test_the_claim_holder_runs_when_a_superseded_copy_holds_the_run_lease(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """Issue 24, item 10: a superseded copy takes the run lease before it learns that it was
    superseded (then steps aside). The copy holding the claim, refused the lease in that
    window, must not be skipped (at 8537bad it was, and the call never ran): it comes back."""
    workers()
    holder = lockapp.unique_finished.apply_async(("window",), queue="parked")
    # The superseded copy, in its window: it holds the run lease of the key.
    lease = lock_for(lockapp.unique_finished, ("window",)).acquire(
        blocking=False, owner="superseded", info={"task_id": "superseded"}
    )
    try:
        consume_parked(lockapp)
        result = lockapp.app.AsyncResult(holder.id)
        wait_for(lambda: result.state in ("RETRY", "FAILURE"), "the holder met the lease", 20)
        assert result.state == "RETRY", "the claim holder comes back instead of being skipped"
        assert conflicts_of(lockapp, holder.id) == ["retry"]
        assert lockapp.r.get(claim_key("fin:window")) == holder.id.encode(), "it keeps its claim"
    finally:
        lease.release()  # the superseded copy stepped aside
    assert holder.get(timeout=30) == "ran"
    assert started(lockapp, "window") == [holder.id]


def test_a_lost_claim_and_the_same_call_again_run_once(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """Issue 24, item 10, end to end: the lock Redis loses a queued copy's claim (a restart
    without persistence), the same call is made again (two messages, two ids), and a worker
    with two processes starts both at once. The newer copy runs; the older finds itself
    superseded, unless it starts only once the newer has ended (nothing then says it was: it
    runs after it, never beside it). At 8537bad both were often skipped and the call never
    ran."""
    pairs = []
    for n in range(3):
        key = f"lost{n}"
        first = lockapp.unique_finished.delay(key)
        assert lockapp.r.delete(claim_key(f"fin:{key}")) == 1, "the claim is lost"
        second = lockapp.unique_finished.delay(key)
        assert second.id != first.id, "published again: two messages"
        pairs.append((key, first, second))
    workers(concurrency=2)
    for key, first, second in pairs:
        wait_for(
            lambda a=first, b=second: all(r.state == "SUCCESS" or is_skipped(r) for r in (a, b)),
            f"both copies of {key} ended",
            30,
        )
        assert second.state == "SUCCESS", "the newer copy, holding the claim, ran"
        if is_skipped(first):
            assert started(lockapp, key) == [second.id], key
            continue
        # The older started after the newer had ended (a slow pool child): one after the other.
        assert started(lockapp, key) == [second.id, first.id], key
        began = [float(t) for t in lockapp.r.lrange(f"started-at:{key}", 0, -1)]
        ended = [float(t) for t in lockapp.r.lrange(f"ended-at:{key}", 0, -1)]
        assert ended[0] <= began[1], f"{key}: the two copies ran at once"


def test_a_pool_child_that_ends_sends_the_confirmations_it_holds(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """A pool child ends with os._exit, which runs no exit handler: a unique task it published
    has its claim confirmed as the child ends (``worker_process_shutdown``), not left to the
    confirmation thread (held back here for 60 s)."""
    workers(
        name="w1",
        concurrency=1,
        env={"LOCKAPP_MAX_TASKS_PER_CHILD": "1", "REDISLOCK_TEST_CONFIRM_LINGER": "60"},
    )
    published = lockapp.publish_unique.delay("from-child").get(timeout=60)
    key = claim_key("fin:from-child")
    assert lockapp.r.get(key) == published.encode()
    # The child ends after its one task: its confirmation goes with it, well within 60 s.
    wait_for(lambda: lockapp.r.pttl(key) > 30_000, "the claim confirmed as the child ended", 30)
