"""The Prometheus metrics (celery_redislock.contrib.prometheus): scraped after real tasks ran in
a prefork Celery worker and real jobs in an RQ worker's horses (prometheus_client's multiprocess
mode), the counters moved by the right amounts; the publish and enqueue side's duplicates and a
failing Redis in this process; and the module imports no framework of its own accord."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import redis
import rqjobs
from helpers import free_port, wait_for, wait_started
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rq import Queue
from rqcheck import started, wait_ended
from rqworkers import RQWorker
from workers import Worker

from celery_redislock import DuplicateTask, Lock, LockBackendError
from celery_redislock.contrib import prometheus
from celery_redislock.core import admin
from celery_redislock.core.line import Handed, Parked, park, sweep_lines
from celery_redislock.integrations.celery.settings import set_setting
from celery_redislock.integrations.rq import UniqueQueue

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: bytes) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def cliapp(lockapp: ModuleType) -> ModuleType:
    import cliapp as module

    return module


@pytest.mark.slow
def test_counters_after_real_tasks_in_a_prefork_worker(
    lockapp: ModuleType,
    cliapp: ModuleType,
    workers: Callable[..., Worker],
    tmp_path: Path,
) -> None:
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    workers(
        app="cliapp",
        concurrency=2,
        env={"CLIAPP_METRICS": "1", "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
    )

    def scrape() -> Samples:
        return samples(prometheus.exposition(str(metrics_dir)))

    hold = {"task": "lockapp.hold"}
    for name, seconds in (("m1", 0), ("m2", 0), ("m3", 0.3)):
        assert lockapp.hold.delay(name, seconds).get(timeout=30) == "return"
    wait_for(lambda: value(scrape(), "redislock_hold_seconds_count", **hold) == 3, "3 held", 30)
    found = scrape()
    assert value(found, "redislock_acquisitions_total", **hold) == 3
    assert value(found, "redislock_wait_seconds_count", **hold) == 3
    assert 0.3 <= value(found, "redislock_hold_seconds_sum", **hold) < 30
    assert value(found, "redislock_leases_held") == 0

    watcher = lockapp.watch_lease.delay("mc", 60)
    wait_started(lockapp, "mc")
    wait_for(lambda: value(scrape(), "redislock_leases_held") == 1, "one lease held", 30)
    lockapp.hold.delay("mc")  # skipped: its lock is held
    skip = {"action": "skip", **hold}
    wait_for(lambda: value(scrape(), "redislock_conflicts_total", **skip) == 1, "a skip", 30)
    found = scrape()
    assert value(found, "redislock_acquisitions_total", **hold) == 3

    assert admin.force_release(lockapp.r, "hold:mc", task_id=watcher.id).holders
    assert watcher.get(timeout=30) == "lost"
    watch = {"task": "lockapp.watch_lease"}
    wait_for(lambda: value(scrape(), "redislock_lost_total", **watch) == 1, "the loss", 30)
    found = scrape()
    assert value(found, "redislock_acquisitions_total", **watch) == 1
    assert value(found, "redislock_leases_held") == 0
    # Nothing else moved: no duplicate, no backend error, the lost lease was never released.
    assert not any(name.startswith("redislock_duplicates") for name, _ in found)
    assert not any(name.startswith("redislock_backend_errors") for name, _ in found)
    assert value(found, "redislock_hold_seconds_count", **watch) == 0


@pytest.fixture
def local_metrics() -> Iterator[tuple[prometheus.Metrics, CollectorRegistry]]:
    registry = CollectorRegistry()
    metrics = prometheus.install(registry)
    assert prometheus.install(registry) is metrics  # once per registry
    yield metrics, registry
    metrics.disconnect()


def test_duplicates_at_publish(
    lockapp: ModuleType, local_metrics: tuple[prometheus.Metrics, CollectorRegistry]
) -> None:
    _, registry = local_metrics
    # No worker: the first copy stays queued, so the next two are duplicates.
    lockapp.unique_finished.delay("dup")
    lockapp.unique_finished.delay("dup")
    lockapp.unique_strict.delay("dup")
    with pytest.raises(DuplicateTask):
        lockapp.unique_strict.delay("dup")
    found = samples(generate_latest(registry))
    assert (
        value(
            found, "redislock_duplicates_total", task="lockapp.unique_finished", action="existing"
        )
        == 1
    )
    assert (
        value(found, "redislock_duplicates_total", task="lockapp.unique_strict", action="raise")
        == 1
    )
    assert not any(name.startswith("redislock_conflicts") for name, _ in found)


def test_backend_errors(
    lockapp: ModuleType, local_metrics: tuple[prometheus.Metrics, CollectorRegistry]
) -> None:
    _, registry = local_metrics
    set_setting(lockapp.app, "redislock_url", f"redis://127.0.0.1:{free_port()}/0")
    try:
        result = lockapp.hold.apply(args=("be",))
    finally:
        set_setting(lockapp.app, "redislock_url", lockapp.URL)
    assert isinstance(result.result, LockBackendError)
    found = samples(generate_latest(registry))
    assert value(found, "redislock_backend_errors_total", task="lockapp.hold") == 1
    assert value(found, "redislock_acquisitions_total", task="lockapp.hold") == 0


@pytest.mark.slow
def test_counters_after_real_jobs_in_an_rq_worker(
    rq_conn: redis.Redis, rq_workers: Callable[..., RQWorker], tmp_path: Path
) -> None:
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    # The worker's main process installs the metrics (tests/rqmetrics.py); each job runs in a
    # horse forked from it, which writes its samples into the directory.
    rq_workers(
        name="m1",
        worker_class="rqmetrics.MetricsWorker",
        env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
    )

    def scrape() -> Samples:
        return samples(prometheus.exposition(str(metrics_dir)))

    q = Queue("default", connection=rq_conn)
    ran = [q.enqueue(rqjobs.exclusive, f"m{i}", seconds) for i, seconds in enumerate((0, 0, 0.3))]
    assert wait_ended(ran) == ["finished"] * 3
    exclusive = {"task": "rqjobs.exclusive"}
    wait_for(lambda: value(scrape(), "redislock_hold_seconds_count", **exclusive) == 3, "3", 30)
    found = scrape()
    assert value(found, "redislock_acquisitions_total", **exclusive) == 3
    assert value(found, "redislock_wait_seconds_count", **exclusive) == 3
    assert 0.3 <= value(found, "redislock_hold_seconds_sum", **exclusive) < 30
    assert value(found, "redislock_leases_held") == 0

    with Lock(rq_conn, "s:busy", ttl=30).acquire(info={"task_id": "the-test"}):
        skipped = q.enqueue(rqjobs.exclusive_skip, "busy")
        assert wait_ended([skipped]) == ["finished"]
    skip = {"task": "rqjobs.exclusive_skip", "action": "skip"}
    wait_for(lambda: value(scrape(), "redislock_conflicts_total", **skip) == 1, "a skip", 30)

    holder = q.enqueue(rqjobs.hold, "mh")
    wait_for(lambda: started(rq_conn, "hold"), "the holder runs", 30)
    wait_for(lambda: value(scrape(), "redislock_leases_held") == 1, "one lease held", 30)
    assert admin.force_release(rq_conn, "h:mh", task_id=holder.id).holders
    hold = {"task": "rqjobs.hold"}
    wait_for(lambda: value(scrape(), "redislock_lost_total", **hold) == 1, "the loss", 30)
    assert value(scrape(), "redislock_leases_held") == 0
    rq_conn.set("stop:mh", 1)
    assert wait_ended([holder]) == ["finished"]
    found = scrape()
    assert value(found, "redislock_acquisitions_total", **hold) == 1
    # Lost, so not counted as held when the job ended (RQ reports it released then).
    assert value(found, "redislock_hold_seconds_count", **hold) == 0
    assert value(found, "redislock_leases_held") == 0
    assert value(found, "redislock_acquisitions_total", **exclusive) == 3
    assert not any(name.startswith("redislock_duplicates") for name, _ in found)
    assert not any(name.startswith("redislock_backend_errors") for name, _ in found)


def test_rq_duplicates_at_enqueue(
    rq_conn: redis.Redis, local_metrics: tuple[prometheus.Metrics, CollectorRegistry]
) -> None:
    metrics, registry = local_metrics
    assert metrics.frameworks == ("celery", "rq")
    # No worker: the first copies stay queued, so the next ones are duplicates.
    q = UniqueQueue("default", connection=rq_conn)
    first = q.enqueue(rqjobs.report, "dup")
    assert q.enqueue(rqjobs.report, "dup").id == first.id
    q.enqueue(rqjobs.refresh, "dup")
    with pytest.raises(DuplicateTask):
        q.enqueue(rqjobs.refresh, "dup")
    found = samples(generate_latest(registry))
    report = {"task": "rqjobs.report", "action": "existing"}
    assert value(found, "redislock_duplicates_total", **report) == 1
    refresh = {"task": "rqjobs.refresh", "action": "raise"}
    assert value(found, "redislock_duplicates_total", **refresh) == 1
    assert not any(name.startswith("redislock_conflicts") for name, _ in found)


def _run_without(blocked: tuple[str, ...], code: str) -> None:
    """Runs ``code`` in a fresh interpreter where importing ``blocked`` fails, as it does when
    a package is not installed (a None entry in sys.modules)."""
    script = "import sys\n"
    script += "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)
    script += textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


_IMPORTED_NOTHING = """
    from prometheus_client import CollectorRegistry
    from celery_redislock.contrib import prometheus
    from celery_redislock.errors import LockConfigError

    loaded = [m for m in sys.modules if sys.modules[m] is not None]
    assert not [m for m in loaded if m.split(".")[0] in ("celery", "kombu", "billiard", "rq")]
    assert not [m for m in loaded if m.startswith("celery_redislock.integrations")]
"""


@pytest.mark.parametrize(
    ("blocked", "hooked"),
    [(("celery",), ("rq",)), (("rq",), ("celery",)), (("celery", "rq"), ())],
)
def test_the_module_imports_no_framework_and_hooks_those_installed(
    blocked: tuple[str, ...], hooked: tuple[str, ...]
) -> None:
    if hooked:
        check = f"""
            metrics = prometheus.install(CollectorRegistry())
            assert metrics.frameworks == {hooked!r}, metrics.frameworks
            from celery_redislock.integrations.{hooked[0]} import signals
            assert signals.lock_acquired.receivers and signals.lock_lost.receivers
            metrics.disconnect()
            assert not signals.lock_acquired.receivers and not signals.lock_lost.receivers
            try:
                prometheus.install(CollectorRegistry(), frameworks={blocked!r})
            except LockConfigError as exc:
                assert {blocked[0]!r} in str(exc) and "cannot be imported" in str(exc), exc
            else:
                raise AssertionError("installed for a framework that is not there")
        """
    else:
        check = """
            try:
                prometheus.install(CollectorRegistry())
            except LockConfigError as exc:
                assert "neither Celery nor RQ" in str(exc), exc
            else:
                raise AssertionError("installed with no signal to feed the metrics")
        """
    _run_without(blocked, textwrap.dedent(_IMPORTED_NOTHING) + textwrap.dedent(check))


def test_the_line_length_comes_from_the_sweep(
    client: redis.Redis, local_metrics: tuple[prometheus.Metrics, CollectorRegistry]
) -> None:
    _, registry = local_metrics
    published: list[Handed] = []
    lock = Lock(client, "metrics-line", ttl=30, handover=published.append)
    holder = lock.acquire()
    for n in range(3):
        assert isinstance(park(lock, f"t{n}", owner=f"t{n}"), Parked)
    sweep_lines(client, "redislock", published.append)
    found = samples(generate_latest(registry))
    assert value(found, "redislock_line_parked", namespace="redislock") == 3
    holder.release()  # hands the lock to the first: two wait
    sweep_lines(client, "redislock", published.append)
    found = samples(generate_latest(registry))
    assert value(found, "redislock_line_parked", namespace="redislock") == 2
    assert [h.payload for h in published] == ["t0"]
