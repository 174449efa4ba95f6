"""The RQ side's settings: one frozen object, built from keyword arguments or from the
environment (``REDISLOCK_*``), and the Redis client it gives.

RQ has no app object to hang settings on, and a work horse (or a ``SpawnWorker`` child) sees
the worker's environment, so the environment is where a whole fleet is configured; a job's
decorator may pass its own :class:`Settings`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

import redis

from ...core._validate import one_of
from ...core.claims import DEFAULT_PUBLISH_WINDOW
from ...core.clients import parse_sentinels, sentinel_client
from ...core.durations import ALLOWANCE, OTHER, TTL, Duration, seconds
from ...core.keys import DEFAULT_NAMESPACE, check_namespace
from ...core.lease import RedisClient
from ...core.line import DEFAULT_HANDOVER_WINDOW
from ...core.lock import DEFAULT_FENCE_KEEP
from ...core.options import CONFLICT_ACTIONS, ConflictAction
from ...core.redlock_masters import parse_master_urls
from ...core.replicas import check_policy, require_replicas
from ...core.unique_options import ON_DUPLICATE, OnDuplicate
from ...errors import LockConfigError

__all__ = ["BackendPolicy", "Settings", "client_for", "default_settings"]

BackendPolicy = Literal["fail", "retry", "run"]
BACKEND_POLICIES: tuple[BackendPolicy, ...] = ("fail", "retry", "run")
SOCKET_TIMEOUT = 5.0
_PREFIX = "REDISLOCK_"
# Below 50 ms the sweeps cost more than the lapses they catch; past a minute a dead holder's
# line waits too long.
SWEEP_INTERVAL = Duration(0.05, 60.0)


@dataclass(frozen=True, slots=True)
class Settings:
    """What every locked RQ job of a process shares; see the settings table in docs/rq.md.

    >>> from celery_redislock.integrations.rq import Settings
    >>> Settings(ttl=30, on_conflict="retry").ttl
    30.0
    """

    url: str | None = None
    """The lock Redis; ``None``: the job's own RQ connection (at enqueue: the queue's)."""
    namespace: str = DEFAULT_NAMESPACE
    ttl: float = 15.0
    on_conflict: ConflictAction = "skip"
    on_duplicate: OnDuplicate = "existing"
    on_backend_error: BackendPolicy = "fail"
    queue_allowance: float = 600.0
    """Seconds a unique job's queued claim lasts beyond its scheduled time."""
    unique_publish_window: float = DEFAULT_PUBLISH_WINDOW
    """Seconds a unique job's claim lasts until its enqueue went through (then: its lifetime)."""
    completion_ttl: float = 3600.0
    """Seconds a finished run is remembered, so a copy of it requeued meanwhile is dropped."""
    fence_keep: float = DEFAULT_FENCE_KEEP
    line_handover_window: float = DEFAULT_HANDOVER_WINDOW
    """Seconds a parked job put back on its queue (``on_conflict="queue"``) has to start and
    claim the lock handed to it; past it the lock goes to the next in line."""
    line_sweep_interval: float = 1.0
    """Seconds between two sweeps of the task lines by a ``LockWorker``'s main process."""
    max_conflict_retries: int = 100
    """Conflict retries (``on_conflict="retry"``) when the lock gives no ``max_retries``."""
    sentinels: str | None = None
    """``"host:port,host:port"``: the lock Redis is the master these Sentinels name
    (``sentinel_master``), found again after a failover; instead of ``url``."""
    sentinel_master: str | None = None
    redlock_urls: tuple[str, ...] | None = None
    """RedLock masters (``"redis://a:6379,redis://b:6379,redis://c:6379"`` or a list): job locks
    are held on a majority of them (unique claims stay on the lock Redis)."""
    min_replicas: int = 0
    """Replicas that must acknowledge each acquire and renewal (see docs/topologies.md)."""
    replica_timeout: float | None = None
    disabled: bool = False
    """The kill switch (``REDISLOCK_DISABLED=1``): no job takes a lease or a unique claim; jobs
    run unlocked. For users' unit tests and emergencies; logged at ERROR when a worker starts."""

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        if self.url is not None and (not isinstance(self.url, str) or not self.url):
            raise LockConfigError(f"setting url must be a Redis URL string, got {self.url!r}")
        try:
            check_namespace(self.namespace)
        except LockConfigError as exc:
            raise LockConfigError(f"setting namespace: {exc}") from exc
        for name, duration in _DURATIONS.items():
            put(name, seconds(getattr(self, name), duration, f"setting {name}"))
        for name, allowed in _CHOICES.items():
            put(name, one_of(getattr(self, name), allowed, f"setting {name}"))
        if self.sentinels is not None:
            if self.url is not None:
                raise LockConfigError("settings url and sentinels: give one of them, not both")
            parse_sentinels(self.sentinels, "setting sentinels")
            if not isinstance(self.sentinel_master, str) or not self.sentinel_master:
                raise LockConfigError(
                    "setting sentinel_master must name the Sentinel service (master) when "
                    f"sentinels are set, got {self.sentinel_master!r}"
                )
        if self.redlock_urls is not None:
            if self.sentinels is not None:
                raise LockConfigError(
                    "settings redlock_urls and sentinels: give one of them, not both"
                )
            put("redlock_urls", parse_master_urls(self.redlock_urls, "setting redlock_urls"))
        policy = check_policy(self.min_replicas, self.replica_timeout)
        put("replica_timeout", None if self.replica_timeout is None else policy.timeout)
        if not isinstance(self.disabled, bool):
            raise LockConfigError(f"setting disabled must be True or False, got {self.disabled!r}")
        retries = self.max_conflict_retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
            raise LockConfigError(
                f"setting max_conflict_retries must be an integer >= 1, got {retries!r}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from ``REDISLOCK_URL``, ``REDISLOCK_NAMESPACE``, ``REDISLOCK_TTL``, ...
        (each field's name in upper case), defaults for what is not set.

        >>> Settings.from_env({"REDISLOCK_TTL": "30"}).ttl
        30.0
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(_PREFIX + f.name.upper())
            if raw is None:
                continue
            values[f.name] = _parse(f.name, raw)
        try:
            return cls(**values)
        except LockConfigError as exc:
            names = ", ".join(_PREFIX + name.upper() for name in values)
            raise LockConfigError(f"environment ({names}): {exc}") from exc


_DURATIONS: dict[str, Duration] = {
    "ttl": TTL,
    "queue_allowance": ALLOWANCE,
    "unique_publish_window": ALLOWANCE,
    "completion_ttl": ALLOWANCE,
    "fence_keep": OTHER,
    "line_handover_window": ALLOWANCE,
    "line_sweep_interval": SWEEP_INTERVAL,
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "on_conflict": CONFLICT_ACTIONS,
    "on_duplicate": ON_DUPLICATE,
    "on_backend_error": BACKEND_POLICIES,
}


_FLAGS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False, "": False}


def _seconds_text(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise LockConfigError(
            f"environment {_PREFIX}{name.upper()} must be a number of seconds, got {raw!r}"
        ) from None


def _parse(name: str, raw: str) -> object:
    if name in _DURATIONS:
        return _seconds_text(name, raw)
    if name == "disabled":
        flag = _FLAGS.get(raw.strip().lower())
        if flag is None:
            raise LockConfigError(
                f"environment {_PREFIX}DISABLED must be 1/true/yes or 0/false/no, got {raw!r}"
            )
        return flag
    if name == "replica_timeout":
        return _seconds_text(name, raw)
    if name in ("max_conflict_retries", "min_replicas"):
        try:
            return int(raw)
        except ValueError:
            raise LockConfigError(
                f"environment {_PREFIX}{name.upper()} must be an integer, got {raw!r}"
            ) from None
    return raw


_ENV_NAMES = tuple(_PREFIX + f.name.upper() for f in fields(Settings))
_default: tuple[tuple[str | None, ...], Settings] | None = None
_clients: dict[tuple[int, str | None, str | None, str | None], RedisClient] = {}
_lock = threading.Lock()


def default_settings() -> Settings:
    """This process's settings from the environment (read again whenever a ``REDISLOCK_*``
    variable changed, which costs a few dictionary look-ups per job)."""
    global _default
    seen = tuple(os.environ.get(name) for name in _ENV_NAMES)
    cached = _default
    if cached is None or cached[0] != seen:
        cached = _default = (seen, Settings.from_env())
    return cached[1]


def client_for(settings: Settings, connection: RedisClient | None) -> RedisClient:
    """The lock client: ``settings.url``'s or the Sentinels' master (one per process and
    address), else ``connection``; with ``min_replicas``, acknowledged by that many replicas."""
    if settings.url is None and settings.sentinels is None:
        if connection is None:
            raise LockConfigError(
                "no lock Redis: set REDISLOCK_URL (or Settings(url=...)), or run the job "
                "through RQ so its connection can be used"
            )
        client = connection
    else:
        key = (os.getpid(), settings.url, settings.sentinels, settings.sentinel_master)
        found = _clients.get(key)
        if found is None:
            with _lock:
                found = _clients.get(key)
                if found is None:
                    found = _clients[key] = _connect(settings)
        client = found
    if settings.min_replicas:
        require_replicas(client, settings.min_replicas, timeout=settings.replica_timeout)
    return client


def _connect(settings: Settings) -> RedisClient:
    if settings.sentinels is not None:
        return sentinel_client(
            settings.sentinels, settings.sentinel_master, what="setting sentinels"
        )
    assert settings.url is not None
    try:
        return redis.Redis.from_url(
            settings.url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
        )
    except ValueError as exc:
        raise LockConfigError(f"setting url {settings.url!r} is not a Redis URL: {exc}") from exc
