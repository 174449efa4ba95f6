"""Batched renewal and the per-process renewer thread."""

from __future__ import annotations

import os
import threading
import time

import pytest
import redis
from conftest import wait_for

from celery_redislock import Lease, Lock, LockLost, LockNotAcquired, Renewer, renew_leases


def _evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def test_renew_many_leases_in_one_call(client: redis.Redis) -> None:
    leases = [Lock(client, f"job:{i}", ttl=5).acquire() for i in range(200)]
    client.delete(leases[7].lock.keys.leases)  # removed behind its holder's back
    renew_leases(leases[:1])  # the first call on a server also loads the script
    before = _evalsha_calls(client)
    report = renew_leases(leases, ttl=60)
    assert _evalsha_calls(client) - before == 1
    assert report.lost == [leases[7]] and leases[7].lost
    assert len(report.renewed) == 199
    assert 59 < Lock(client, "job:0", ttl=5).holders()[0].expires_in <= 60


def test_renew_does_not_revive_an_expired_lease(client: redis.Redis) -> None:
    lock = Lock(client, "short", ttl=0.1)
    lease = lock.acquire()
    wait_for(lambda: not lock.holders(), "the lease expired")
    with pytest.raises(LockLost, match="lock 'short' was lost"):
        lease.renew()
    assert Lock(client, "short", ttl=1).holders() == []


def test_renewed_lease_survives_three_ttls(client: redis.Redis) -> None:
    lock = Lock(client, "kept", ttl=0.3)
    lease = lock.acquire()
    renewer = Renewer.current()
    renewer.register(lease)
    try:
        end = time.monotonic() + 0.9
        while time.monotonic() < end:
            with pytest.raises(LockNotAcquired):
                lock.acquire(blocking=False)
            time.sleep(0.05)
        assert [h.token for h in lock.holders()] == [lease.token]
        lease.check()
    finally:
        renewer.unregister(lease)
    lease.release()


def test_deleted_lease_is_reported_lost_within_one_interval(client: redis.Redis) -> None:
    lease = Lock(client, "stolen", ttl=1.5).acquire()  # renewed every 0.5 s
    lost: list[tuple[Lease, BaseException | None]] = []
    called = threading.Event()
    Renewer.current().register(lease, on_lost=lambda x, e: (lost.append((x, e)), called.set()))
    client.delete(lease.lock.keys.leases)
    assert called.wait(1.5), "loss not reported"
    assert lost == [(lease, None)]
    with pytest.raises(LockLost):
        lease.check()
    assert lease not in Renewer.current().leases()


def test_max_hold_stops_renewal(client: redis.Redis) -> None:
    lock = Lock(client, "bounded", ttl=0.3)
    lease = lock.acquire()
    Renewer.current().register(lease, max_hold=0.4)
    time.sleep(0.4)  # longer than the ttl: the observation window
    assert lock.locked()  # still renewed up to the maximum hold
    wait_for(lambda: not lock.locked(), "the lease lapsed after its maximum hold")
    assert lease not in Renewer.current().leases()


def test_child_process_gets_its_own_renewer(client: redis.Redis, redis_server: object) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    parent_lease = Lock(client, "parent", ttl=0.3).acquire()
    parent_renewer = Renewer.current()
    parent_renewer.register(parent_lease)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports through its exit code
        code = 1
        try:
            mine = Renewer.current()
            ok = mine is not parent_renewer and mine.leases() == []
            child_client = redis.Redis.from_url(url)
            lock = Lock(child_client, "child", ttl=0.3)
            lease = lock.acquire()
            mine.register(lease)
            os.write(write_end, b"x")
            time.sleep(1.0)
            ok = ok and [h.token for h in lock.holders()] == [lease.token]
            code = 0 if ok else 1
        finally:
            os._exit(code)
    assert os.read(read_end, 1) == b"x"
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's renewer kept running across the fork.
    assert [h.token for h in Lock(client, "parent", ttl=1).holders()] == [parent_lease.token]
    parent_renewer.unregister(parent_lease)
