"""Redis clients for the lock: a Sentinel-followed master (the client follows it through
failovers), the socket waits that bound every client, and a replica acknowledgement policy
(an example: docs/topologies.md). The clients made from settings, and their one cache, are in
:mod:`.client_cache`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis
from redis.backoff import EqualJitterBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from ..errors import LockConfigError
from .replicas import check_policy, require_replicas

__all__ = [
    "SOCKET_TIMEOUT",
    "parse_sentinels",
    "sentinel_client",
]

SOCKET_TIMEOUT = 5.0
"""Seconds a socket read or connect may take: a hung Redis is an error, never a hang."""
# During a failover every call fails until the new master is known (~2-3 s with the usual
# down-after): a few quick retries, then the error, so a caller's deadline holds.
_RETRIES = 3
_BACKOFF_CAP = 0.25


def parse_sentinels(value: object, what: str = "sentinels") -> list[tuple[str, int]]:
    """Sentinel addresses from ``"h1:26379,h2:26379"``, or a list of ``"host:port"`` strings or
    ``(host, port)`` pairs; :class:`LockConfigError` naming ``what`` otherwise."""
    items: list[object] = []
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",") if part.strip()]
    elif isinstance(value, list | tuple):
        items = list(value)
    found: list[tuple[str, int]] = []
    for item in items:
        pair = item.rpartition(":")[::2] if isinstance(item, str) else item  # "h1": no host
        host, port = pair if isinstance(pair, list | tuple) and len(pair) == 2 else ("", 0)
        try:
            number = int(port) if isinstance(port, int | str) and not isinstance(port, bool) else 0
        except ValueError:
            number = 0
        if not isinstance(host, str) or not host or not 0 < number < 65536:
            raise LockConfigError(
                f"{what} must be 'host:port' addresses (a list, or one string separated by "
                f"commas) or (host, port) pairs; got {value!r}"
            )
        found.append((host, number))
    if not found:
        raise LockConfigError(
            f"{what} must name at least one Sentinel as 'host:port', got {value!r}"
        )
    return found


def sentinel_client(
    sentinels: object,
    service: object,
    *,
    options: Mapping[str, Any] | None = None,
    min_replicas: int = 0,
    replica_timeout: float | None = None,
    what: str = "sentinels",
) -> redis.Redis:
    """A client of the master the Sentinels name for ``service``, found again after a
    failover (redis-py's ``Sentinel.master_for``). ``options`` go to the master's connections
    (``password``, ``db``, ``ssl``, ...; ``sentinel_kwargs`` to the Sentinels'). Socket waits
    are bounded and retries few, so that a call during a failover fails within seconds
    (:class:`~celery_redislock.errors.LockBackendError` for a lock) rather than hangs.
    ``min_replicas``: see :func:`~celery_redislock.core.replicas.require_replicas`.

    Making it does not connect.
    """
    addresses = parse_sentinels(sentinels, what)
    if not isinstance(service, str) or not service:
        raise LockConfigError(
            f"the Sentinel service (master) name must be a non-empty string, got {service!r}"
        )
    policy = check_policy(min_replicas, replica_timeout)
    kwargs: dict[str, Any] = {
        "socket_timeout": SOCKET_TIMEOUT,
        "socket_connect_timeout": SOCKET_TIMEOUT,
        "retry": Retry(EqualJitterBackoff(cap=_BACKOFF_CAP, base=0.02), _RETRIES),
    }
    kwargs.update(options or {})
    sentinel_kwargs = kwargs.pop("sentinel_kwargs", None)
    if sentinel_kwargs is None:
        sentinel_kwargs = {k: kwargs[k] for k in ("socket_timeout", "socket_connect_timeout")}
    try:
        group = Sentinel(addresses, sentinel_kwargs=sentinel_kwargs, **kwargs)  # type: ignore[no-untyped-call]
        client: redis.Redis = group.master_for(service)  # type: ignore[no-untyped-call]
    except TypeError as exc:
        raise LockConfigError(f"Sentinel options {dict(options or {})!r}: {exc}") from exc
    require_replicas(client, policy.count, timeout=policy.timeout)
    return client
