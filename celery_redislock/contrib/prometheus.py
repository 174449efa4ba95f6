"""Prometheus metrics for locked tasks and jobs, fed by the package's signals, for Celery and RQ
alike (the ``prometheus`` extra). Importing it imports neither framework. Call :func:`install` in
the worker's main process, before it forks, and serve the metrics from there; set
``PROMETHEUS_MULTIPROC_DIR`` for pool children and work horses. The metrics, their labels and a
setup for each framework: docs/operations.md, "Prometheus metrics"::

    prometheus.install()
    prometheus.start_http_server(9808)   # Celery: in a worker_ready receiver
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

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

from ..core.heartbeat import Heartbeat
from ..core.line import lines_swept
from ..errors import LockConfigError

__all__ = [
    "FRAMEWORKS",
    "Metrics",
    "exposition",
    "install",
    "scrape_registry",
    "start_http_server",
]

FRAMEWORKS = ("celery", "rq")
"""The integrations whose signals :func:`install` can hook."""

# Imported by name when installed, never at import: a Celery user need not have RQ, and an RQ
# user's worker should not load Celery.
_SIGNALS = {
    "celery": "celery_redislock.integrations.celery.signals",
    "rq": "celery_redislock.integrations.rq.signals",
}
# The packages an integration needs: missing, it is not installed (any other error is a bug).
_NEEDS = {"celery": ("celery", "kombu", "billiard"), "rq": ("rq",)}

_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# The lock_conflict actions that are a unique task's duplicate, not a run finding a lock held.
_DUPLICATE_ACTIONS = frozenset({"existing", "replace", "superseded"})
# Where a producer found a duplicate: Celery's publish, RQ's enqueue ("raise" is also a run's).
_DUPLICATE_STAGES = frozenset({"publish", "enqueue"})
# Seconds: a lease is taken in milliseconds unless it waits; a task holds it up to hours.
_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600)


def _task(sender: Any) -> str:
    # Celery sends the task (or its name, from a producer); RQ the job function's name.
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
    line_parked: Gauge
    """Tasks waiting in task lines, fleet-wide, as a worker's sweeper last counted them."""
    frameworks: tuple[str, ...] = ()
    """The integrations whose signals feed the metrics (set by :meth:`connect`)."""
    _disconnects: list[Callable[[], object]] = field(default_factory=list, repr=False)

    @classmethod
    def create(cls, registry: CollectorRegistry) -> Metrics:
        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(f"redislock_{name}", doc, ("task", *labels), registry=registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(
                f"redislock_{name}", doc, ("task",), buckets=buckets, registry=registry
            )

        return cls(
            acquisitions=counter("acquisitions", "Leases taken."),
            conflicts=counter("conflicts", "Runs that found their lock held.", "action"),
            duplicates=counter("duplicates", "Unique tasks' duplicates.", "action"),
            lost=counter("lost", "Leases lost while their task ran."),
            backend_errors=counter("backend_errors", "Leases not taken: Redis failed."),
            wait_seconds=histogram(
                "wait_seconds",
                "Seconds taking a lease took, waiting in line included.",
                _WAIT_BUCKETS,
            ),
            hold_seconds=histogram("hold_seconds", "Seconds a lease was held.", _HOLD_BUCKETS),
            leases_held=Gauge(
                "redislock_leases_held",
                "Leases this process keeps alive now.",
                registry=registry,
                multiprocess_mode="livesum",
            ),
            line_parked=Gauge(
                "redislock_line_parked",
                "Tasks waiting in task lines (on_conflict='queue'), fleet-wide, per namespace, "
                "as a worker's sweeper last counted them.",
                ("namespace",),
                registry=registry,
                multiprocess_mode="livemax",
            ),
        )

    def _held_now(self) -> None:
        # What the process's heartbeat renews: every lease a task or job of either framework
        # holds. A lost lease has left it before lock_lost is sent, a released one before
        # lock_released.
        self.leases_held.set(len(Heartbeat.current().leases()))

    def on_acquired(self, sender: Any = None, waited: float = 0.0, **_: Any) -> None:
        task = _task(sender)
        self.acquisitions.labels(task).inc()
        self.wait_seconds.labels(task).observe(waited)
        self._held_now()

    def on_released(self, sender: Any = None, held: float = 0.0, **kw: Any) -> None:
        # RQ reports a lease lost during its job as released too when the job ends: it was
        # counted as lost (Celery sends no lock_released for it).
        if not getattr(kw.get("lease"), "lost", False):
            self.hold_seconds.labels(_task(sender)).observe(held)
        self._held_now()

    def on_conflict(self, sender: Any = None, action: str = "", **kw: Any) -> None:
        duplicate = action in _DUPLICATE_ACTIONS or kw.get("stage") in _DUPLICATE_STAGES
        (self.duplicates if duplicate else self.conflicts).labels(_task(sender), action).inc()

    def on_lost(self, sender: Any = None, **_: Any) -> None:
        self.lost.labels(_task(sender)).inc()
        self._held_now()

    def on_backend_error(self, sender: Any = None, **_: Any) -> None:
        self.backend_errors.labels(_task(sender)).inc()

    def on_swept(self, sender: Any = None, namespace: str = "", parked: int = 0, **_: Any) -> None:
        self.line_parked.labels(namespace).set(parked)

    def connect(self, frameworks: Iterable[str] | None = None) -> None:
        """Connects the receivers to the signals of ``frameworks`` (default: every integration
        that can be imported); raises :class:`~celery_redislock.LockConfigError` if a named one
        cannot be, or none can."""
        named = frameworks is not None
        wanted = _check_frameworks(FRAMEWORKS if frameworks is None else frameworks)
        # Every module first: a failure connects nothing.
        found = {f: _signals_of(f, required=named) for f in wanted}
        hooked = {f: signals for f, signals in found.items() if signals is not None}
        if not hooked:
            raise LockConfigError(
                "prometheus.install(): neither Celery nor RQ can be imported, so no signal "
                'would feed the metrics: pip install "celery-redislock[celery]" or "[rq]"'
            )
        lines_swept.connect(self.on_swept)  # the core's: whichever framework sweeps
        self._disconnects.append(lambda: lines_swept.disconnect(self.on_swept))
        receivers = {
            "lock_acquired": self.on_acquired,
            "lock_released": self.on_released,
            "lock_conflict": self.on_conflict,
            "lock_lost": self.on_lost,
            "lock_backend_error": self.on_backend_error,
        }
        for framework, signals in hooked.items():
            for name, receiver in receivers.items():
                signal = getattr(signals, name)
                if framework == "celery":
                    signal.connect(receiver, weak=False)  # Celery's Signal keeps weak references
                else:
                    signal.connect(receiver)
                self._disconnects.append(functools.partial(signal.disconnect, receiver))
            if framework == "celery":
                _mark_dead_children()
        self.frameworks = (*self.frameworks, *hooked)

    def disconnect(self) -> None:
        """Stops feeding the metrics (the metrics stay registered)."""
        while self._disconnects:
            self._disconnects.pop()()
        self.frameworks = ()


def _check_frameworks(frameworks: Iterable[str]) -> tuple[str, ...]:
    if isinstance(frameworks, str):
        frameworks = (frameworks,)
    chosen = tuple(dict.fromkeys(frameworks))
    unknown = [f for f in chosen if f not in FRAMEWORKS]
    if unknown or not chosen:
        raise LockConfigError(
            f"frameworks must name some of {', '.join(FRAMEWORKS)}, got {list(chosen)!r}"
        )
    return chosen


def _signals_of(framework: str, *, required: bool) -> Any:
    """The integration's signals module; ``None`` if its framework is not installed (an error
    naming it if ``required``)."""
    try:
        return importlib.import_module(_SIGNALS[framework])
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in _NEEDS[framework]:
            raise
        if required:
            raise LockConfigError(
                f"prometheus.install(frameworks=...) names {framework!r}, which cannot be "
                f"imported: {exc}"
            ) from exc
        return None


_dead_children_hooked = threading.Event()


def _mark_dead_children() -> None:
    # Multiprocess mode: a Celery pool child that ends no longer counts in the leases-held
    # gauge. Celery's signal, looked up only once Celery is known to be there.
    if not _dead_children_hooked.is_set():
        _dead_children_hooked.set()
        signals = importlib.import_module("celery.signals")
        signals.worker_process_shutdown.connect(_process_ends, weak=False)


def _process_ends(**_: Any) -> None:
    path = os.environ.get(_MULTIPROC_ENV)
    if path:
        multiprocess.mark_process_dead(os.getpid(), path)  # type: ignore[no-untyped-call]


# By registry (weakly): a registry that is gone must not hand its metrics to a new one that
# happens to get the same id().
_installed: weakref.WeakKeyDictionary[CollectorRegistry, Metrics] = weakref.WeakKeyDictionary()
_installing = threading.Lock()


def install(
    registry: CollectorRegistry | None = None, *, frameworks: Iterable[str] | None = None
) -> Metrics:
    """Creates the metrics in ``registry`` (default: prometheus_client's) and connects the
    receivers that feed them to the signals of ``frameworks`` (``"celery"``, ``"rq"``; default:
    each one that can be imported); once per registry (a second call returns the same).

    >>> metrics = install()   # doctest: +SKIP
    >>> metrics.frameworks    # doctest: +SKIP
    ('celery', 'rq')
    """
    registry = REGISTRY if registry is None else registry
    with _installing:
        metrics = _installed.get(registry)
        if metrics is None:
            metrics = Metrics.create(registry)
            try:
                metrics.connect(frameworks)
            except BaseException:
                for metric in vars(metrics).values():
                    if isinstance(metric, Counter | Gauge | Histogram):
                        registry.unregister(metric)
                raise
            _installed[registry] = metrics
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
