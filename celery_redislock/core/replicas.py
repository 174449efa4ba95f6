"""Replica acknowledgement: after a script that takes or renews a lease, wait until that many
replicas have the write, so that a failover cannot lose it (Redis replicates asynchronously).
``WAIT`` (``WAITAOF`` on Redis 7.2+ with the AOF on) counts the writes of its own connection,
so it follows the script on that connection, in one non-transactional pipeline. Fewer
acknowledgements fail closed: an acquire drops its lease and raises
:class:`~celery_redislock.errors.LockBackendError`; a renewal is not counted.

>>> client = require_replicas(redis.Redis(), 1, timeout=0.5)   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import AskError, MovedError, NoScriptError, ResponseError

from ..errors import LockBackendError, LockConfigError
from .durations import OTHER, seconds
from .scripts import script

__all__ = [
    "DEFAULT_REPLICA_TIMEOUT",
    "ReplicaPolicy",
    "policy_of",
    "require_replicas",
    "waitaof_available",
]

DEFAULT_REPLICA_TIMEOUT = 0.5
"""Seconds an acquire or renewal waits for its replicas' acknowledgement by default."""

# Redirections followed within one call (a failover moves a slot once; a resharding may ASK).
_REDIRECTS = 3


@dataclass(frozen=True, slots=True)
class ReplicaPolicy:
    """How many replicas must acknowledge a lease's write, and how long to wait for them."""

    count: int
    timeout: float

    @property
    def timeout_ms(self) -> int:
        return max(1, round(self.timeout * 1000))

    def check(self, acks: int, name: str | None, what: str) -> None:
        """Raises :class:`LockBackendError` unless ``acks`` reach the count."""
        if acks < self.count:
            raise LockBackendError(
                f"lock {name!r}: the {what} was acknowledged by {acks} of the {self.count} "
                f"replica(s) required within {self.timeout}s (min_replicas); a failover now "
                "could lose it",
                name=name,
            )


_policies: weakref.WeakKeyDictionary[object, ReplicaPolicy] = weakref.WeakKeyDictionary()


def check_policy(count: object, timeout: object, *, name: str | None = None) -> ReplicaPolicy:
    """``count`` and ``timeout`` checked (:class:`LockConfigError` naming what is wrong)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise LockConfigError(f"min_replicas must be an integer >= 0, got {count!r}", name=name)
    wait = seconds(
        DEFAULT_REPLICA_TIMEOUT if timeout is None else timeout,
        OTHER,
        "replica_timeout",
        name=name,
    )
    return ReplicaPolicy(count, wait)


def require_replicas(
    client: redis.Redis | RedisCluster, count: int, *, timeout: float | None = None
) -> redis.Redis | RedisCluster:
    """Makes every lock on ``client`` wait, after each acquire and renewal, until ``count``
    replicas acknowledged it (at most ``timeout`` seconds, default 0.5); returns ``client``.
    ``count=0`` removes the requirement. A lock's own ``min_replicas=`` takes precedence.

    >>> client = require_replicas(Sentinel(...).master_for("locks"), 1)   # doctest: +SKIP
    """
    policy = check_policy(count, timeout)
    if policy.count == 0:
        _policies.pop(client, None)
    else:
        _policies[client] = policy
    return client


def policy_of(client: object) -> ReplicaPolicy | None:
    """The policy :func:`require_replicas` attached to ``client``, if any."""
    return _policies.get(client)


# Per node client: whether WAITAOF is the command to send (Redis >= 7.2 with the AOF on).
_waitaof: weakref.WeakKeyDictionary[redis.Redis, bool] = weakref.WeakKeyDictionary()
_detect = threading.Lock()


def waitaof_available(info: Mapping[str, Any]) -> bool:
    """Whether a master whose ``INFO`` reads ``info`` takes ``WAITAOF`` for acknowledgement:
    Redis 7.2 or later, with the append-only file on.

    >>> from celery_redislock.core.replicas import waitaof_available
    >>> waitaof_available({"redis_version": "7.2.4", "aof_enabled": 1})
    True
    >>> waitaof_available({"redis_version": "7.0.15", "aof_enabled": 1})
    False
    """
    try:
        version = tuple(int(part) for part in str(info.get("redis_version", "0")).split(".")[:2])
    except ValueError:  # a fork's own version text: WAIT, which every version has
        return False
    # WAITAOF counts only replicas that fsynced to their AOF: a deployment without the AOF
    # would never be acknowledged, so it is used only when the master has the AOF on.
    return version >= (7, 2) and int(info.get("aof_enabled", 0)) == 1


def _uses_waitaof(client: redis.Redis) -> bool:
    with _detect:
        known = _waitaof.get(client)
    if known is not None:
        return known
    try:
        info = client.info()
    except redis.ResponseError:  # INFO not allowed (ACL): WAIT, which every version has
        info = {}
    found = waitaof_available(info)
    with _detect:
        _waitaof[client] = found
    return found


def _execute(
    client: redis.Redis,
    name: str,
    calls: Sequence[tuple[Sequence[str | bytes], Sequence[str]]],
    policy: ReplicaPolicy | None,
    *,
    asking: bool,
) -> tuple[list[Any], int | None]:
    """One pipeline: each script call (after ASKING when ``asking``), then WAIT (or WAITAOF)
    with ``policy``. Returns each call's reply or error, and the acknowledgements (None without
    ``policy``). Scripts the server lacks are loaded and the batch sent again (safe: every
    script gives the same answer when run twice)."""
    registered = script(name)
    aof = policy is not None and _uses_waitaof(client)
    for attempt in (1, 2):
        pipe = client.pipeline(transaction=False)
        for keys, args in calls:
            if asking:
                pipe.execute_command("ASKING")  # type: ignore[no-untyped-call]
            pipe.evalsha(registered.sha, len(keys), *keys, *args)
        if policy is not None and aof:
            pipe.execute_command("WAITAOF", 0, policy.count, policy.timeout_ms)  # type: ignore[no-untyped-call]
        elif policy is not None:
            pipe.execute_command("WAIT", policy.count, policy.timeout_ms)  # type: ignore[no-untyped-call]
        replies = pipe.execute(raise_on_error=False)
        if any(isinstance(r, NoScriptError) for r in replies) and attempt == 1:
            client.script_load(registered.script)
            continue
        acks = None
        if policy is not None:
            last = replies.pop()
            if isinstance(last, ResponseError) and "replica" in str(last):
                # A master demoted to a replica (a failover): redis-py's Sentinel pool notices
                # only a write refused, so a batch that wrote nothing kept its connection. Drop
                # the pool's connections (they find the new master as they reconnect) and send
                # the batch again: it wrote nothing here.
                client.connection_pool.disconnect()
                if attempt == 1:
                    continue
                raise redis.ConnectionError(f"the lock Redis is a replica now: {last}")
            if isinstance(last, Exception):
                raise last
            acks = int(last[1]) if aof else int(last)
        return (replies[1::2] if asking else replies), acks
    raise AssertionError("unreachable")


def pipelined(
    client: redis.Redis,
    name: str,
    calls: Sequence[tuple[Sequence[str | bytes], Sequence[str]]],
    policy: ReplicaPolicy | None,
    *,
    cluster: RedisCluster | None = None,
) -> tuple[list[Any], int | None]:
    """Runs script ``name`` once per call on ``client`` (one connection, one round trip), then
    with ``policy`` WAIT on that connection; returns the replies and the replicas that
    acknowledged (the fewest, if an ASK sent calls to a second node). On Redis Cluster
    (``cluster``), a call answered ASK (its slot is migrating) goes to the node named, after
    ASKING; a MOVED answer is raised for the caller to refresh the slots and try again."""
    replies, acks = _execute(client, name, calls, policy, asking=False)
    asked: dict[tuple[str, int], list[int]] = {}
    for i, reply in enumerate(replies):
        if (
            cluster is not None
            and isinstance(reply, AskError)
            and not isinstance(reply, MovedError)
        ):
            asked.setdefault((reply.host, reply.port), []).append(i)
        elif isinstance(reply, Exception):
            raise reply
    for (host, port), indexes in asked.items():
        assert cluster is not None
        node = cluster.nodes_manager.get_node(host=host, port=port)
        if node is None:
            raise redis.RedisError(f"ASK to an unknown node {host}:{port}")
        more, more_acks = _execute(
            cluster.get_redis_connection(node),
            name,
            [calls[i] for i in indexes],
            policy,
            asking=True,
        )
        for i, reply in zip(indexes, more, strict=True):
            if isinstance(reply, Exception):
                raise reply
            replies[i] = reply
        if more_acks is not None and acks is not None:
            acks = min(acks, more_acks)
    return replies, acks


def acknowledged(
    client: redis.Redis | RedisCluster,
    name: str,
    keys: Sequence[str | bytes],
    args: Sequence[str],
    policy: ReplicaPolicy,
    *,
    slot_key: str,
) -> tuple[Any, int]:
    """Runs script ``name`` and then WAIT on the same connection: on Redis Cluster, on the node
    that holds ``slot_key`` (not the client's default node), following MOVED and ASK."""
    if not isinstance(client, RedisCluster):
        replies, acks = pipelined(client, name, [(keys, args)], policy)
        return replies[0], acks or 0
    for attempt in range(_REDIRECTS):
        node = client.get_node_from_key(slot_key)  # type: ignore[no-untyped-call]
        try:
            replies, acks = pipelined(
                client.get_redis_connection(node), name, [(keys, args)], policy, cluster=client
            )
            return replies[0], acks or 0
        except MovedError as exc:  # a failover or resharding moved the slot: follow it
            if attempt == _REDIRECTS - 1:
                raise
            client.nodes_manager.move_slot(exc)
        except (redis.ConnectionError, redis.TimeoutError):
            refresh(client)
            raise
    raise AssertionError("unreachable")


def refresh(client: RedisCluster) -> None:
    """Asks the cluster again which node serves which slot (after a node was unreachable), so
    that the next try goes to the node that took over. Best effort."""
    with contextlib.suppress(redis.RedisError, OSError):
        client.nodes_manager.initialize()
