"""A lock paused for a while (``pause_lock``, ``redislock pause NAME SECONDS``): no new lease by
any path while it lasts (an acquire, a park, a release or a sweep handing the lock on), the
leases held go on; it ends by time (waiters look again then, a sweep hands the line on) or by
``resume_lock`` (the line is handed on at once); its field in the ``:limits`` hash outlives no
one; and a name without runtime limits keeps the fast path it had."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from faultproxy import FaultProxy
from helpers import wait_for, wait_until_queued
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redislock import Lease, Lock, LockConfigError, LockNotAcquired, renew_leases
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core import lock_base
from celery_redislock.core.admin import (
    clear_limits,
    describe_rate,
    pause_lock,
    resume_lock,
    set_limits,
)
from celery_redislock.core.admin.limits import call_limits
from celery_redislock.core.line import Handed, Parked, park, sweep_lines
from celery_redislock.core.protocol import AcquireArgs, AcquireReply, AcquireStatus
from celery_redislock.core.rate import MAX_PAUSE
from celery_redislock.core.scripts import run, script


class Publisher:
    """Records the parked tasks a lock hands over (the integrations publish a message here)."""

    def __init__(self) -> None:
        self.handed: list[Handed] = []

    def __call__(self, handed: Handed) -> None:
        self.handed.append(handed)

    @property
    def payloads(self) -> list[str]:
        return [h.payload for h in self.handed]


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _pause_end(client: redis.Redis, lock: Lock) -> int:
    return int(client.hget(lock.keys.limits, "lock_paused") or 0)


def _try(lock: Lock, token: str, *, wait: bool = False) -> AcquireReply:
    """One acquire script call, as ``Lock.acquire`` sends it (raw: the test reads the reply)."""
    args = AcquireArgs(token=token, spec=lock.spec, wait=wait, info="{}")
    return AcquireReply.decode(run("acquire", lock.client, lock.encoded_keys, args.encode()))


def _commands(client: redis.Redis) -> dict[str, int]:
    """The commands Redis ran since the last CONFIG RESETSTAT (scripts' own included)."""
    return {
        key.removeprefix("cmdstat_"): int(value["calls"])
        for key, value in client.info("commandstats").items()
        if not key.startswith(("cmdstat_info", "cmdstat_config"))
    }


# -- nothing new while paused -----------------------------------------------------------------


def test_a_pause_refuses_an_acquire_and_a_blocking_one_takes_the_lock_as_it_ends(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A waiter's fallback look (every second) pushed out to 120 s: only a look at the pause's
    # end can let the blocking acquire in before its 60 s run out, however slow the machine.
    monkeypatch.setattr(lock_base, "_WAIT_SLICE_S", 120.0)
    monkeypatch.setattr(lock_base, "QUEUE_ENTRY_MS", 122_000)
    monkeypatch.setattr(lock_base, "WAKE_LIST_MS", 122_000)
    lock = Lock(client, "paused", ttl=30)
    assert pause_lock(client, "paused", 3).paused_for == 3
    end = _pause_end(client, lock)
    with pytest.raises(LockNotAcquired):
        lock.acquire(blocking=False)
    # The reply says when to look again: when the pause ends (no lease is sooner), never 0.
    before = _server_ms(client)
    reply = _try(lock, "t-raw")
    after = _server_ms(client)
    assert reply.status is AcquireStatus.NOT_HELD and reply.ms_left > 0
    assert end - after <= reply.ms_left <= end - before
    assert not lock.holders()
    lease = lock.acquire(timeout=60)
    # The fence is the server's clock (us) when the lease was made: not before the pause ended
    # (and the waiter looked again at its end: a wait slice would have been 120 s).
    assert end * 1000 <= lease.fence
    lease.release()


def test_a_waiters_next_look_is_the_sooner_of_a_lease_expiry_and_the_pause_end(
    client: redis.Redis,
) -> None:
    short, long = Lock(client, "short", ttl=10), Lock(client, "long", ttl=240)
    held, kept = short.acquire(), long.acquire()
    pause_lock(client, "short", 60)
    pause_lock(client, "long", 60)

    def next_look(lock: Lock, token: str, at_ms: int) -> None:
        """The reply's next look is ``at_ms`` (on the server's clock), read around the call."""
        before = _server_ms(client)
        ms_left = _try(lock, token).ms_left
        assert at_ms - _server_ms(client) <= ms_left <= at_ms - before

    next_look(short, "t-1", held.expires_at_ms)  # the lease lapses first
    next_look(long, "t-2", _pause_end(client, long))  # the pause ends first
    held.release()
    next_look(short, "t-3", _pause_end(client, short))  # no lease: the pause's end
    kept.release()


def test_leases_held_renew_re_enter_and_release_while_paused(client: redis.Redis) -> None:
    lock = Lock(client, "held", ttl=10, limit=2)
    lease = lock.acquire(owner="a")
    pause_lock(client, "held", 30)
    before = lease.expires_at_ms
    report = renew_leases([lease], ttl=20)
    assert report.lost == [] and lease.expires_at_ms > before
    again = lock.acquire(owner="a")
    assert again.token == lease.token  # re-entered
    with pytest.raises(LockNotAcquired):  # room for a second holder, but paused
        lock.acquire(blocking=False, owner="b")
    lock.release(again)
    lease.release()
    assert not lock.holders()
    with pytest.raises(LockNotAcquired):
        lock.acquire(blocking=False)


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
def test_a_release_while_paused_hands_nothing_on(client: redis.Redis, fair: bool) -> None:
    publisher = Publisher()
    lock = Lock(client, "handing", ttl=30, fair=fair, handover=publisher)
    holder = lock.acquire()
    assert _try(lock, "waiter", wait=True).status is AcquireStatus.NOT_HELD  # in line
    parked = park(lock, "t1", owner="t1")
    assert isinstance(parked, Parked)
    pause_lock(client, "handing", 30)
    holder.release()
    assert lock.holders() == [] and publisher.payloads == []
    assert client.zcard(lock.keys.all[2]) == 2  # both still in line
    # The waiter's next try is refused too; so is a newcomer's park, which waits in line.
    assert _try(lock, "waiter", wait=True).status is AcquireStatus.NOT_HELD
    assert isinstance(park(lock, "t2", owner="t2"), Parked)
    # ... and a sweep hands nothing on either.
    assert sweep_lines(client, "redislock", publisher) == 2
    assert lock.holders() == [] and publisher.payloads == []


def test_a_park_on_a_free_paused_lock_waits_in_line(client: redis.Redis) -> None:
    lock = Lock(client, "free-paused", ttl=30, handover=Publisher())
    pause_lock(client, "free-paused", 30)
    parked = park(lock, "t1", owner="t1")
    assert isinstance(parked, Parked) and parked.parked == 1
    assert lock.holders() == []


@pytest.mark.slow  # about 4 s on 2 quiet cores
def test_woken_waiters_do_not_wake_each_other_while_paused(client: redis.Redis) -> None:
    """A non-fair waiter woken for a free lock it may not take passes the wake-up on; while the
    lock is paused none may take it, and two waiters would wake each other until the end."""
    lock = Lock(client, "no-storm", ttl=30)
    holder = lock.acquire()
    got: list[int] = []

    def wait() -> None:
        lease = lock.acquire(timeout=20)
        got.append(lease.fence)
        lease.release()

    waiters = [threading.Thread(target=wait) for _ in range(2)]
    for t in waiters:
        t.start()
    wait_until_queued(client, lock, 2)
    pause_lock(client, "no-storm", 4)
    client.config_resetstat()
    started = time.monotonic()
    holder.release()  # a wake-up nobody may use
    time.sleep(1)  # (a window to count in: each waiter looks again once a second at most)
    counted = _commands(client).get("evalsha", 0)
    window = time.monotonic() - started
    seen = list(got)
    if client.exists(lock.keys.limits):  # still paused as the count ended (the usual case)
        assert counted <= 2 * (math.ceil(window) + 1) + 1, counted
        assert seen == []
    for t in waiters:
        t.join(20)
    assert len(got) == 2  # one after the other, once the pause ended


# -- the end of a pause: by resume, by time ----------------------------------------------------


def test_resume_hands_the_lock_to_the_task_line_at_once(client: redis.Redis) -> None:
    publisher = Publisher()
    lock = Lock(client, "resumed", ttl=30, handover=publisher)
    holder = lock.acquire()
    places = [park(lock, f"t{i}", owner=f"t{i}") for i in (1, 2)]
    assert all(isinstance(p, Parked) for p in places)
    pause_lock(client, "resumed", 60)
    holder.release()
    assert publisher.payloads == []
    resumed = resume_lock(client, "resumed", handover=publisher)
    assert resumed.paused_for == 0.0 and resumed.handed_on == 1
    assert publisher.payloads == ["t1"]  # the first in line, published by the resume itself
    assert [h.token for h in lock.holders()] == [places[0].token]  # type: ignore[union-attr]
    assert not client.exists(lock.keys.limits)
    again = resume_lock(client, "resumed", handover=publisher)  # nothing to end
    assert again.handed_on == 0 and publisher.payloads == ["t1"]


def test_resume_wakes_a_blocked_waiter_at_once(client: redis.Redis) -> None:
    lock = Lock(client, "resume-wakes", ttl=30)
    holder = lock.acquire()
    got: list[Lease] = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=20)))
    waiter.start()
    wait_until_queued(client, lock)
    pause_lock(client, "resume-wakes", 60)  # only a resume lets it in now
    holder.release()
    assert got == []
    resume_lock(client, "resume-wakes")
    waiter.join(20)
    assert len(got) == 1
    got[0].release()


def test_resume_lets_a_fair_lock_s_waiters_in_in_order(client: redis.Redis) -> None:
    lock = Lock(client, "resume-fair", ttl=30, fair=True)
    holder = lock.acquire()
    order: list[int] = []

    def wait(n: int) -> None:
        lease = lock.acquire(timeout=20)
        order.append(n)
        lease.release()

    first = threading.Thread(target=wait, args=(1,))
    first.start()
    wait_until_queued(client, lock)
    second = threading.Thread(target=wait, args=(2,))
    second.start()
    wait_until_queued(client, lock, 2)
    pause_lock(client, "resume-fair", 60)
    holder.release()
    assert order == []
    resume_lock(client, "resume-fair")
    for t in (first, second):
        t.join(20)
    assert order == [1, 2]


def test_a_sweep_hands_the_line_on_once_the_pause_ended_by_time(client: redis.Redis) -> None:
    publisher = Publisher()
    lock = Lock(client, "ends", ttl=30, handover=publisher)
    pause_lock(client, "ends", 2)
    end = _pause_end(client, lock)
    parked = park(lock, "t1", owner="t1")
    assert isinstance(parked, Parked)
    swept_at = _server_ms(client)
    assert sweep_lines(client, "redislock", publisher) == 1
    if _server_ms(client) < end:  # (swept within the pause: it handed nothing on)
        assert publisher.payloads == [], swept_at
    wait_for(
        lambda: sweep_lines(client, "redislock", publisher) == 0 and publisher.payloads,
        "a sweep after the pause's end handed the lock on",
    )
    assert publisher.payloads == ["t1"]
    (holder,) = lock.holders()
    assert holder.token == parked.token and holder.fence >= end * 1000  # not before the end
    # The pause's key expires with its end: its TTL was set from the script's clock a moment
    # after it read the time (a busy machine may stretch that moment past the hand-over).
    wait_for(lambda: not client.exists(lock.keys.limits), "the pause's key expired with its end")


# -- lost replies ------------------------------------------------------------------------------


@pytest.fixture
def proxy(redis_server: RedisServer, client: redis.Redis) -> Iterator[FaultProxy]:
    # Loaded beforehand: a NOSCRIPT answer and its SCRIPT LOAD would be among what is lost.
    for name in ("limits", "line_sent", "notify"):
        client.script_load(script(name).script)
    with FaultProxy("127.0.0.1", redis_server.port) as fault_proxy:
        yield fault_proxy


def _through(proxy: FaultProxy) -> redis.Redis:
    c = redis.Redis.from_url(proxy.url, socket_timeout=0.5, retry=Retry(NoBackoff(), 1))
    c.ping()
    return c


@pytest.mark.faults
def test_a_pause_and_a_resume_retried_after_a_lost_reply_act_once(
    client: redis.Redis, proxy: FaultProxy
) -> None:
    through = _through(proxy)
    publisher = Publisher()
    lock = Lock(client, "lost", ttl=30, handover=publisher)
    holder = lock.acquire()
    parked = park(lock, "t1", owner="t1")
    assert isinstance(parked, Parked)

    before = proxy.seen("EVALSHA")
    t0 = _server_ms(client)
    proxy.drop_replies(1, command="EVALSHA")
    paused = pause_lock(through, "lost", 30)
    t1 = _server_ms(client)
    assert proxy.seen("EVALSHA") - before == 2  # the script ran twice
    # One pause: 30 s from one of the runs (the second keeps the first's or ends a bit later).
    end = _pause_end(client, lock)
    assert t0 + 30_000 <= end <= t1 + 30_000
    assert (end - t1) / 1000 <= paused.paused_for <= 30
    assert 0 < client.pttl(lock.keys.limits) <= 30_000
    holder.release()
    assert publisher.payloads == []

    before = proxy.seen("EVALSHA")
    proxy.drop_replies(1, command="EVALSHA")
    resumed = resume_lock(through, "lost", handover=publisher)
    assert proxy.seen("EVALSHA") - before >= 2  # the resume ran twice (then line_sent)
    # The second run answered the first run's hand-over: published once, handed once.
    assert resumed.handed_on == 1 and publisher.payloads == ["t1"]
    assert [h.token for h in lock.holders()] == [parked.token]
    assert not client.exists(lock.keys.limits)
    through.close()


def test_a_resume_run_twice_answers_the_same_hand_overs(client: redis.Redis) -> None:
    lock = Lock(client, "twice", ttl=30, handover=Publisher())
    holder = lock.acquire()
    parked = park(lock, "t1", owner="t1")
    assert isinstance(parked, Parked)
    pause_lock(client, "twice", 30)
    holder.release()
    first = call_limits(client, "twice", "redislock", "q", lock.spec, "req-1")
    state = (client.hgetall(lock.keys.meta), client.zrange(lock.keys.leases, 0, -1))
    second = call_limits(client, "twice", "redislock", "q", lock.spec, "req-1")
    assert [g.token for g in first.granted] == [parked.token]
    assert second.granted == first.granted
    assert (client.hgetall(lock.keys.meta), client.zrange(lock.keys.leases, 0, -1)) == state


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "seconds", [0, -1, True, float("nan"), float("inf"), "3", None, MAX_PAUSE + 1]
)
def test_a_bad_pause_is_refused_naming_the_lock_and_nothing_is_written(
    client: redis.Redis, seconds: object
) -> None:
    refused = "lock 'api': pause must be a number of seconds"
    with pytest.raises(LockConfigError, match=refused) as info:
        pause_lock(client, "api", seconds)  # type: ignore[arg-type]
    assert info.value.name == "api"
    assert client.keys("*") == []


# -- the pause outlives no one -----------------------------------------------------------------


def test_a_pause_alone_expires_with_its_end_and_a_longer_one_is_kept(client: redis.Redis) -> None:
    lock = Lock(client, "ttl", ttl=30)
    began = _server_ms(client)
    pause_lock(client, "ttl", 60)
    # (Less the time passed until after the TTL was read, and 1 ms more: the clock is read in
    # whole milliseconds.)
    left = client.pttl(lock.keys.limits)
    assert 60_000 - (_server_ms(client) - began) - 1 <= left <= 60_000
    end = _pause_end(client, lock)
    # A shorter pause: the longer stays (its end, and its TTL: far more than the shorter's).
    assert pause_lock(client, "ttl", 10).paused_for > 30
    assert _pause_end(client, lock) == end and client.pttl(lock.keys.limits) > 30_000
    began = _server_ms(client)
    pause_lock(client, "ttl", 120)  # a longer one: its end and its TTL
    left = client.pttl(lock.keys.limits)
    assert 120_000 - (_server_ms(client) - began) - 1 <= left <= 120_000
    resume_lock(client, "ttl")
    assert not client.exists(lock.keys.limits)
    pause_lock(client, "ttl", 0.05)
    wait_for(lambda: not client.exists(lock.keys.limits), "the pause expired with its end")
    lock.acquire(blocking=False).release()


def test_runtime_limits_keep_their_hash_from_expiring(client: redis.Redis) -> None:
    lock = Lock(client, "kept", ttl=30, limit=3)
    set_limits(client, "kept", cap=2)
    pause_lock(client, "kept", 30)
    end = _pause_end(client, lock)
    assert client.pttl(lock.keys.limits) == -1  # it holds a cap: no expiry
    clear_limits(client, "kept")  # the cap goes, the pause stays, with its end as expiry
    assert client.hkeys(lock.keys.limits) == [b"lock_paused"]
    assert 0 < client.pttl(lock.keys.limits) <= 30_000
    state = set_limits(client, "kept", cap=2)  # a cap again: the expiry goes
    assert client.pttl(lock.keys.limits) == -1 and state.cap == 2
    assert (end - _server_ms(client) - 1) / 1000 <= state.lock_paused_for <= 30  # (1 ms: rounding)
    resume_lock(client, "kept")  # the cap stays, with no expiry
    assert client.hgetall(lock.keys.limits) == {b"cap": b"2"}
    assert client.pttl(lock.keys.limits) == -1
    a, b = lock.acquire(blocking=False), lock.acquire(blocking=False)
    with pytest.raises(LockNotAcquired):  # the cap of 2 still holds
        lock.acquire(blocking=False)
    a.release()
    b.release()


def test_describe_rate_shows_the_lock_s_pause(client: redis.Redis) -> None:
    assert describe_rate(client, "shown").lock_paused_for == 0.0
    began = _server_ms(client)
    pause_lock(client, "shown", 30)
    state = describe_rate(client, "shown")
    paused_for = 30 - (_server_ms(client) - began + 1) / 1000  # (1 ms: whole milliseconds)
    assert paused_for <= state.lock_paused_for <= 30
    assert state.paused_for == 0.0  # the rate's: not paused


# -- the fast path -----------------------------------------------------------------------------


FAST_PATH = {"evalsha": 1, "exists": 1, "time": 1, "hmget": 1, "zadd": 1, "hset": 1, "pexpire": 2}
"""What an acquire of a free lock runs (acquire.lua's fast path), as before pauses existed; its
read of the fence mark is an HMGET that also looks for a lean lease (promote in _lock.lua)."""


def test_a_name_without_runtime_limits_keeps_the_fast_path(client: redis.Redis) -> None:
    Lock(client, "warm-up", ttl=30).acquire().release()  # (the script loaded)
    lock = Lock(client, "fast", ttl=30)
    client.config_resetstat()
    lease = lock.acquire(blocking=False)
    assert _commands(client) == FAST_PATH
    lease.release()
    # A name with a limit set at runtime takes the path that reads it (once), and is served.
    set_limits(client, "fast", cap=5)
    client.config_resetstat()
    lease = lock.acquire(blocking=False)
    assert _commands(client).get("hmget") == 2  # the limits, and the meta key (promote)
    lease.release()


def test_a_hand_over_without_runtime_limits_reads_none(client: redis.Redis) -> None:
    """A fair release handing the lock to a waiter knows from its EXISTS that nothing is set at
    runtime for the name: it does not read the limits."""
    lock = Lock(client, "fair-fast", ttl=30, fair=True)
    holder = lock.acquire()
    assert _try(lock, "waiter", wait=True).status is AcquireStatus.NOT_HELD
    client.config_resetstat()
    holder.release()
    assert _commands(client).get("hmget") == 1  # the meta key (promote), not the limits
    assert [h.token for h in lock.holders()] == ["waiter"]  # (its short lease lapses alone)
