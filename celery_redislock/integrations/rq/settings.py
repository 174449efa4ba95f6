"""The RQ side's settings: the core :class:`~celery_redislock.core.settings.Settings`, from the
environment (``REDISLOCK_*``: RQ has no app object, and a horse sees its worker's environment)
or given to a job's decorator, and the Redis client they give."""

from __future__ import annotations

import os

from ...core.client_cache import CLIENTS
from ...core.lease import RedisClient
from ...core.replicas import require_replicas
from ...core.settings import FIELDS, KWARGS, BackendPolicy, Settings
from ...errors import LockConfigError

__all__ = ["BackendPolicy", "Settings", "client_for", "default_settings"]


_NAMES = tuple(f.env for f in FIELDS.values() if f.env is not None)


class _FromEnv:
    """The settings last read from the environment, with the values they were read from."""

    seen: tuple[tuple[str | None, ...], Settings] | None = None


def default_settings() -> Settings:
    """This process's settings from the environment (read again whenever a ``REDISLOCK_*``
    variable changed, which costs a few dictionary look-ups per job)."""
    values = tuple(os.environ.get(name) for name in _NAMES)
    seen = _FromEnv.seen
    if seen is None or seen[0] != values:
        seen = _FromEnv.seen = (values, Settings.from_env())
    return seen[1]


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
