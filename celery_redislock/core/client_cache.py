"""The process's one cache of lock clients, for both integrations: the same settings, the same
client; changed settings, a new one; a forked child, clients of its own."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis
from redis.cluster import RedisCluster

from ..errors import LockConfigError
from .clients import SOCKET_TIMEOUT, sentinel_client
from .replicas import require_replicas
from .settings import Settings

if TYPE_CHECKING:
    from .lease import RedisClient

__all__ = ["CLIENTS", "ClientCache", "make_client"]


def make_client(settings: Settings, what: Callable[[str], str]) -> RedisClient:
    """The client ``settings`` name: ``client_factory``'s, else the Sentinels' master, else
    ``url``'s (socket waits bounded; options in the URL take precedence), with the replica
    policy. Makes no connection (a factory may). A value that makes no client raises
    :class:`LockConfigError` naming it as ``what(field)`` does."""
    client: RedisClient
    if settings.client_factory is not None:
        client = settings.client_factory()
        if not isinstance(client, redis.Redis | RedisCluster):
            raise LockConfigError(
                f"{what('client_factory')} must return a redis.Redis or RedisCluster, got "
                f"{type(client).__name__}"
            )
    elif settings.sentinels is not None:
        client = sentinel_client(
            settings.sentinels,
            settings.sentinel_master,
            options=dict(settings.sentinel_options),
            what=what("sentinels"),
        )
    else:
        url = settings.url
        if url is None:
            raise LockConfigError("no Redis for locks: the settings name none")
        try:
            client = redis.Redis.from_url(
                url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
            )
        except ValueError as exc:
            raise LockConfigError(
                f"{what('url')} {url!r} is not a Redis URL redis-py takes: {exc}"
            ) from exc
    if settings.min_replicas:
        require_replicas(client, settings.min_replicas, timeout=settings.replica_timeout)
    return client


class ClientCache:
    """One client per :meth:`~celery_redislock.core.settings.Settings.client_key`: the same
    settings, the same client; changed settings, a new one. The ``size`` latest are kept. A
    forked child (a Celery pool child, an RQ work horse) makes clients of its own
    (:meth:`forget_inherited`)."""

    def __init__(self, size: int = 16) -> None:
        self._size = size
        # Replaced whole under the lock, never changed in place: read without it.
        self._entries: list[tuple[tuple[object, ...], RedisClient]] = []
        self._lock = threading.Lock()
        self._inherited: list[RedisClient] = []

    def forget_inherited(self) -> None:
        """In a forked child: from now on, new clients. Another thread of the parent (its child
        watch, its line sweeper) may have been inside one of the parent's clients' connection
        pools at the fork; that pool's lock then stays taken here for ever, and redis-py (8)
        takes it as it resets the pool for the child: the child's first call would hang. The
        parent's clients are kept, never used: collected, one would disconnect its pool, which
        takes that lock too."""
        self._inherited += [client for _, client in self._entries]
        self._entries = []
        self._lock = threading.Lock()  # (as the pools' locks: maybe taken at the fork)

    def get(self, settings: Settings, what: Callable[[str], str]) -> RedisClient | None:
        """The client of ``settings`` (:func:`make_client`); ``None`` if they name no Redis
        (no ``url``, ``sentinels`` or ``client_factory``)."""
        if settings.url is None and settings.sentinels is None and settings.client_factory is None:
            return None
        key = settings.client_key()
        for made, client in self._entries:
            if made == key:
                return client
        with self._lock:
            for made, client in self._entries:
                if made == key:
                    return client
            client = make_client(settings, what)
            self._entries = [(key, client), *self._entries[: self._size - 1]]
        return client


CLIENTS = ClientCache()
"""The process's lock clients, for both integrations."""
os.register_at_fork(after_in_child=CLIENTS.forget_inherited)
