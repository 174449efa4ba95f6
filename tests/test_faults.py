"""Faults: scripts flushed, Redis restarted, Redis paused past the lease, Redis Cluster slots."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from conftest import wait_for, wait_until_queued
from redis.cluster import RedisCluster

from celery_redislock import (
    Heartbeat,
    Lease,
    Lock,
    LockBackendError,
    LockLost,
    LockNotAcquired,
    renew_leases,
)
from celery_redislock.contrib.redis_server import RedisServer


@pytest.mark.parametrize("fair", [False, True])
def test_script_flush_between_calls(client: redis.Redis, fair: bool) -> None:
    lock = Lock(client, "flushed", ttl=5, fair=fair)
    lease = lock.acquire()
    client.script_flush()
    renew_leases([lease])
    client.script_flush()
    assert lock.holders()[0].token == lease.token
    client.script_flush()
    waiter = threading.Thread(target=lambda: lock.acquire(timeout=5).release())
    waiter.start()
    wait_until_queued(client, lock)
    client.script_flush()
    lease.release()  # also wakes the waiter (fair mode: a second script)
    waiter.join(5)
    assert not waiter.is_alive()
    client.script_flush()
    assert lock.release_where(pid="0") == []


def test_redis_restart_mid_run(own_server: RedisServer) -> None:
    client = redis.Redis.from_url(own_server.url, socket_connect_timeout=0.5)
    lock = Lock(client, "restart", ttl=5)
    lease = lock.acquire()
    own_server.stop()
    with pytest.raises(LockBackendError, match="lock 'restart': Redis failed"):
        lock.acquire(blocking=False)
    with pytest.raises(LockBackendError):
        lease.release()
    own_server.start()
    # The restarted server kept no data (no persistence): the old lease is gone, honestly so.
    with pytest.raises(LockLost):
        lease.renew()
    again = lock.acquire(blocking=False)
    assert again.fence > lease.fence  # server time keeps fences moving forward
    again.release()


def test_heartbeat_reports_loss_while_redis_is_down(own_server: RedisServer) -> None:
    client = redis.Redis.from_url(own_server.url, socket_connect_timeout=0.2)
    lease = Lock(client, "outage", ttl=0.6).acquire()
    lost: list[tuple[Lease, BaseException | None]] = []
    called = threading.Event()
    Heartbeat.current().register(lease, on_lost=lambda x, e: (lost.append((x, e)), called.set()))
    own_server.stop()
    assert called.wait(3), "loss not reported while Redis was down"
    assert isinstance(lost[0][1], LockBackendError)
    with pytest.raises(LockLost):
        lease.check()
    own_server.start()


def test_redis_paused_past_the_lease(own_server: RedisServer) -> None:
    holder_client = redis.Redis.from_url(own_server.url)
    lock = Lock(holder_client, "paused", ttl=0.5)
    lease = lock.acquire()
    lost = threading.Event()
    Heartbeat.current().register(lease, on_lost=lambda _lease, _e: lost.set())
    own_server.pause()
    time.sleep(1.0)  # server time runs on while it is frozen: the lease lapses
    own_server.resume()
    assert lost.wait(3), "a lease that lapsed during the pause was not reported lost"
    with pytest.raises(LockLost):
        lease.check()
    other = Lock(redis.Redis.from_url(own_server.url), "paused", ttl=5).acquire(timeout=2)
    assert other.fence > lease.fence


def test_waiter_survives_a_restart_and_gets_the_lock(own_server: RedisServer) -> None:
    client = redis.Redis.from_url(own_server.url, socket_connect_timeout=0.5)
    lock = Lock(client, "waiting", ttl=30)
    lock.acquire()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            lock.acquire(timeout=5)
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_until_queued(client, lock)
    own_server.restart()
    waiter.join(6)
    # Either the blocked call saw the outage (a clear error) or it acquired after the restart.
    assert not errors or isinstance(errors[0], LockBackendError)


def _port_with_free_bus() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    for port in random.sample(range(20000, 30000), 200):
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair")


@pytest.fixture
def cluster(redis_binary: str) -> Iterator[RedisCluster]:
    """A one-node Redis Cluster serving every slot: scripts must stay within one slot."""
    server = RedisServer(redis_binary, port=_port_with_free_bus())
    server.start("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("CLUSTER", "ADDSLOTS", *range(16384))
    wait_for(lambda: b"cluster_state:ok" in admin.execute_command("CLUSTER", "INFO"), "cluster ok")
    client = RedisCluster.from_url(server.url)
    yield client
    client.close()
    server.close()


def test_cluster(cluster: RedisCluster) -> None:
    for fair in (False, True):
        lock = Lock(cluster, f"orders:{fair}", ttl=5, fair=fair)
        lease = lock.acquire()
        with pytest.raises(LockNotAcquired):
            lock.acquire(blocking=False)
        waiter = threading.Thread(target=lambda lock=lock: lock.acquire(timeout=5).release())
        waiter.start()
        wait_until_queued(cluster, lock)
        lease.release()
        waiter.join(5)
        assert not waiter.is_alive() and not lock.locked()
    leases = [Lock(cluster, f"job:{i}", ttl=5).acquire() for i in range(50)]
    cluster.script_flush()
    report = renew_leases(leases)  # 50 slots: one script per slot, one pipeline, NOSCRIPT-safe
    assert len(report.renewed) == 50 and not report.lost
