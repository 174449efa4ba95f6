"""Whether the lock Redis answers, asked once as a worker starts (Celery and RQ alike), in
bounded time, and said in one line naming it (never its password) and what tasks do while it
does not answer. Without it, a worker whose lock Redis could not be reached started as if all
was well and then failed every task."""

from __future__ import annotations

import logging
from typing import Any

from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["CHECK_TIMEOUT_S", "check_at_start", "ping_within", "where"]

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 3.0
"""The most a worker's start waits for its lock Redis's answer (connect, then ``PING``)."""

_TASKS = "tasks with lock=, unique= or rate= options"
_MEANWHILE = {
    "fail": f"{_TASKS} fail with LockBackendError",
    "retry": f"{_TASKS} are retried later, without running",
    "run": f"{_TASKS} run WITHOUT their locks and unique claims",
}


def where(client: Any) -> str:
    """The Redis ``client`` talks to, as a URL without its password (``redis://user:***@host:
    6379/0``), a Sentinel service or a cluster's nodes.

    >>> import redis
    >>> where(redis.Redis.from_url("redis://ops:s3cret@locks.internal:6380/2"))
    'redis://ops:***@locks.internal:6380/2'
    """
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if isinstance(kwargs, dict):
        service = getattr(pool, "service_name", None)
        if isinstance(service, str):
            return f"Sentinel master {service!r}"
        db = kwargs.get("db", 0)
        if kwargs.get("path"):
            return f"unix://{kwargs['path']}?db={db}"
        connection_class = getattr(pool, "connection_class", type(None))
        scheme = "rediss" if "SSL" in connection_class.__name__ else "redis"
        user = kwargs.get("username") or ""
        if kwargs.get("password"):
            user += ":***"
        credentials = f"{user}@" if user else ""
        host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
        return f"{scheme}://{credentials}{host}:{port}/{db}"
    nodes = getattr(client, "startup_nodes", None)
    if isinstance(nodes, dict) and nodes:
        return f"Redis Cluster {', '.join(sorted(nodes)[:3])}"
    return type(client).__name__


def ping_within(client: Any, timeout: float = CHECK_TIMEOUT_S) -> BaseException | None:
    """Connects to ``client``'s Redis and sends ``PING`` on a connection of its own, one try,
    each step bounded by ``timeout`` seconds (the client's own may allow 5 s and several
    retries); returns the error, ``None`` if it answered. A cluster client is asked through its
    own connections (its timeouts bound it)."""
    pool = getattr(client, "connection_pool", None)
    make = getattr(pool, "connection_class", None)
    try:
        if pool is None or make is None:
            client.ping()
            return None
        connection = make(
            **{
                **pool.connection_kwargs,
                "socket_timeout": timeout,
                "socket_connect_timeout": timeout,
                "retry": Retry(NoBackoff(), 0),
            }
        )
        try:
            connection.connect()
            connection.send_command("PING")
            connection.read_response()
        finally:
            connection.disconnect()
    except Exception as exc:  # any failure to answer is what this says, never a crash
        return exc
    return None


def check_at_start(client: Any, *, policy: str, setting: str, also: str = "") -> bool:
    """As a worker starts: pings the lock Redis (at most ``CHECK_TIMEOUT_S``) and logs one line,
    INFO naming it if it answered, else ERROR naming it and what tasks do until it answers,
    under ``policy`` (the value of the backend-error setting named ``setting``); ``also`` is
    appended to that line. The worker starts either way: its broker may be fine and the lock
    Redis may come back. Returns whether it answered."""
    place = where(client)
    error = ping_within(client)
    if error is None:
        log.info("lock Redis %s answers; locks, unique claims and rate limits live there", place)
        return True
    meanwhile = _MEANWHILE.get(policy, f"{_TASKS} follow {setting}")
    log.error(
        "lock Redis %s does not answer as the worker starts (%s: %s); the worker starts anyway, "
        "and until it answers, %s (%s=%r)%s",
        place,
        type(error).__name__,
        error,
        meanwhile,
        setting,
        policy,
        also,
    )
    return False
