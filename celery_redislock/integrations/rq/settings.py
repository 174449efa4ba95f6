"""The RQ side's settings: the core :class:`~celery_redislock.core.settings.Settings`, built
from keyword arguments or from the environment (``REDISLOCK_*``), and the Redis client they give.

RQ has no app object to hang settings on, and a work horse (or a ``SpawnWorker`` child) sees
the worker's environment, so the environment is where a whole fleet is configured; a job's
decorator may pass its own :class:`Settings`.
"""

from __future__ import annotations

import os

from ...core.client_cache import CLIENTS
from ...core.lease import RedisClient
from ...core.replicas import require_replicas
from ...core.settings import FIELDS, KWARGS, BackendPolicy, Settings
from ...errors import LockConfigError

__all__ = ["BackendPolicy", "Settings", "client_for", "default_settings"]


class _FromEnvironment:
    """This process's settings from the environment, read again whenever a ``REDISLOCK_*``
    variable changed (which costs a few dictionary look-ups per job)."""

    _NAMES = tuple(f.env for f in FIELDS.values() if f.env is not None)

    def __init__(self) -> None:
        self._seen: tuple[tuple[str | None, ...], Settings] | None = None

    def settings(self) -> Settings:
        seen = tuple(os.environ.get(name) for name in self._NAMES)
        cached = self._seen
        if cached is None or cached[0] != seen:
            cached = self._seen = (seen, Settings.from_env())
        return cached[1]


_ENVIRONMENT = _FromEnvironment()


def default_settings() -> Settings:
    """This process's settings from the environment (read again whenever a ``REDISLOCK_*``
    variable changed)."""
    return _ENVIRONMENT.settings()


def client_for(settings: Settings, connection: RedisClient | None) -> RedisClient:
    """The lock client: ``settings.url``'s or the Sentinels' master (one per process and
    settings), else ``connection``; with ``min_replicas``, acknowledged by that many replicas."""
    client = CLIENTS.get(settings, KWARGS)
    if client is None:
        if connection is None:
            raise LockConfigError(
                "no lock Redis: set REDISLOCK_URL (or Settings(url=...)), or run the job "
                "through RQ so its connection can be used"
            )
        client = connection
        if settings.min_replicas:
            require_replicas(client, settings.min_replicas, timeout=settings.replica_timeout)
    return client
