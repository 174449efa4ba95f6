"""The release table, row by row, with a real prefork worker (-c 2) killed or revoked for real.

Leases live 30 s here (``LOCKAPP_TTL``), so a lock found free within a few seconds was released,
not left to expire; then a waiting duplicate must run.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from types import ModuleType

import pytest
from conftest import wait_for
from workers import Worker, children_of

from celery_redislock import lock_for

# Far below the 30 s ttl: "at once" means the lease was released, not expired.
PROMPTLY = 5.0


def _lock(lockapp: ModuleType, name: str):  # type: ignore[no-untyped-def]
    return lock_for(lockapp.hold, (name,))


def _wait_started(lockapp: ModuleType, name: str, count: int = 1) -> list[str]:
    wait_for(lambda: lockapp.r.llen(f"started:{name}") >= count, f"{name} started", 30)
    return [t.decode() for t in lockapp.r.lrange(f"started:{name}", 0, -1)]


def _child_pid(lockapp: ModuleType, task_id: str) -> int:
    return int(lockapp.r.hget("pid", task_id))


def _duplicate_runs(lockapp: ModuleType, name: str) -> None:
    """A duplicate enqueued now (retrying on conflict) gets the lock and runs."""
    result = lockapp.duplicate.delay(name)
    assert result.get(timeout=30) == "ran"


@pytest.mark.parametrize("ending", ["return", "fail", "ignore", "reject"])
def test_child_releases_at_once_on_each_ending(
    lockapp: ModuleType, workers: Callable[..., Worker], ending: str
) -> None:
    workers()
    lock = _lock(lockapp, "a")
    result = lockapp.hold.delay("a", 0.3, ending)
    _wait_started(lockapp, "a")
    assert lock.locked()
    wait_for(lambda: lockapp.r.llen("ended:a") == 1, "the run ended", 30)
    wait_for(lambda: not lock.locked(), f"released after {ending}", PROMPTLY)
    if ending == "return":
        assert result.get(timeout=10) == "return"
    _duplicate_runs(lockapp, "a")


def test_retry_releases_and_the_retried_run_takes_the_lock(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers()
    # countdown=0: the retried message is on the queue at once, while the first run is ending.
    result = lockapp.hold.delay("b", 0.2, "retry")
    assert result.get(timeout=30) == "retry"
    ended = [e.decode() for e in lockapp.r.lrange("ended:b", 0, -1)]
    assert [e.split(":", 1)[1] for e in ended] == ["retry:0", "retry:1"]  # both runs ran
    assert not _lock(lockapp, "b").locked()


def test_soft_time_limit_releases_at_once(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers()
    lockapp.soft_limited.delay("c")
    _wait_started(lockapp, "c")
    wait_for(lambda: lockapp.r.llen("ended:c") == 1, "soft limit hit", 30)
    wait_for(lambda: not _lock(lockapp, "c").locked(), "released after soft limit", PROMPTLY)
    _duplicate_runs(lockapp, "c")


def test_hard_time_limit_parent_releases(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    worker = workers()
    lockapp.hard_limited.delay("d")
    (task_id,) = _wait_started(lockapp, "d")
    child = _child_pid(lockapp, task_id)
    wait_for(lambda: child not in worker.children(), "the child killed by the hard limit", 30)
    wait_for(lambda: not _lock(lockapp, "d").locked(), "released by the parent", PROMPTLY)
    _duplicate_runs(lockapp, "d")


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_killed_child_parent_releases(
    lockapp: ModuleType, workers: Callable[..., Worker], signum: int
) -> None:
    worker = workers()
    lockapp.hold.delay("e", 60)
    (task_id,) = _wait_started(lockapp, "e")
    lock = _lock(lockapp, "e")
    assert lock.locked()
    os.kill(_child_pid(lockapp, task_id), signum)
    wait_for(lambda: not lock.locked(), "released by the parent", PROMPTLY)
    _duplicate_runs(lockapp, "e")
    assert worker.proc is not None and worker.proc.poll() is None  # the worker lives on


def test_revoke_terminate_parent_releases(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    worker = workers()
    result = lockapp.hold.delay("f", 60)
    (task_id,) = _wait_started(lockapp, "f")
    child = _child_pid(lockapp, task_id)
    lock = _lock(lockapp, "f")
    result.revoke(terminate=True, signal="SIGKILL")
    wait_for(lambda: not lock.locked(), "released after revoke(terminate=True)", PROMPTLY)
    assert child not in children_of(worker.pid)
    _duplicate_runs(lockapp, "f")


def test_whole_worker_killed_lease_expires_within_ttl(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    worker = workers(env={"LOCKAPP_TTL": "2"})
    lockapp.hold.delay("g", 60)
    _wait_started(lockapp, "g")
    lock = lock_for(lockapp.hold, ("g",))
    (holder,) = lock.holders()
    worker.kill()  # main process and children: nobody is left to release
    assert lock.locked()  # nobody released it ...
    wait_for(lambda: not lock.locked(), "the lease expired", holder.expires_in + 1.0)  # ... ttl
    workers(name="w2")
    _duplicate_runs(lockapp, "g")


def test_warm_shutdown_lets_the_task_finish_and_release(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    worker = workers()
    result = lockapp.hold.delay("h", 1.0)
    _wait_started(lockapp, "h")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert result.get(timeout=5) == "return"
    assert not _lock(lockapp, "h").locked()


def test_cold_shutdown_releases(lockapp: ModuleType, workers: Callable[..., Worker]) -> None:
    worker = workers()
    lockapp.hold.delay("i", 60)
    _wait_started(lockapp, "i")
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
    group_result = [lockapp.hold.delay(f"n{i}", 0) for i in range(40)]
    assert [r.get(timeout=60) for r in group_result] == ["return"] * 40

    def watched() -> int:
        replies = lockapp.app.control.inspect(timeout=2)._request("redislock_watched") or {}
        return sum(reply["watched"] for reply in replies.values())

    wait_for(lambda: watched() == 0, "the parent watches no finished task", 10)


def test_revoke_terminate_of_a_child_slow_to_die_releases_once_it_is_dead(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    worker = workers()
    result = lockapp.slow_to_die.delay("sd")
    (task_id,) = _wait_started(lockapp, "sd")
    child = _child_pid(lockapp, task_id)
    lock = lock_for(lockapp.slow_to_die, ("sd",))
    result.revoke(terminate=True)  # SIGTERM: the child lingers 0.5 s, still holding the lease
    wait_for(lambda: result.state == "REVOKED", "Celery counts the task revoked", 10)
    held = lock.locked()
    assert held or child not in children_of(worker.pid), "released while the child lived"
    wait_for(lambda: not lock.locked(), "released once the child died", PROMPTLY)
    assert child not in children_of(worker.pid)
