"""The worker parent's child watch: tells which children died, with pidfds or /proc."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from celery_redislock.core.childwatch import ChildWatch

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
