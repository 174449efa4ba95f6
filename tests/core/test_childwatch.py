"""The worker parent's child watch: tells which children died, with pidfds or /proc; and the fork
guard its calls hold."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from celery_redislock.core.childwatch import ChildWatch
from celery_redislock.core.forkguard import FORK_GUARD

pytestmark = pytest.mark.faults  # the watched children are killed


@pytest.mark.parametrize("pidfd", [True, False])
def test_wait_for_deaths_reports_the_dead_and_only_them(
    monkeypatch: pytest.MonkeyPatch, pidfd: bool
) -> None:
    if not pidfd:

        def unsupported(pid: int) -> int:
            raise OSError("pidfd_open: not supported")

        monkeypatch.setattr(os, "pidfd_open", unsupported)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    doomed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    pidfds: dict[int, int] = {}
    try:
        pids = {live.pid, doomed.pid}
        assert ChildWatch._wait_for_deaths(pids, pidfds) == set()
        doomed.kill()  # a zombie until reaped: it counts as dead
        found: set[int] = set()
        for _ in range(100):
            found |= ChildWatch._wait_for_deaths(pids, pidfds)
            if found:
                break
        assert found == {doomed.pid}
        assert doomed.pid not in pidfds  # its pidfd was closed
        if pidfd:
            assert set(pidfds) == {live.pid}
        # A pid that is no longer watched has its pidfd closed too.
        assert ChildWatch._wait_for_deaths(set(), pidfds) == set()
        assert pidfds == {}
    finally:
        for proc in (live, doomed):
            proc.kill()
            proc.wait()


# Notes each fork of this process about to happen while a test sets it (registered after the
# fork guard's hook, so run before it: before the fork waits).
_FORKING: list[threading.Event] = []
os.register_at_fork(before=lambda: [e.set() for e in _FORKING])


def _fork_and_take_the_guard() -> int:
    """Forks; the child takes its fork guard (free there, whoever held it at the fork) and
    exits 0, or 1 if it could not. Returns the child's exit status."""
    pid = os.fork()
    if pid == 0:
        os._exit(0 if FORK_GUARD._lock.acquire(timeout=10) else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_fork_waits_while_another_thread_holds_the_fork_guard() -> None:
    events: list[str] = []
    held, go, forking = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        with FORK_GUARD.held():
            held.set()
            assert go.wait(60)
            events.append("released")

    def fork() -> None:
        status = _fork_and_take_the_guard()
        events.append(f"forked:{status}")

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(60)
    _FORKING.append(forking)
    try:
        forker = threading.Thread(target=fork)
        forker.start()
        assert forking.wait(60)  # the fork has begun: it waits for the guard
    finally:
        _FORKING.remove(forking)
    go.set()
    holder.join(60)
    forker.join(60)
    assert events == ["released", "forked:0"]
    with FORK_GUARD.held():  # released in the parent after the fork
        pass


def test_a_thread_holding_the_fork_guard_may_fork() -> None:
    with FORK_GUARD.held():  # reentrant: the fork's own take of it does not wait
        assert _fork_and_take_the_guard() == 0
    assert _fork_and_take_the_guard() == 0
