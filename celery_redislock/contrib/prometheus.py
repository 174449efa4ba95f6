"""Prometheus metrics for locked tasks, fed by the package's signals (the ``prometheus`` extra:
``pip install "celery-redislock[prometheus]"``).

Call :func:`install` where the worker imports the app (before the pool forks), and expose the
metrics with :func:`start_http_server` (or :func:`exposition` from an endpoint of your own)::

    # proj/celery.py
    from celery_redislock.contrib import prometheus

    metrics = prometheus.install()

    @worker_ready.connect
    def serve_metrics(**_):
        prometheus.start_http_server(9808)

Prefork workers: set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory for the worker (before
it starts; prometheus_client's multiprocess mode). Every pool child then writes its samples
there, and the server above (in the worker's main process) adds them up.

Metrics (labels: ``task``, the task's name; lock names are not labels: one per argument would
make a series per customer):

- ``redislock_acquisitions_total{task}``: leases taken;
- ``redislock_conflicts_total{task, action}``: runs that found their lock held (skip, retry,
  wait, raise, drop, await);
- ``redislock_duplicates_total{task, action}``: unique tasks' duplicates (existing, replace,
  raise at publish; superseded as a replaced copy starts);
- ``redislock_lost_total{task}``: leases lost while their task ran;
- ``redislock_backend_errors_total{task}``: leases not taken because Redis failed;
- ``redislock_wait_seconds{task}`` (histogram): how long taking a lease took, waiting included;
- ``redislock_hold_seconds{task}`` (histogram): how long a lease was held;
- ``redislock_leases_held`` (gauge): leases held by this process's tasks now (summed over
  live processes in multiprocess mode).
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from celery.signals import worker_process_shutdown
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client import start_http_server as _start_http_server

from ..integrations.celery import ending
from ..integrations.celery.signals import (
    lock_acquired,
    lock_backend_error,
    lock_conflict,
    lock_lost,
    lock_released,
)

__all__ = ["Metrics", "exposition", "install", "scrape_registry", "start_http_server"]

_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# The lock_conflict actions that are a unique task's duplicate, not a run finding a lock held.
_DUPLICATE_ACTIONS = frozenset({"existing", "replace", "superseded"})
# Seconds: a lease is taken in milliseconds unless it waits; a task holds it up to hours.
_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600)


def _task(sender: Any) -> str:
    name = getattr(sender, "name", sender)
    return name if isinstance(name, str) else "?"


@dataclass(eq=False)
class Metrics:
    """The metrics and the receivers that feed them; :meth:`disconnect` stops them."""

    acquisitions: Counter
    conflicts: Counter
    duplicates: Counter
    lost: Counter
    backend_errors: Counter
    wait_seconds: Histogram
    hold_seconds: Histogram
    leases_held: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> Metrics:
        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(f"redislock_{name}", doc, ("task", *labels), registry=registry)

        return cls(
            acquisitions=counter("acquisitions", "Leases taken."),
            conflicts=counter("conflicts", "Runs that found their lock held.", "action"),
            duplicates=counter("duplicates", "Unique tasks' duplicates.", "action"),
            lost=counter("lost", "Leases lost while their task ran."),
            backend_errors=counter("backend_errors", "Leases not taken: Redis failed."),
            wait_seconds=Histogram(
                "redislock_wait_seconds",
                "Seconds taking a lease took, waiting in line included.",
                ("task",),
                buckets=_WAIT_BUCKETS,
                registry=registry,
            ),
            hold_seconds=Histogram(
                "redislock_hold_seconds",
                "Seconds a lease was held.",
                ("task",),
                buckets=_HOLD_BUCKETS,
                registry=registry,
            ),
            leases_held=Gauge(
                "redislock_leases_held",
                "Leases held by this process's tasks now.",
                registry=registry,
                multiprocess_mode="livesum",
            ),
        )

    def _held_now(self) -> None:
        # A lost lease stays on the list until its task ends, but is not held.
        leases = list(ending.HELD.leases.values())
        self.leases_held.set(sum(1 for lease in leases if not lease.lost))

    def on_acquired(self, sender: Any = None, waited: float = 0.0, **_: Any) -> None:
        task = _task(sender)
        self.acquisitions.labels(task).inc()
        self.wait_seconds.labels(task).observe(waited)
        self._held_now()

    def on_released(self, sender: Any = None, held: float = 0.0, **_: Any) -> None:
        self.hold_seconds.labels(_task(sender)).observe(held)
        self._held_now()

    def on_conflict(self, sender: Any = None, action: str = "", **kw: Any) -> None:
        duplicate = action in _DUPLICATE_ACTIONS or kw.get("stage") == "publish"
        (self.duplicates if duplicate else self.conflicts).labels(_task(sender), action).inc()

    def on_lost(self, sender: Any = None, **_: Any) -> None:
        self.lost.labels(_task(sender)).inc()
        self._held_now()

    def on_backend_error(self, sender: Any = None, **_: Any) -> None:
        self.backend_errors.labels(_task(sender)).inc()

    def _pairs(self) -> tuple[tuple[Any, Any], ...]:
        return (
            (lock_acquired, self.on_acquired),
            (lock_released, self.on_released),
            (lock_conflict, self.on_conflict),
            (lock_lost, self.on_lost),
            (lock_backend_error, self.on_backend_error),
        )

    def connect(self) -> None:
        for signal, receiver in self._pairs():
            signal.connect(receiver, weak=False)
        worker_process_shutdown.connect(_process_ends, weak=False)

    def disconnect(self) -> None:
        """Stops feeding the metrics (the metrics stay registered)."""
        for signal, receiver in self._pairs():
            signal.disconnect(receiver)


def _process_ends(**_: Any) -> None:
    # Multiprocess mode: a pool child that ends no longer counts in the leases-held gauge.
    path = os.environ.get(_MULTIPROC_ENV)
    if path:
        multiprocess.mark_process_dead(os.getpid(), path)  # type: ignore[no-untyped-call]


# By registry (weakly): a registry that is gone must not hand its metrics to a new one that
# happens to get the same id().
_installed: weakref.WeakKeyDictionary[CollectorRegistry, Metrics] = weakref.WeakKeyDictionary()
_installing = threading.Lock()


def install(registry: CollectorRegistry | None = None) -> Metrics:
    """Creates the metrics in ``registry`` (default: prometheus_client's) and connects the
    receivers that feed them; once per registry (a second call returns the same).

    >>> metrics = install()   # doctest: +SKIP
    """
    registry = REGISTRY if registry is None else registry
    with _installing:
        metrics = _installed.get(registry)
        if metrics is None:
            metrics = _installed[registry] = Metrics.create(registry)
            metrics.connect()
        return metrics


def scrape_registry(path: str | None = None) -> CollectorRegistry:
    """The registry to expose: in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, or ``path``)
    a fresh one collecting every process's samples, else prometheus_client's own."""
    path = path or os.environ.get(_MULTIPROC_ENV)
    if not path:
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    return registry


def exposition(path: str | None = None) -> bytes:
    """The metrics in Prometheus's text format (see :func:`scrape_registry`), for an endpoint
    of your own."""
    return generate_latest(scrape_registry(path))


def start_http_server(port: int, addr: str = "0.0.0.0") -> Any:
    """Serves the metrics on ``http://addr:port/metrics`` from a thread (see
    :func:`scrape_registry`); returns prometheus_client's server and thread."""
    return _start_http_server(port, addr=addr, registry=scrape_registry())
