"""Replica acknowledgement with the append-only file on: ``WAITAOF`` on Redis 7.2 and later,
``WAIT`` before (detected once per client from ``INFO``). A master and a replica as local
processes, both with ``appendonly yes``; which command the lock sent is read from the master's
own command statistics. Marked ``topology`` (``make test-topologies``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import redis
from topologies import wait_until

from celery_redislock import Lock, LockBackendError
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.replicas import _uses_waitaof, waitaof_available

pytestmark = pytest.mark.topology


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"redis_version": "7.2.0", "aof_enabled": 1}, True),
        ({"redis_version": "8.0.2", "aof_enabled": 1}, True),
        ({"redis_version": "7.2.4", "aof_enabled": 0}, False),  # no AOF: nobody would ack
        ({"redis_version": "7.0.15", "aof_enabled": 1}, False),
        ({"redis_version": "6.2.9", "aof_enabled": 1}, False),
        ({}, False),  # INFO refused (ACL)
        ({"redis_version": "7.x-fork", "aof_enabled": 1}, False),
    ],
)
def test_waitaof_is_chosen_only_on_7_2_with_the_aof_on(
    info: dict[str, object], expected: bool
) -> None:
    assert waitaof_available(info) is expected


@pytest.fixture
def pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    with ExitStack() as stack:
        master = RedisServer()
        stack.callback(master.close)
        master.start(
            "--appendonly", "yes", "--appendfsync", "always", "--repl-diskless-sync-delay", "0"
        )
        replica = RedisServer()
        stack.callback(replica.close)
        replica.start(
            "--appendonly", "yes", "--appendfsync", "always",
            "--replicaof", "127.0.0.1", str(master.port),
        )  # fmt: skip
        with redis.Redis(port=replica.port) as c:
            wait_until(
                lambda: c.info("replication")["master_link_status"] == "up", "replica synced"
            )
        yield master, replica


def _calls(client: redis.Redis, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_the_acknowledgement_command_follows_the_server(
    pair: tuple[RedisServer, RedisServer],
) -> None:
    """On this server: WAITAOF where it exists (7.2+), else WAIT; a lease acknowledged either
    way, and refused when the replica is gone."""
    master, replica = pair
    client = redis.Redis(port=master.port)
    version = tuple(int(p) for p in client.info("server")["redis_version"].split(".")[:2])
    # A generous wait for the acknowledgement: a busy machine's replica may take seconds.
    lock = Lock(client, "report", ttl=5, min_replicas=1, replica_timeout=10)
    lock.acquire().release()
    uses = "waitaof" if version >= (7, 2) else "wait"
    assert _uses_waitaof(client) is (uses == "waitaof")
    other = "wait" if uses == "waitaof" else "waitaof"
    # (sent twice if the first pipeline found the script not loaded yet)
    assert _calls(client, uses) >= 1 and _calls(client, other) == 0
    assert replica.process is not None
    replica.process.kill()  # crashed (a clean shutdown would wait for its AOF)
    replica.process.wait()
    with redis.Redis(port=master.port) as c:
        wait_until(lambda: c.info("replication")["connected_slaves"] == 0, "replica gone")
    with pytest.raises(LockBackendError, match="acknowledged by 0 of the 1"):
        Lock(client, "report", ttl=5, min_replicas=1, replica_timeout=0.2).acquire()
    assert not lock.locked()
    client.close()


def test_a_client_left_on_a_demoted_master_drops_its_connections_and_says_so(
    pair: tuple[RedisServer, RedisServer],
) -> None:
    """A connection still open to a master demoted to a replica (after a failover, before
    redis-py's Sentinel pool noticed) is dropped, and the batch sent again once; a server that
    is a replica still is a backend error saying so, never a lease."""
    _, replica = pair
    client = redis.Redis(port=replica.port)
    lock = Lock(client, "report", ttl=5, min_replicas=1, replica_timeout=0.2)
    with pytest.raises(LockBackendError, match="the lock Redis is a replica now"):
        lock.acquire()
    assert _calls(client, "wait") == 2  # the batch went twice, then the error
    client.close()
