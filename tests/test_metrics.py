"""The Prometheus metrics (celery_redislock.contrib.prometheus): scraped after real tasks ran in
a prefork worker (prometheus_client's multiprocess mode), the counters moved by the right
amounts; the publish side's duplicates and a failing Redis in this process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from conftest import wait_for
from helpers import free_port, wait_started
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from workers import Worker

from celery_redislock import DuplicateTask, LockBackendError
from celery_redislock.contrib import prometheus
from celery_redislock.core import admin
from celery_redislock.integrations.celery.settings import set_setting

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
