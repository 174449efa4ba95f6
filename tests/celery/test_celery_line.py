"""``on_conflict="queue"`` with real workers: a task that finds its lock taken waits in the lock's
task line in Redis (no worker slot, no timer retry) and is published again, in order, the
moment the lock frees, whoever frees it: the holder, the worker parent after a child died,
or another worker's sweeper after a whole worker died. Nothing parked is lost or run twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from celery.result import AsyncResult
from helpers import lapse_at, started, stop, wait_for, wait_started
from workers import TESTS, Worker

from celery_redislock import LineFull, Lock, LockNotAcquired
from celery_redislock.core import admin
from celery_redislock.core.handover import PUBLISH_WINDOW_S
from celery_redislock.core.line import lines_key


def _conflicts(lockapp: ModuleType) -> list[tuple[str, str]]:
    raw = [e.decode() for e in lockapp.r.lrange("signal:lock_conflict", 0, -1)]
    return [(e.split(":", 1)[0], e.split(":", 1)[1]) for e in raw]


def _line_of(lockapp: ModuleType, name: str) -> list[str]:
    """The task ids parked in the line of lock ``name``, in line order."""
    prefix = f"redislock:{{{name}}}"
    tokens = [t.decode() for t in lockapp.r.zrange(f"{prefix}:queue", 0, -1)]
    records = [lockapp.r.hget(f"{prefix}:meta", f"q:{t}") for t in tokens]
    return [json.loads(r)["o"] for r in records if r is not None]


def _hold(lockapp: ModuleType, name: str) -> AsyncResult:
    """A task holding lock ``line:<name>`` until ``stop:<name>`` is set (30 s at most)."""
    holder = lockapp.in_line.delay(name, 0, 30)
    wait_started(lockapp, f"line:{name}")
    return holder


def _park(lockapp: ModuleType, task: object, *args: object) -> AsyncResult:
    """Calls ``task`` and waits until it parked in its lock's line."""
    result = task.delay(*args)  # type: ignore[attr-defined]
    wait_for(lambda: dict(_conflicts(lockapp)).get(result.id) == "queue", "to park")
    return result


def _states(results: list[AsyncResult]) -> list[str]:
    return [r.state for r in results]


def _all_succeeded(results: list[AsyncResult], timeout: float) -> None:
    wait_for(
        lambda: all(s == "SUCCESS" for s in _states(results)),
        "every task to succeed",
        timeout=timeout,
    )


def test_a_burst_on_one_key_drains_in_line_order_one_at_a_time(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers(name="w1", concurrency=4)
    first = lockapp.in_line.delay("burst", 0, 30)
    wait_started(lockapp, "line:burst")
    results = [first] + [lockapp.in_line.delay("burst", i, 0.05) for i in range(1, 12)]
    wait_for(
        lambda: _line_of(lockapp, "line:burst") and len(_line_of(lockapp, "line:burst")) == 11,
        "11 to park",
    )
    line = _line_of(lockapp, "line:burst")
    lockapp.r.set("stop:burst", 1)
    _all_succeeded(results, timeout=60)
    seen = [int(x) for x in lockapp.r.lrange("seen:line:burst", 0, -1)]
    assert seen == [1] * 12  # never two at once
    # Each task parked once and ran in the order it joined the line: no conflict re-publish.
    parked = [tid for tid, action in _conflicts(lockapp) if action == "queue"]
    assert sorted(parked) == sorted(r.id for r in results[1:])
    assert started(lockapp, "line:burst") == [first.id, *line]
    # Nothing left: the line and its listing for sweepers are gone once drained.
    wait_for(
        lambda: not lockapp.r.hexists(lines_key("redislock"), "line:burst"),
        "the drained line to be forgotten by the sweeper",
        timeout=10,
    )


def test_a_cap_with_a_line_runs_three_at_a_time_and_all(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers(name="w1", concurrency=6)
    results = [lockapp.capped_in_line.delay(i, 0.3) for i in range(15)]
    _all_succeeded(results, timeout=60)
    seen = [int(x) for x in lockapp.r.lrange("seen:linecap", 0, -1)]
    assert len(seen) == 15 and max(seen) <= 3
    assert max(seen) == 3  # the cap was used, not one at a time
    # Each conflict parked its task; but a hand-over may be published twice (its publish came
    # late, and the sweep published it again: seen under LOAD=2), and the second delivery then
    # waits for the first ("await") and is dropped once it finished ("drop"): each ran once.
    conflicts = _conflicts(lockapp)
    parked = {task for task, action in conflicts if action == "queue"}
    again = [(task, a) for task, a in conflicts if a != "queue"]
    assert all(a in ("await", "drop") and task in parked for task, a in again), conflicts


def test_a_dead_childs_lock_goes_to_the_next_in_line_at_once(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """The parent frees the killed child's lease and publishes the next parked task: it starts
    long before the lease (ttl 30 s) could have lapsed."""
    worker = workers(name="w1", concurrency=2)
    holder = _hold(lockapp, "kill")
    waiting = _park(lockapp, lockapp.in_line, "kill", 1)
    child = int(lockapp.r.hget("pid", holder.id))
    assert child in worker.children()
    lapse = lapse_at(Lock(lockapp.r, "line:kill", ttl=30))
    os.kill(child, signal.SIGKILL)
    wait_for(lambda: waiting.state == "SUCCESS", "the parked task to run", timeout=30)
    assert time.monotonic() < lapse, "handed on only as the killed child's lease lapsed"
    wait_for(lambda: holder.state == "FAILURE", "the killed holder's failure (WorkerLostError)")


@pytest.mark.slow
def test_a_child_forked_while_a_parent_thread_is_inside_the_lock_client_takes_locks(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """A child dies, the worker forks its replacement while a thread of the parent is inside
    the lock client's connection pool: the replacement inherits the pool taken (redis-py 8
    takes the pool's lock as it resets it for the child). The integration's own threads hold
    the fork guard in their calls (the next test); any other thread of the parent using the
    client may still be inside it at a fork. Here one holds the pool across the fork, for
    certain; the replacement must still take its locks. (The lines' sweep, which uses the same
    client under the fork guard, is set to wait 60 s: it would hold the fork off meanwhile.)"""
    worker = workers(
        name="w1",
        concurrency=2,
        env={"LOCKAPP_POOL_HOLDER": "1", "LOCKAPP_SWEEP_INTERVAL": "60"},
    )
    holder = _hold(lockapp, "forked")  # the other child stays busy: the next goes to the new
    plain = lockapp.plain_wait.delay("forked-plain", 60)  # no lock: its death frees nothing
    wait_started(lockapp, "forked-plain")
    child = int(lockapp.r.hget("pid", plain.id))
    others = set(worker.children()) - {child}
    lockapp.r.set("pool:hold", 1)
    wait_for(lambda: lockapp.r.exists("pool:held"), "the parent's thread to hold the pool")
    os.kill(child, signal.SIGKILL)
    wait_for(lambda: set(worker.children()) - others - {child}, "the worker to fork a replacement")
    [replacement] = set(worker.children()) - others - {child}
    lockapp.r.delete("pool:hold")
    locked = lockapp.in_line.delay("forked-next", 1)
    wait_for(lambda: locked.state == "SUCCESS", "a locked task to run in the replacement", 60)
    assert int(lockapp.r.hget("pid", locked.id)) == replacement
    assert started(lockapp, "line:forked-next") == [locked.id]
    stop(lockapp, "forked")
    wait_for(lambda: holder.state == "SUCCESS", "the holder to end")


@pytest.mark.slow
def test_a_child_forked_while_the_parent_publishes_a_hand_over_starts_and_runs_it(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """The child killed, the parent's child watch publishes the hand-over through the broker's
    connection pool while the worker forks the replacement. A child forked while that thread is
    inside the pool inherits it taken, and hangs as it closes the broker connections it
    inherited: the worker kills it after 4 s ("Timed out waiting for UP message"). Here the
    publish holds the pool until the worker is about to fork, for certain: the fork must wait
    for the publish (the fork guard), and the replacement start at once and run the task."""
    worker = workers(name="w1", concurrency=2, env={"LOCKAPP_FORK_NOTES": "1"})
    holder = _hold(lockapp, "published")
    first = _park(lockapp, lockapp.in_line, "published", 1)
    busy = lockapp.hold.delay(
        "published-busy", 60
    )  # the other child: the hand-over goes to the new
    wait_started(lockapp, "published-busy")
    child = int(lockapp.r.hget("pid", holder.id))
    others = set(worker.children()) - {child}
    lockapp.r.set("fork:note", 1)
    os.kill(child, signal.SIGKILL)
    wait_for(lambda: first.state == "SUCCESS", "the task handed the lock to run", timeout=60)
    ran = int(lockapp.r.hget("pid", first.id))
    assert ran not in others
    events = [e.decode() for e in lockapp.r.lrange("fork:events", 0, -1)]
    # The fork waited for the publish it would have cut in two; the first child forked runs.
    assert events[:4] == ["publishing", "fork", "published", f"up:{ran}"], events
    assert events.count("fork") == 1, events
    assert "Timed out waiting for UP message" not in worker.log()
    stop(lockapp, "published-busy")
    wait_for(lambda: busy.state == "SUCCESS", "the busy task to end")


def _force_release_all(lockapp: ModuleType, name: str, how: str) -> None:
    """Frees every lease of lock ``name`` as an operator would: the admin API, ``celery -A
    lockapp redislock release --all``, or the framework-free ``redislock release --all``."""
    if how == "admin":
        assert admin.force_release(lockapp.r, name, everything=True).holders
        return
    if how == "celery":
        command = [sys.executable, "-m", "celery", "-A", "lockapp", "redislock"]
    else:
        command = [str(Path(sys.executable).parent / "redislock"), "--url", lockapp.URL]
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [*command, "release", name, "--all"],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
        cwd=TESTS,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert f"freed lock {name!r}" in done.stdout


@pytest.mark.parametrize("how", ["admin", "celery", "redislock"])
def test_a_forced_release_hands_the_lock_to_the_next_in_line_at_once(
    lockapp: ModuleType, workers: Callable[..., Worker], how: str
) -> None:
    """An operator's release (a stuck holder) hands the lock over as the holder's own release
    would: the parked task starts within a sweep and a delivery, not when the short lease
    handed to it lapses unpublished (10 s)."""
    workers(name="w1", concurrency=2)
    holder = _hold(lockapp, "forced")
    waiting = _park(lockapp, lockapp.in_line, "forced", 1)
    _force_release_all(lockapp, "line:forced", how)
    # The lease handed to the parked task lapses unpublished at the end of the publish window
    # (10 s): a start before then was the hand-over's publish, however slow the machine.
    lapse = lapse_at(Lock(lockapp.r, "line:forced", ttl=30), default=PUBLISH_WINDOW_S)
    wait_for(lambda: waiting.id in started(lockapp, "line:forced"), "the parked task to start", 30)
    assert time.monotonic() < lapse, "the parked task started only as its hand-over lapsed"
    lockapp.r.set("stop:forced", 1)
    _all_succeeded([holder, waiting], timeout=30)
    assert started(lockapp, "line:forced") == [holder.id, waiting.id]


@pytest.mark.slow  # about 4 s on 2 quiet cores
def test_a_whole_dead_worker_is_handed_on_by_another_workers_sweeper(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    doomed = workers(name="doomed", concurrency=2, env={"LOCKAPP_TTL": "2"})
    holder = _hold(lockapp, "whole")
    waiting = _park(lockapp, lockapp.in_line, "whole", 1)
    workers(name="sweeps", concurrency=1, env={"LOCKAPP_TTL": "2"})
    os.killpg(doomed.pid, signal.SIGKILL)  # parent and children: nobody releases
    # The lease lapses after its 2 s ttl; the other worker's sweeper hands the lock on.
    wait_for(lambda: waiting.state == "SUCCESS", "the parked task to run", timeout=30)
    assert started(lockapp, "line:whole") == [holder.id, waiting.id]


def test_a_task_past_max_wait_fails_without_running(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers(name="w1", concurrency=2)
    holder = _hold(lockapp, "late")
    late = lockapp.impatient.delay("late")
    wait_for(lambda: late.state == "FAILURE", "the task to end as expired", timeout=20)
    assert isinstance(late.result, LockNotAcquired)
    assert "max_wait" in str(late.result)
    assert started(lockapp, "line:late") == [holder.id]  # it never ran
    lockapp.r.set("stop:late", 1)
    wait_for(lambda: holder.state == "SUCCESS", "the holder to end")
    assert [a for t, a in _conflicts(lockapp) if t == late.id] == ["queue", "expired"]


def test_a_full_line_fails_the_newcomer_with_line_full(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers(name="w1", concurrency=2)
    holder = _hold(lockapp, "full")
    parked = [lockapp.short_line.delay("full") for _ in range(2)]
    wait_for(lambda: sum(a == "queue" for _, a in _conflicts(lockapp)) == 2, "two tasks to park")
    third = lockapp.short_line.delay("full")
    wait_for(lambda: third.state == "FAILURE", "the third to be refused", timeout=20)
    assert isinstance(third.result, LineFull)
    lockapp.r.set("stop:full", 1)
    _all_succeeded([holder, *parked], timeout=30)


def test_a_copy_delivered_while_its_task_waits_takes_no_second_place(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """A duplicate of a parked task's message (what a hand-over published twice looks like)
    finds its own entry and parks nowhere else; the task runs once."""
    workers(name="w1", concurrency=2)
    holder = _hold(lockapp, "dup")
    waiting = _park(lockapp, lockapp.in_line, "dup", 1)
    meta = "redislock:{line:dup}:meta"
    [field] = [f for f in lockapp.r.hkeys(meta) if f.startswith(b"p:")]
    payload = json.loads(json.loads(lockapp.r.hget(meta, field))["x"])
    lockapp.app.signature(payload).apply_async()  # the same message, once more
    wait_for(
        lambda: [a for t, a in _conflicts(lockapp) if t == waiting.id] == ["queue", "queue"],
        "the copy to be parked in the same place",
    )
    assert lockapp.r.hget(meta, "qp") == b"1"
    lockapp.r.set("stop:dup", 1)
    _all_succeeded([holder, waiting], timeout=30)
    assert started(lockapp, "line:dup") == [holder.id, waiting.id]


def test_a_unique_task_keeps_its_claim_while_it_waits_in_line(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers(name="w1", concurrency=2)
    holder = _hold(lockapp, "uq")
    first = _park(lockapp, lockapp.unique_in_line, "uq")
    # Parked (its message acked), yet still queued for duplicates: the same call is not
    # published again but handed the waiting task's result.
    again = lockapp.unique_in_line.delay("uq")
    assert again.id == first.id
    lockapp.r.set("stop:uq", 1)
    _all_succeeded([holder, first], timeout=30)
    assert started(lockapp, "line:uq") == [holder.id, first.id]


@pytest.mark.slow  # about 7 s on 2 quiet cores
@pytest.mark.parametrize("concurrency", [3])
def test_the_line_keeps_working_after_a_redelivered_hand_over(
    lockapp: ModuleType, workers: Callable[..., Worker], concurrency: int
) -> None:
    """Many keys at once, several workers: every task runs exactly once, never two per key."""
    workers(name="w1", concurrency=concurrency)
    workers(name="w2", concurrency=concurrency)
    results = [lockapp.in_line.delay(f"k{i % 3}", i, 0.05) for i in range(30)]
    _all_succeeded(results, timeout=90)
    for k in range(3):
        seen = [int(x) for x in lockapp.r.lrange(f"seen:line:k{k}", 0, -1)]
        assert seen == [1] * 10
        ran = started(lockapp, f"line:k{k}")
        assert len(ran) == len(set(ran)) == 10


def test_a_revoked_task_in_line_hands_the_lock_on_without_waiting_its_window(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """A task revoked while it waits in line is discarded when its hand-over is delivered;
    the lock goes to the next in line then, not after the 60 s hand-over window."""
    workers(name="w1", concurrency=2)
    holder = _hold(lockapp, "rv")
    revoked = _park(lockapp, lockapp.in_line, "rv", 1)
    after = _park(lockapp, lockapp.in_line, "rv", 2)
    lockapp.app.control.revoke(revoked.id)
    wait_for(
        lambda: (lockapp.app.control.inspect(timeout=1).revoked() or {}) != {},
        "the worker to hear the revoke",
    )
    stopped = time.monotonic()
    lockapp.r.set("stop:rv", 1)
    wait_for(lambda: after.state == "SUCCESS", "the next task to run", timeout=30)
    assert time.monotonic() - stopped < 20  # well within the 60 s hand-over window
    assert revoked.state == "REVOKED"
    assert started(lockapp, "line:rv") == [holder.id, after.id]
