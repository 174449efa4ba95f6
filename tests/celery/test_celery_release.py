"""The release table, row by row, with a real prefork worker (-c 2) killed or revoked for real.

Leases live 30 s here (``LOCKAPP_TTL``), so a lock found free within a few seconds was released,
not left to expire; then a waiting duplicate must run.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import celery
import pytest
from celery import Celery
from celery.exceptions import Reject
from celery.worker.request import Request
from helpers import wait_for, wait_started
from workers import Worker, children_of

from celery_redislock import LockConfigError, LockedTask, LockRequest, install, lock_for

# Far below the 30 s ttl: "at once" means the lease was released, not expired.
PROMPTLY = 5.0
# acks_late: released "just after" the result is stored, by the same process in its next step;
# 2 s is that step plus the margin of a loaded 2-core machine.
JUST_AFTER = 2.0


def _lock(lockapp: ModuleType, name: str):  # type: ignore[no-untyped-def]
    return lock_for(lockapp.hold, (name,))


def _child_pid(lockapp: ModuleType, task_id: str) -> int:
    return int(lockapp.r.hget("pid", task_id))


def _duplicate_runs(lockapp: ModuleType, name: str) -> None:
    """A duplicate enqueued now (retrying on conflict) gets the lock and runs."""
    result = lockapp.duplicate.delay(name)
    assert result.get(timeout=30) == "ran"


def _at_store(lockapp: ModuleType, task_id: str) -> dict[str, str]:
    """Whether the run's lock was held when Celery had just stored its result (lockapp notes
    it from task_success/task_failure, which come right after the store)."""
    key = f"at-store:{task_id}"
    wait_for(lambda: lockapp.r.exists(key), "the worker noted the lock at the store", 10)
    return {k.decode(): v.decode() for k, v in lockapp.r.hgetall(key).items()}


def _ran_to_its_end(lockapp: ModuleType, task_id: str) -> str:
    """Waits for the run's task_postrun (after its result, if any, is stored); its state."""
    wait_for(lambda: lockapp.r.hexists("postrun", task_id), "the run ended", 30)
    return str(lockapp.r.hget("postrun", task_id).decode())


# Celery 5.7 stores FAILURE for a Reject(requeue=False) (the worker's parent does, after the
# child ended); before, nothing is stored for it.
REJECT_STORES_FAILURE = tuple(celery.VERSION[:2]) >= (5, 7)


def test_child_releases_at_once_on_each_ending(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """Released before the result is stored, for every ending: once a caller sees the result,
    the lock is free, with no waiting. An acks_late run releases just after instead (the
    release carries the record that it finished). One worker runs every ending."""
    workers()

    def lock(name: str) -> Any:
        return lock_for(lockapp.ends, (name, ""))

    done = lockapp.ends.delay("ret", "return")
    assert done.get(timeout=30) == "return"
    assert not lock("ret").locked()  # at once: no wait_for
    assert done.state == "SUCCESS"
    assert _at_store(lockapp, done.id) == {"success": "free"}

    failed = lockapp.ends.delay("fail", "fail")
    with pytest.raises(RuntimeError, match="failed on purpose"):
        failed.get(timeout=30)
    assert not lock("fail").locked()
    assert failed.state == "FAILURE"
    assert _at_store(lockapp, failed.id) == {"failure": "free"}

    # Ignore stores no result: the run's end is its task_postrun.
    ignored = lockapp.ends.delay("ign", "ignore")
    assert _ran_to_its_end(lockapp, ignored.id) == "IGNORED"
    assert not lock("ign").locked()
    assert ignored.state == "PENDING"

    rejected = lockapp.ends.delay("rej", "reject")
    assert _ran_to_its_end(lockapp, rejected.id) == "REJECTED"
    assert not lock("rej").locked()
    if REJECT_STORES_FAILURE:
        wait_for(lambda: rejected.state == "FAILURE", "the parent stored FAILURE", 10)
        assert isinstance(rejected.result, Reject)
    else:
        assert rejected.state == "PENDING"

    # acks_late: the result is stored while the lease is still held, then it goes.
    late = lockapp.ends_late.delay("late", "return")
    assert late.get(timeout=30) == "return"
    assert _at_store(lockapp, late.id) == {"success": "held"}
    wait_for(lambda: not lock("late").locked(), "released just after the result", JUST_AFTER)
    late_failed = lockapp.ends_late.delay("late-fail", "fail")
    with pytest.raises(RuntimeError, match="failed on purpose"):
        late_failed.get(timeout=30)
    assert _at_store(lockapp, late_failed.id) == {"failure": "held"}
    wait_for(lambda: not lock("late-fail").locked(), "released just after", JUST_AFTER)
    _duplicate_runs(lockapp, "ret")


def test_retry_releases_and_the_retried_run_takes_the_lock(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """self.retry() gives the lock back before its retry is published: the publish is held
    (PausesBeforeRetrying) while the test looks, then the retry runs under the lock."""
    workers()
    lock = lock_for(lockapp.retried_with_lock, ("b",))
    result = lockapp.retried_with_lock.delay("b")
    wait_for(lambda: lockapp.r.llen("retry-gap") == 1, "the retry about to be published", 30)
    assert not lock.locked(), "the retry is published while its run still holds the lock"
    assert lockapp.r.llen("started:b") == 1  # its retry is not yet published
    lockapp.r.set("retry-gap:go", 1)
    assert result.get(timeout=30) == "ran"
    assert [t.decode() for t in lockapp.r.lrange("started:b", 0, -1)] == [result.id] * 2
    assert not lock.locked()


def test_soft_time_limit_releases_at_once(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers()
    lockapp.soft_limited.delay("c")
    wait_started(lockapp, "c")
    wait_for(lambda: lockapp.r.llen("ended:c") == 1, "soft limit hit", 30)
    wait_for(lambda: not _lock(lockapp, "c").locked(), "released after soft limit", PROMPTLY)
    _duplicate_runs(lockapp, "c")


@pytest.mark.faults
def test_hard_time_limit_parent_releases(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    worker = workers()
    lockapp.hard_limited.delay("d")
    (task_id,) = wait_started(lockapp, "d")
    child = _child_pid(lockapp, task_id)
    wait_for(lambda: child not in worker.children(), "the child killed by the hard limit", 30)
    wait_for(lambda: not _lock(lockapp, "d").locked(), "released by the parent", PROMPTLY)
    _duplicate_runs(lockapp, "d")


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
@pytest.mark.faults
def test_killed_child_parent_releases(
    lockapp: ModuleType, workers: Callable[..., Worker], signum: int
) -> None:
    """The parent releases the dead child's lease at once, and only it: leases whose record
    names the same task id with another host or pid, or another task id, are left alone."""
    worker = workers()
    lockapp.shares_a_lock.delay("e")
    (task_id,) = wait_started(lockapp, "e")
    child = _child_pid(lockapp, task_id)
    lock = lock_for(lockapp.shares_a_lock, ("e",))
    (own,) = lock.holders()
    assert (own.info["task_id"], own.info["pid"]) == (task_id, str(child))
    host = own.info["host"]
    others = [
        {"task_id": task_id, "host": "elsewhere", "pid": str(child)},  # another worker's host
        {"task_id": task_id, "host": host, "pid": "1"},  # another process here
        {"task_id": "another-task", "host": host, "pid": str(child)},
    ]
    kept = sorted(lock.acquire(blocking=False, info=info).token for info in others)
    os.kill(child, signum)
    wait_for(
        lambda: own.token not in [h.token for h in lock.holders()],
        "the dead child's lease released by the parent",
        PROMPTLY,
    )
    # One release_where call chose what to release: what it left stays.
    assert sorted(h.token for h in lock.holders()) == kept
    assert worker.proc is not None and worker.proc.poll() is None  # the worker lives on


@pytest.mark.faults
def test_revoke_terminate_parent_releases(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    worker = workers()
    result = lockapp.hold.delay("f", 60)
    (task_id,) = wait_started(lockapp, "f")
    child = _child_pid(lockapp, task_id)
    lock = _lock(lockapp, "f")
    result.revoke(terminate=True, signal="SIGKILL")
    wait_for(lambda: not lock.locked(), "released after revoke(terminate=True)", PROMPTLY)
    assert child not in children_of(worker.pid)
    _duplicate_runs(lockapp, "f")


@pytest.mark.slow  # about 4 s on 2 quiet cores
@pytest.mark.faults
def test_whole_worker_killed_lease_expires_within_ttl(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    worker = workers(env={"LOCKAPP_TTL": "2"})
    lockapp.hold.delay("g", 60)
    wait_started(lockapp, "g")
    lock = lock_for(lockapp.hold, ("g",))
    (holder,) = lock.holders()
    worker.kill()  # main process and children: nobody is left to release
    assert lock.locked()  # nobody released it ...
    wait_for(lambda: not lock.locked(), "the lease expired", holder.expires_in + 1.0)  # ... ttl
    workers(name="w2")
    _duplicate_runs(lockapp, "g")


@pytest.mark.slow  # about 4 s on 2 quiet cores
@pytest.mark.faults
def test_warm_shutdown_lets_the_task_finish_and_release(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    worker = workers()
    result = lockapp.hold.delay("h", 1.0)
    wait_started(lockapp, "h")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert result.get(timeout=5) == "return"
    assert not _lock(lockapp, "h").locked()


@pytest.mark.faults
def test_cold_shutdown_releases(lockapp: ModuleType, workers: Callable[..., Worker]) -> None:
    worker = workers()
    lockapp.hold.delay("i", 60)
    wait_started(lockapp, "i")
    lock = _lock(lockapp, "i")
    worker.signal(signal.SIGQUIT)  # cold shutdown: running tasks are cancelled
    worker.wait(30)
    wait_for(lambda: not lock.locked(), "released at cold shutdown", PROMPTLY)


def test_parent_stops_watching_children_once_their_tasks_end(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """Celery's per-task request class overrides on_success without calling up: the watch must
    learn that a task ended some other way, or it grows with every task the worker runs."""
    workers()
    node = f"w1@{socket.gethostname()}"

    def watched() -> dict[str, int]:
        # The worker's parent answers the test app's redislock_watched command; no reply in
        # time gives {}, which never equals the expected {node: n}.
        replies = lockapp.app.control.broadcast(
            "redislock_watched",
            reply=True,
            timeout=2,
            limit=1,  # one node: done once it answers
        )
        return {name: answer["watched"] for reply in replies for name, answer in reply.items()}

    running = lockapp.hold.delay("nw", 60)
    wait_started(lockapp, "nw")
    wait_for(lambda: watched() == {node: 1}, "the parent watches the running child", 10)
    lockapp.r.set("stop:nw", 1)
    assert running.get(timeout=30) == "return"
    group_result = [lockapp.hold.delay(f"n{i}", 0) for i in range(40)]
    assert [r.get(timeout=60) for r in group_result] == ["return"] * 40
    wait_for(lambda: watched() == {node: 0}, "the parent watches no finished task", 10)


@pytest.mark.faults
def test_revoke_terminate_of_a_child_slow_to_die_releases_once_it_is_dead(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """Celery counts the task REVOKED at once; the child lingers 0.5 s after SIGTERM. All that
    time its lease stays: polled, not sampled once."""
    worker = workers()
    result = lockapp.slow_to_die.delay("sd")
    (task_id,) = wait_started(lockapp, "sd")
    child = _child_pid(lockapp, task_id)
    lock = lock_for(lockapp.slow_to_die, ("sd",))
    result.revoke(terminate=True)  # SIGTERM: the child lingers 0.5 s, still holding the lease
    revoked_while_alive = False
    deadline = time.monotonic() + 30
    while True:
        held = lock.locked()
        # Read after the lock: a child alive now was alive when the lock was read.
        if child not in children_of(worker.pid):
            break
        assert held, "the parent released the lease while its child still ran"
        revoked_while_alive = revoked_while_alive or result.state == "REVOKED"
        assert time.monotonic() < deadline, "the child never died"
    assert revoked_while_alive, "the child died before Celery counted the task revoked"
    wait_for(lambda: not lock.locked(), "released once the child died", PROMPTLY)


class _PlainRequest(Request):  # type: ignore[misc]
    """A custom request class that forgot to derive from LockRequest."""


class _OwnLockRequest(LockRequest):
    """A custom request class done right."""


def test_a_request_class_not_derived_from_lock_request_is_refused() -> None:
    """Without LockRequest the parent would never release a killed child's lease (it would
    lapse only after its ttl): such a task is refused as it is declared."""
    app = install(Celery("refusing", broker="memory://", set_as_current=False))
    with pytest.raises(LockConfigError) as refused:

        @app.task(lock="r:{n}", Request=_PlainRequest, shared=False)
        def by_option(n: int) -> None: ...

    message = str(refused.value)
    assert ".by_option'" in message and "_PlainRequest" in message
    assert "derive it from celery_redislock.LockRequest" in message

    class PlainBase(LockedTask):
        Request = "celery.worker.request:Request"  # named by a string, as Celery allows

    with pytest.raises(LockConfigError, match=r"by_base.*worker\.request\.Request"):

        @app.task(base=PlainBase, lock="r:{n}", shared=False)
        def by_base(n: int) -> None: ...

    # Accepted: a subclass of LockRequest, and any request class for a task with no lock.
    @app.task(lock="r:{n}", Request=_OwnLockRequest, shared=False)
    def derived(n: int) -> None: ...

    @app.task(Request=_PlainRequest, shared=False)
    def unlocked(n: int) -> None: ...

    # An app given the task class without install(): refused as the task is bound. (Every task
    # here is shared=False: a shared one would be bound, and refused, in every later app.)
    bare = Celery("bare", broker="memory://", set_as_current=False, task_cls=LockedTask)
    with pytest.raises(LockConfigError, match=r"\.late'.*_PlainRequest"):

        @bare.task(lock="r:{n}", Request=_PlainRequest, lazy=False, shared=False)
        def late(n: int) -> None: ...
