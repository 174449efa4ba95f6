"""Faults: scripts flushed, Redis restarted, Redis paused past the lease, Redis Cluster slots."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from helpers import load_factor, wait_for, wait_until_queued
from redis.backoff import ConstantBackoff, NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

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
    """docs/failures.md, Redis unreachable: "the heartbeat retries and reports a lease lost once
    it may have lapsed": not before, and within one renewal interval after."""
    ttl = 0.6
    client = redis.Redis.from_url(own_server.url, socket_connect_timeout=0.2)
    lease = Lock(client, "outage", ttl=ttl).acquire()
    lost: list[tuple[float, Lease, BaseException | None]] = []
    called = threading.Event()

    def on_lost(lease: Lease, error: BaseException | None) -> None:
        lost.append((time.monotonic(), lease, error))
        called.set()

    heartbeat = Heartbeat.current()
    heartbeat.register(lease, on_lost=on_lost)
    try:
        own_server.stop()
        assert called.wait(ttl + 2), "loss not reported while Redis was down"
    finally:
        heartbeat.unregister(lease)
        own_server.start()
    noticed_at, _, error = lost[0]
    late = noticed_at - lease.valid_until
    assert late >= 0, f"reported lost {-late:.3f} s before the lease could have lapsed"
    # One interval (ttl/3), plus 0.25 s for a loaded machine (stretched with its load).
    slack = 0.25 * load_factor()
    assert late <= ttl / 3 + slack, f"reported lost {late:.3f} s after the lease lapsed"
    assert isinstance(error, LockBackendError)
    with pytest.raises(LockLost):
        lease.check()


def test_redis_paused_past_the_lease(own_server: RedisServer) -> None:
    """docs/failures.md: a lease lapses while its holder still runs (Redis hung): the heartbeat
    reports it lost within one interval, while Redis is still frozen."""
    ttl = 0.5
    holder_client = redis.Redis.from_url(own_server.url)
    lock = Lock(holder_client, "paused", ttl=ttl)
    lease = lock.acquire()
    noticed: list[float] = []
    lost = threading.Event()
    heartbeat = Heartbeat.current()
    heartbeat.register(
        lease, on_lost=lambda _lease, _e: (noticed.append(time.monotonic()), lost.set())
    )
    own_server.pause()
    try:
        assert lost.wait(ttl + 2), "a lease that lapsed during the pause was not reported lost"
        # Frozen a little longer: server time runs on meanwhile, so the lease lapses in Redis
        # too (the notice came when it may have lapsed, a round trip before it surely has).
        time.sleep(0.1)
    finally:
        own_server.resume()
        heartbeat.unregister(lease)
    late = noticed[0] - lease.valid_until
    # Not before it may have lapsed; within one interval (ttl/3) plus 0.25 s for a loaded machine
    # (stretched with its load).
    slack = 0.25 * load_factor()
    assert 0 <= late <= ttl / 3 + slack, f"reported {late:.3f} s after the lease may have lapsed"
    with pytest.raises(LockLost):
        lease.check()
    other = Lock(redis.Redis.from_url(own_server.url), "paused", ttl=5).acquire(timeout=2)
    assert other.fence > lease.fence


def _waiter(
    lock: Lock, got: list[tuple[float, Lease]], errors: list[BaseException]
) -> threading.Thread:
    def wait() -> None:
        try:
            lease = lock.acquire(timeout=10)
            got.append((time.monotonic(), lease))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    return thread


def test_waiter_survives_a_restart_and_gets_the_lock(own_server: RedisServer) -> None:
    """docs/failures.md, Redis restarted without persistence: "leases are gone (renew raises
    LockLost); fences still increase". A waiter whose client reconnects gets the lock the
    restart freed, at its next look (at most the 1 s fallback)."""
    # redis-py reconnects for up to 5 s: the restart takes well under that.
    client = redis.Redis.from_url(
        own_server.url, socket_connect_timeout=0.5, retry=Retry(ConstantBackoff(0.05), 100)
    )
    lock = Lock(client, "waiting", ttl=30)
    held = lock.acquire()
    got: list[tuple[float, Lease]] = []
    errors: list[BaseException] = []
    waiter = _waiter(lock, got, errors)
    wait_until_queued(client, lock)
    own_server.restart()
    restarted = time.monotonic()
    waiter.join(5)
    assert not waiter.is_alive()
    assert not errors
    got_at, lease = got[0]
    # At its next look: within the 1 s fallback of reconnecting; 0.5 s margin for a loaded machine.
    assert got_at - restarted < 1.0 + 0.5
    assert lease.fence > held.fence
    with pytest.raises(LockLost):
        held.renew()
    lease.release()


def test_waiter_without_retries_sees_redis_go_as_a_backend_error(own_server: RedisServer) -> None:
    """docs/failures.md: Redis unreachable, "every call raises LockBackendError": a blocked
    acquire too, at once, rather than waiting out its timeout."""
    client = redis.Redis.from_url(
        own_server.url, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    lock = Lock(client, "waiting", ttl=30)
    lock.acquire()
    got: list[tuple[float, Lease]] = []
    errors: list[BaseException] = []
    waiter = _waiter(lock, got, errors)
    wait_until_queued(client, lock)
    own_server.stop()
    # Far less than its 10 s timeout: the connection it blocks on is gone (1 s: a loaded machine).
    waiter.join(1.0)
    assert not waiter.is_alive()
    assert not got and len(errors) == 1
    assert isinstance(errors[0], LockBackendError) and errors[0].name == "waiting"


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
