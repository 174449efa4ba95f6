"""Batched renewal and the per-process heartbeat thread."""

from __future__ import annotations

import logging
import os
import re
import threading
import time

import pytest
import redis
from faultproxy import FaultProxy
from helpers import redis_time_ms, wait_for
from redis.backoff import NoBackoff
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
from celery_redislock.core import repeated


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


@pytest.mark.slow  # about 5 s on 2 quiet cores
def test_renewed_lease_survives_three_ttls(client: redis.Redis) -> None:
    ttl = 1.5  # renewed every 0.5 s: a renewal 1 s late still comes in time
    lock = Lock(client, "kept", ttl=ttl)
    lease = lock.acquire()
    heartbeat = Heartbeat.current()
    heartbeat.register(lease)
    try:
        # Three ttls on Redis's clock (the one the lease lapses on) from its first expiry's start.
        end = lease.expires_at_ms + 2 * ttl * 1000
        while redis_time_ms(client) < end:
            with pytest.raises(LockNotAcquired):
                lock.acquire(blocking=False)
            time.sleep(0.05)  # (a look every 0.05 s: time passing is the point)
        assert [h.token for h in lock.holders()] == [lease.token]
        lease.check()
    finally:
        heartbeat.unregister(lease)
    lease.release()


def test_deleted_lease_is_reported_lost_within_one_interval(client: redis.Redis) -> None:
    """docs/failures.md: a lease deleted behind its holder's back is reported lost "at its next
    renewal (<= ttl/3)"."""
    # Renewed every 2 s; it would lapse 6 s on. Told within 4 s: at its next renewal with 2 s
    # to spare for a loaded machine, and still well before the lapse could tell it.
    ttl = 6.0
    lease = Lock(client, "stolen", ttl=ttl).acquire()
    lost: list[tuple[Lease, BaseException | None]] = []
    called = threading.Event()
    registered = time.monotonic()
    Heartbeat.current().register(lease, on_lost=lambda x, e: (lost.append((x, e)), called.set()))
    client.delete(lease.lock.keys.leases)
    assert called.wait(ttl / 3 + 2 - (time.monotonic() - registered)), "loss not reported"
    assert lost == [(lease, None)]
    with pytest.raises(LockLost):
        lease.check()
    assert lease not in Heartbeat.current().leases()


@pytest.mark.slow  # about 5 s on 2 quiet cores
def test_max_hold_stops_renewal(client: redis.Redis) -> None:
    """docs/core.md: with ``max_hold``, "renewal stops after that many seconds and the lease then
    lapses within its ttl"."""
    # Renewed every 1 s (a renewal up to 2 s late still in time), twice before the maximum hold.
    ttl, max_hold = 3.0, 2.5
    lock = Lock(client, "bounded", ttl=ttl)
    acquiring = redis_time_ms(client)
    lease = lock.acquire()
    first_expiry = lease.expires_at_ms
    registering = redis_time_ms(client)
    registered = time.monotonic()
    Heartbeat.current().register(lease, max_hold=max_hold)
    # Lapses within ttl of the maximum hold (the 60 s: liveness only).
    wait_for(lambda: not lock.locked(), "the lease lapsed", timeout=60)
    assert time.monotonic() - registered > max_hold  # not before: renewed until then
    # Its last renewal (the server time it ran, ttl before its final expiry) came within one
    # interval before the maximum hold (a second late at most), and none after it: from the
    # acquisition to registering, plus the maximum hold, plus 0.5 s for the call to arrive.
    renewed_for = (lease.expires_at_ms - first_expiry) / 1000
    slack = (registering - acquiring) / 1000
    assert max_hold - ttl / 3 - 1 <= renewed_for <= max_hold + slack + 0.5, renewed_for
    assert lease not in Heartbeat.current().leases()


def test_child_process_gets_its_own_heartbeat(client: redis.Redis, redis_server: object) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    ttl = 1.5  # renewed every 0.5 s: a renewal 1 s late still comes in time
    parent_lease = Lock(client, "parent", ttl=ttl).acquire()
    parent_first = parent_lease.valid_until
    parent_heartbeat = Heartbeat.current()
    parent_heartbeat.register(parent_lease)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports through its exit code
        code = 1
        try:
            mine = Heartbeat.current()
            ok = mine is not parent_heartbeat and mine.leases() == []
            child_client = redis.Redis.from_url(url)
            lock = Lock(child_client, "child", ttl=ttl)
            lease = lock.acquire()
            first = lease.valid_until
            mine.register(lease)
            os.write(write_end, b"x")
            # Renewed past its first ttl by the child's own heartbeat (seen, not slept for).
            wait_for(lambda: lease.valid_until > first + ttl, "the child's lease renewed", 30)
            ok = ok and [h.token for h in lock.holders()] == [lease.token]
            code = 0 if ok else 1
        finally:
            os._exit(code)
    assert os.read(read_end, 1) == b"x"
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's heartbeat kept running across the fork.
    wait_for(lambda: parent_lease.valid_until > parent_first + ttl, "the parent's lease renewed")
    assert [h.token for h in Lock(client, "parent", ttl=1).holders()] == [parent_lease.token]
    parent_heartbeat.unregister(parent_lease)


def test_loss_is_reported_on_time_while_redis_hangs(own_server: RedisServer) -> None:
    """A renewal call stuck on a frozen Redis (a 60 s socket timeout) must not hold back the
    notice: it comes once the lease may have lapsed, not before, and not when the stuck call
    gives up."""
    ttl = 1.5
    client = redis.Redis.from_url(own_server.url, socket_timeout=60)
    lease = Lock(client, "frozen", ttl=ttl).acquire()
    notices: list[tuple[float, float, BaseException | None]] = []
    called = threading.Event()

    def on_lost(lost: Lease, error: BaseException | None) -> None:
        notices.append((time.monotonic(), lost.valid_until, error))
        called.set()

    heartbeat = Heartbeat.current()
    heartbeat.register(lease, on_lost=on_lost)
    own_server.pause()
    try:
        assert called.wait(ttl + 45), "loss not reported"
        with pytest.raises(LockLost):
            lease.check()
    finally:
        own_server.resume()
        heartbeat.unregister(lease)
    noticed_at, valid_until, error = notices[0]
    late = noticed_at - valid_until
    assert late >= 0, f"reported lost {-late:.3f} s before the lease could have lapsed"
    # Within one interval (ttl/3) on a quiet machine; held back by the stuck call, 60 s (the 30 s:
    # liveness only, with room for a loaded machine).
    assert late <= 30, f"reported lost {late:.3f} s after the lease lapsed"
    assert isinstance(error, LockBackendError) and "frozen" in str(error)
    assert lease not in heartbeat.leases()


def test_a_lapse_its_holder_saw_first_is_reported_when_it_lets_go(client: redis.Redis) -> None:
    """The holder's ``check()`` saw the lapse and its task ended before the heartbeat's thread
    looked again (a loaded machine): letting go of the lease reports it lost then, once, so
    that ``lock_lost`` and the ERROR log are not skipped."""
    lease = Lock(client, "seen-first", ttl=30).acquire()
    notices: list[tuple[Lease, BaseException | None]] = []
    reporters: list[threading.Thread] = []

    def on_lost(lost: Lease, error: BaseException | None) -> None:
        notices.append((lost, error))
        reporters.append(threading.current_thread())

    heartbeat = Heartbeat.current()
    heartbeat.register(lease, on_lost=on_lost)
    # Holding the heartbeat's lock (re-entrant) keeps its thread from looking at the lease in
    # between: the report can only come from unregister, on this thread.
    with heartbeat._cond:
        # No renewal answered in time (Redis frozen, say): the lease may have lapsed just now.
        lease.valid_until = time.monotonic()
        with pytest.raises(LockLost):
            lease.check()
        heartbeat.unregister(lease)
    assert [lost for lost, _ in notices] == [lease] and lease.lost
    assert reporters == [threading.current_thread()]
    assert isinstance(notices[0][1], LockBackendError) and "seen-first" in str(notices[0][1])
    heartbeat.unregister(lease)  # (again: nothing more to say)
    assert len(notices) == 1
    lease.release()


def test_a_lease_let_go_in_time_is_not_reported(client: redis.Redis) -> None:
    lease = Lock(client, "in-time", ttl=30).acquire()
    lost = threading.Event()
    heartbeat = Heartbeat.current()
    heartbeat.register(lease, on_lost=lambda _lease, _e: lost.set())
    heartbeat.unregister(lease)
    assert not lost.is_set() and not lease.lost
    lease.release()


@pytest.mark.slow  # about 4 s on 2 quiet cores
def test_a_short_freeze_is_not_reported(own_server: RedisServer) -> None:
    ttl = 4.5  # renewed every 1.5 s; the freeze leaves 2.5 s to spare for a loaded machine
    client = redis.Redis.from_url(own_server.url, socket_timeout=5)
    lock = Lock(client, "thawed", ttl=ttl)
    lease = lock.acquire()
    lost = threading.Event()
    heartbeat = Heartbeat.current()
    heartbeat.register(lease, on_lost=lambda _lease, _e: lost.set())
    try:
        own_server.pause()
        try:
            time.sleep(2.0)  # the freeze: longer than a renewal interval, shorter than the ttl
        finally:
            own_server.resume()
        resumed = time.monotonic()
        wait_for(lambda: lease.valid_until > resumed + ttl, "a renewal sent after the freeze", 30)
        assert not lost.is_set() and not lease.lost
        lease.check()
        assert [h.token for h in lock.holders()] == [lease.token]
    finally:
        heartbeat.unregister(lease)
    lease.release()


@pytest.mark.faults
def test_a_failed_renewal_is_retried_not_reported(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    """docs/failures.md, Redis unreachable: "the heartbeat retries and reports a lease lost once
    it may have lapsed": a renewal that fails with a connection error, for less than the ttl,
    is no loss."""
    ttl = 4.5  # renewed every 1.5 s: a failed renewal leaves 3 s for the next try
    with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        # No redis-py retries: the heartbeat itself sees the failure.
        flaky = redis.Redis.from_url(proxy.url, retry=Retry(NoBackoff(), 0))
        lock = Lock(flaky, "flaky", ttl=ttl)
        lease = lock.acquire()
        lease.renew()  # the renew script is loaded: one renewal is one EVALSHA
        lost = threading.Event()
        heartbeat = Heartbeat.current()
        heartbeat.register(lease, on_lost=lambda _lease, _e: lost.set())
        try:
            proxy.reset_after(1, command="EVALSHA")  # the next renewal fails
            wait_for(lambda: proxy.faults == 1, "a renewal failed", timeout=30)
            failed = time.monotonic()
            wait_for(lambda: lease.valid_until > failed + ttl, "a renewal after the failure", 30)
            assert not lost.is_set() and not lease.lost
            lease.check()
            assert lease in heartbeat.leases()
            assert [h.token for h in Lock(client, "flaky", ttl=ttl).holders()] == [lease.token]
        finally:
            heartbeat.unregister(lease)
            flaky.close()


@pytest.mark.faults
def test_a_late_answer_does_not_revive_a_lost_lease(
    redis_server: RedisServer, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A renewal answered only after its lease was reported lost leaves it lost, and no second
    call goes out for that lease meanwhile."""
    with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        lease = Lock(redis.Redis.from_url(proxy.url), "late", ttl=1.5).acquire()
        lease.renew()  # the renew script is loaded: one renewal is one EVALSHA
        sent = proxy.seen("EVALSHA")
        notices: list[BaseException | None] = []
        heartbeat = Heartbeat.current()
        heartbeat.register(lease, on_lost=lambda _lease, error: notices.append(error))
        proxy.delay(replies=2.0)  # the answer comes after the lease lapsed (1.5 s)
        wait_for(lambda: notices, "the lease was reported lost")
        valid_until = lease.valid_until
        wait_for(
            lambda: any("renewed after it had been reported lost" in m for m in caplog.messages),
            "the late answer came",
        )
        assert lease.lost and lease.valid_until == valid_until and lease not in heartbeat.leases()
        with pytest.raises(LockLost):
            lease.check()
        assert len(notices) == 1 and isinstance(notices[0], LockBackendError)
        assert proxy.seen("EVALSHA") == sent + 1


@pytest.mark.slow
@pytest.mark.faults
def test_renewal_failing_for_a_while_is_logged_once_summed_up_and_once_recovered(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24, item 5: a renewal retried every 0.5 s while Redis is unreachable logged each
    try (20 lines in 10 s for one lease). Now: its first failure, a summary every
    ``SUMMARY_EVERY_S`` (10 s; 3 s here, what is said does not depend on it), and one line when
    it works again."""
    summary_s = 3.0
    monkeypatch.setattr(repeated, "SUMMARY_EVERY_S", summary_s)
    ttl = 12.0  # first renewal after 4 s; 8 s of failures before it could lapse
    with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        flaky = redis.Redis.from_url(proxy.url, retry=Retry(NoBackoff(), 0))
        lease = Lock(flaky, "quiet", ttl=ttl).acquire()
        lease.renew()  # the renew script is loaded: one renewal is one EVALSHA
        heartbeat = Heartbeat.current()
        heartbeat.register(lease)
        try:
            proxy.reset_after(None, command="EVALSHA")  # every renewal fails from now on

            def said() -> list[str]:
                return [
                    r.getMessage()
                    for r in caplog.records
                    if r.name == "celery_redislock.core.heartbeat" and "renewal" in r.getMessage()
                ]

            wait_for(said, "the first renewal failure logged", timeout=30)
            tries = proxy.faults
            # What is measured is how little is said over the failures: the summary comes
            # SUMMARY_EVERY_S after the first failure (its text says so), nothing in between.
            wait_for(lambda: len(said()) >= 2, "a summary of the failures logged", timeout=60)
            # Tried again meanwhile (every 0.5 s on a quiet machine: some 6 times), said twice.
            assert proxy.faults - tries >= 3, "renewal was not retried meanwhile"
            assert len(said()) == 2, said()  # the first failure and one summary
            proxy.heal()
            wait_for(lambda: any("works again" in m for m in said()), "the recovery logged", 30)
            where = f"redis://127.0.0.1:{proxy.port}/0"
            first, summary, recovered = said()
            assert first.startswith(f"lease renewal on {where} failed, retrying: ")
            at = re.escape(where)
            still = rf"lease renewal on {at} still failing for (\d+)s \(\d+ attempts\): .*"
            summed = re.fullmatch(still, summary)
            assert summed and int(summed[1]) >= summary_s, summary
            again = rf"lease renewal on {at} works again after (\d+)s \(\d+ failed attempts\)"
            healed = re.fullmatch(again, recovered)
            assert healed and int(healed[1]) >= summary_s, recovered
            assert not lease.lost and lease in heartbeat.leases()
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        finally:
            heartbeat.unregister(lease)
            flaky.close()
