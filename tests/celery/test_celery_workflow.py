"""A lock held across a workflow (``lock_workflow``) with real workers: chains of one key never
interleave, a failing link releases at once, a skipped workflow answers, a link that waits in
the queue longer than the ttl goes on with the lease, a killed worker's lease lapses within the
ttl and the next workflow runs."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from celery import chain
from helpers import wait_for
from workers import Worker

from celery_redislock import LockLost, TaskSkipped, lock_workflow
from celery_redislock.core.lock import Lock


def _records(lockapp: ModuleType, key: str) -> list[tuple[int, int, int, int, int]]:
    """Each link's run: (chain, link, start µs, end µs, pid), on Redis's clock."""
    rows = [v.decode().split() for v in lockapp.r.lrange(f"flow:{key}", 0, -1)]
    return [(int(c), int(li), int(s), int(e), int(p)) for c, li, s, e, p in rows]


def _lock(lockapp: ModuleType, name: str) -> Lock:
    return Lock(lockapp.r, name, ttl=1)


def _flow(lockapp: ModuleType, key: str, n: int, lock: Any, links: list[dict[str, Any]]) -> Any:
    steps = [lockapp.flow_step.si(key, n, i, **each) for i, each in enumerate(links)]
    return lock_workflow(chain(*steps), lock=lock)


def _wait_result(result: Any, timeout: float) -> None:
    """Waits until ``result`` is ready, reading its state from the backend (not .get(): see
    test_celery_exclusion's _run_all)."""
    wait_for(result.ready, f"{result.id} ready", timeout)


@pytest.fixture
def two_workers(workers: Callable[..., Worker]) -> None:
    workers(name="w1")
    workers(name="w2")


@pytest.mark.slow
@pytest.mark.usefixtures("two_workers")
def test_chains_of_one_key_never_interleave_and_each_runs_once(lockapp: ModuleType) -> None:
    keys = [f"k{i}" for i in range(4)]
    lock = {"key": "flow:{key}", "on_conflict": "retry", "countdown": 0.1}
    calls = [(keys[n % 4], n) for n in range(20)]
    random.Random(11).shuffle(calls)
    links = [{"seconds": 0.05}, {"seconds": 0.05}, {"seconds": 0.05}]
    results = [_flow(lockapp, key, n, lock, links).apply_async() for key, n in calls]
    for result in results:
        _wait_result(result, timeout=240)
        assert result.successful(), result.result
    for key in keys:
        records = _records(lockapp, key)
        mine = sorted(n for k, n in calls if k == key)
        # Every chain ran once, every link once, in order.
        assert sorted((c, li) for c, li, *_ in records) == [(n, i) for n in mine for i in range(3)]
        spans: dict[int, tuple[int, int]] = {}
        for c, _li, start, end, _pid in records:
            first, last = spans.get(c, (start, end))
            spans[c] = (min(first, start), max(last, end))
            assert start <= end
        ordered = sorted(spans.values())
        for (_, end), (start, _) in itertools.pairwise(ordered):
            assert end <= start, f"{key}: two chains interleaved: {ordered}"
        assert not _lock(lockapp, f"flow:{key}").locked()
    gaps = []
    for key in keys:
        spans: dict[int, tuple[int, int]] = {}
        for c, _li, start, end, _pid in _records(lockapp, key):
            first, last = spans.get(c, (start, end))
            spans[c] = (min(first, start), max(last, end))
        ordered = sorted(spans.values())
        gaps += [b[0] - a[1] for a, b in itertools.pairwise(ordered)]
    links = sum(len(_records(lockapp, key)) for key in keys)
    print(
        f"{len(results)} chains, {links} links on {len(keys)} keys: no overlap; the shortest "
        f"time between two chains of one key {min(gaps) / 1000:.1f} ms"
    )
    # The lease went from process to process: some chain's links ran in several.
    per_chain: dict[tuple[str, int], set[int]] = {}
    for key in keys:
        for c, _li, _s, _e, pid in _records(lockapp, key):
            per_chain.setdefault((key, c), set()).add(pid)
    assert any(len(pids) > 1 for pids in per_chain.values()), per_chain


@pytest.mark.slow  # about 6 s on 2 quiet cores
@pytest.mark.usefixtures("two_workers")
def test_a_failing_middle_link_releases_at_once(lockapp: ModuleType) -> None:
    lock = {"key": "flow:{key}", "ttl": 60}
    links = [{}, {"ending": "fail"}, {}]
    result = _flow(lockapp, "f", 1, lock, links).apply_async()
    with pytest.raises(RuntimeError, match="failed on purpose"):
        result.get(timeout=60)
    # Released as the link failed, not when its 60 s ttl ran out.
    wait_for(lambda: not _lock(lockapp, "flow:f").locked(), "the lock is free", timeout=20)
    assert [(c, li) for c, li, *_ in _records(lockapp, "f")] == [(1, 0), (1, 1)]
    # The next workflow on the key runs.
    assert _flow(lockapp, "f", 2, lock, [{}, {}]).apply_async().get(timeout=60) == "2.1"


@pytest.mark.slow  # about 3 s on 2 quiet cores
@pytest.mark.usefixtures("two_workers")
def test_a_second_workflow_on_the_key_is_skipped_and_its_chain_answers(
    lockapp: ModuleType,
) -> None:
    lock = {"key": "flow:{key}"}  # on_conflict: skip (the default)
    first = _flow(lockapp, "s", 1, lock, [{"seconds": 30}, {}]).apply_async()
    wait_for(lambda: lockapp.r.llen("flow-started:s") == 1, "the first workflow started", 30)
    second = _flow(lockapp, "s", 2, lock, [{}, {}, {}]).apply_async()
    with pytest.raises(TaskSkipped) as skipped:
        second.get(timeout=60)
    assert skipped.value.name == "flow:s"
    lockapp.r.set("stop:s", 1)
    assert first.get(timeout=60) == "1.1"
    assert [(c, li) for c, li, *_ in _records(lockapp, "s")] == [(1, 0), (1, 1)]
    wait_for(lambda: not _lock(lockapp, "flow:s").locked(), "the lock is free", timeout=20)


@pytest.mark.slow
@pytest.mark.usefixtures("two_workers")
def test_a_link_queued_longer_than_the_ttl_goes_on_with_the_lease(lockapp: ModuleType) -> None:
    # The next link waits twice the ttl in the queue (a countdown) while the publisher renews.
    # (ttl 3 s: renewed each second, a loaded machine's stall of up to 2 s loses nothing.)
    lock = {"key": "flow:{key}", "ttl": 3}
    steps = [
        lockapp.flow_step.si("q", 1, 0),
        lockapp.flow_step.si("q", 1, 1).set(countdown=6),
        lockapp.flow_step.si("q", 1, 2),
    ]
    result = lock_workflow(chain(*steps), lock=lock).apply_async()
    wait_for(lambda: lockapp.r.llen("flow:q") == 1, "the first link ended", 30)
    other = _flow(lockapp, "q", 2, lock, [{}]).apply_async()  # meanwhile: skipped
    with pytest.raises(TaskSkipped):
        other.get(timeout=30)
    assert result.get(timeout=60) == "1.2"
    assert [(c, li) for c, li, *_ in _records(lockapp, "q")] == [(1, 0), (1, 1), (1, 2)]
    wait_for(lambda: not _lock(lockapp, "flow:q").locked(), "the lock is free", timeout=20)


def _worker_running(workers: list[Worker], pid: int) -> Worker:
    for worker in workers:
        if pid == worker.pid or pid in worker.children():
            return worker
    raise AssertionError(f"no worker runs pid {pid}")


@pytest.mark.slow
@pytest.mark.faults
def test_a_worker_killed_mid_workflow_frees_the_lease_within_the_ttl(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    started = [workers(name="w1"), workers(name="w2")]
    ttl = 3.0
    lock = {"key": "flow:{key}", "ttl": ttl, "on_conflict": "retry", "countdown": 0.2}
    first = _flow(lockapp, "x", 1, lock, [{}, {"seconds": 60}, {}]).apply_async()
    wait_for(lambda: lockapp.r.llen("flow-started:x") == 2, "the middle link started", 30)
    pid = int(lockapp.r.lindex("flow-started:x", 1).split()[2])
    victim = _worker_running(started, pid)
    victim_children = victim.children()
    victim.kill()  # the whole worker: no parent left to release anything
    killed_us = lockapp._redis_us()
    # Sent after the kill: a retry held for its countdown by the killed worker would be lost.
    second = _flow(lockapp, "x", 2, lock, [{}, {}, {}]).apply_async()
    (holder,) = _lock(lockapp, "flow:x").holders()
    assert holder.expires_in <= ttl
    lapses_us = killed_us + holder.expires_in * 1e6

    def lapsed() -> bool:
        # Never renewed after the kill (by no process: not the one that ran the first link
        # either), so it lapses within the ttl of the kill.
        now_us, held = lockapp._redis_us(), _lock(lockapp, "flow:x").holders()
        assert all(now_us + h.expires_in * 1e6 <= lapses_us + 50_000 for h in held), held
        return not held

    wait_for(lapsed, "the lease lapsed", timeout=30)
    freed_us = lockapp._redis_us()
    assert second.get(timeout=60) == "2.2"  # the next workflow ran, on the other worker
    runs = _records(lockapp, "x")
    assert [(c, li) for c, li, *_ in runs] == [(1, 0), (2, 0), (2, 1), (2, 2)]
    assert min(s for c, _li, s, *_ in runs if c == 2) >= killed_us
    assert not first.ready()  # (its worker died with the link: Celery never hears of it)
    link0_pid = int(lockapp.r.lindex("flow-started:x", 0).split()[2])
    print(
        f"lease freed {(freed_us - killed_us) / 1e6:.2f}s after the kill (ttl {ttl}s); "
        f"expires_in at the kill {holder.expires_in:.2f}s; first link in the killed worker: "
        f"{link0_pid in (victim.pid, *victim_children)}"
    )


@pytest.mark.slow  # about 6 s on 2 quiet cores
@pytest.mark.usefixtures("two_workers")
def test_a_link_that_retries_goes_on_with_the_lease(lockapp: ModuleType) -> None:
    lock = {"key": "flow:{key}", "ttl": 60}
    result = _flow(lockapp, "r", 1, lock, [{}, {"ending": "retry"}, {}]).apply_async()
    assert result.get(timeout=60) == "1.2"
    started = [v.decode().split()[:2] for v in lockapp.r.lrange("flow-started:r", 0, -1)]
    assert started == [["1", "0"], ["1", "1"], ["1", "1"], ["1", "2"]]  # the retry ran once
    wait_for(lambda: not _lock(lockapp, "flow:r").locked(), "the lock is free", timeout=20)


@pytest.mark.slow  # about 6 s on 2 quiet cores
@pytest.mark.usefixtures("two_workers")
def test_a_second_workflow_parks_in_the_line_and_runs_after_the_first(
    lockapp: ModuleType,
) -> None:
    lock = {"key": "flow:{key}", "on_conflict": "queue"}
    first = _flow(lockapp, "p", 1, lock, [{"seconds": 30}, {}]).apply_async()
    wait_for(lambda: lockapp.r.llen("flow-started:p") == 1, "the first workflow started", 30)
    second = _flow(lockapp, "p", 2, lock, [{}, {}]).apply_async()
    wait_for(lambda: lockapp.r.exists(_lock(lockapp, "flow:p").keys.all[2]), "parked", 30)
    lockapp.r.set("stop:p", 1)
    assert first.get(timeout=60) == "1.1"
    assert second.get(timeout=60) == "2.1"
    runs = _records(lockapp, "p")
    assert [(c, li) for c, li, *_ in runs] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert runs[1][3] <= runs[2][2]  # the second began after the first's last link ended


@pytest.mark.slow  # about 6 s on 2 quiet cores
@pytest.mark.usefixtures("two_workers")
def test_a_revoked_link_waiting_in_the_queue_releases_at_once(lockapp: ModuleType) -> None:
    lock = {"key": "flow:{key}", "ttl": 60}
    steps = [lockapp.flow_step.si("v", 1, 0), lockapp.flow_step.si("v", 1, 1).set(countdown=60)]
    result = lock_workflow(chain(*steps), lock=lock).apply_async()
    wait_for(lambda: lockapp.r.llen("flow:v") == 1, "the first link ended", 30)
    assert _lock(lockapp, "flow:v").locked()  # kept while the next link waits
    result.revoke()
    wait_for(lambda: not _lock(lockapp, "flow:v").locked(), "the lock is free", timeout=20)
    assert lockapp.r.llen("flow-started:v") == 1


@pytest.mark.slow
@pytest.mark.faults
def test_the_keeper_killed_between_links_ends_the_workflow_with_lock_lost(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    keeper = workers(name="w1")  # consumes "celery" only: the next link waits in "later"
    ttl = 3.0
    lock = {"key": "flow:{key}", "ttl": ttl}
    steps = [lockapp.flow_step.si("g", 1, 0), lockapp.flow_step.si("g", 1, 1).set(queue="later")]
    result = lock_workflow(chain(*steps), lock=lock).apply_async()
    wait_for(lambda: lockapp.r.llen("later") == 1, "the next link is queued", 30)
    assert _lock(lockapp, "flow:g").locked()
    keeper.kill()
    killed_us = lockapp._redis_us()
    wait_for(lambda: not _lock(lockapp, "flow:g").locked(), "the lease lapsed", timeout=30)
    freed_us = lockapp._redis_us()
    workers(name="w2", queues="later,celery")
    with pytest.raises(LockLost, match="lapsed while it waited in the queue"):
        result.get(timeout=60)
    assert lockapp.r.llen("flow-started:g") == 1  # the next link did not run
    assert freed_us - killed_us <= ttl * 1e6 + 500_000  # (a liveness bound: ttl + polling)
