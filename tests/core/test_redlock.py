"""RedLock: one lock over 3 or 5 independent redis-server processes. The quick checks run with
the default tests; exclusion under contention from threads and processes, 5 masters and the
restart stance are marked ``topology`` (``make test-topologies``)."""

from __future__ import annotations

import itertools
import multiprocessing
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import redis
from faultproxy import FaultProxy
from helpers import wait_for

from celery_redislock import (
    Heartbeat,
    JobFinished,
    Lease,
    Lock,
    LockBackendError,
    LockConfigError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    renew_leases,
)
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.redlock import RedLease, RedLock, lock_factory
from celery_redislock.core.redlock_masters import master_clients, parse_master_urls
from celery_redislock.core.scripts import script

# Generous socket waits: on a loaded machine a master slow to answer must not fail a test that
# needs both of the two masters left.
SOCKET_TIMEOUT = 2.0


class Masters:
    """``count`` redis-server processes (no persistence) and RedLock clients for them."""

    def __init__(self, stack: ExitStack, count: int) -> None:
        self.servers = [stack.enter_context(RedisServer()) for _ in range(count)]
        self.urls = [server.url for server in self.servers]
        self.clients = master_clients(self.urls, socket_timeout=SOCKET_TIMEOUT)
        self.direct = [redis.Redis.from_url(url, socket_timeout=5) for url in self.urls]
        stack.callback(lambda: [c.close() for c in self.direct])

    def lock(self, name: str = "job", **options: object) -> RedLock:
        options.setdefault("ttl", 5)
        lock = RedLock(self.clients, name, **options)  # type: ignore[arg-type]
        return lock

    def holding(self, lock: Lock) -> list[int]:
        """The indexes of the masters that hold a live lease of ``lock``."""
        out = []
        for i, (server, client) in enumerate(zip(self.servers, self.direct, strict=True)):
            if server.process is None:
                continue
            now = client.time()
            now_ms = now[0] * 1000 + now[1] // 1000
            if client.zcount(lock.keys.leases, f"({now_ms}", "+inf"):
                out.append(i)
        return out


@pytest.fixture
def masters() -> Iterator[Masters]:
    with ExitStack() as stack:
        yield Masters(stack, 3)


@pytest.fixture
def five() -> Iterator[Masters]:
    with ExitStack() as stack:
        yield Masters(stack, 5)


def wait_until(condition: object, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


# -- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("urls", "message"),
    [
        ("redis://a:1,redis://b:1", "odd number of at least 3"),
        ("redis://a:1,redis://b:1,redis://c:1,redis://d:1", "odd number of at least 3"),
        ("redis://a:1,redis://a:1/2,redis://c:1", r"same Redis server more than once \(a:1\)"),
        ("redis://a:1,b:1,redis://c:1", "'b:1' is not a Redis URL"),
        (42, "must be Redis URLs"),
    ],
)
def test_master_urls_are_checked(urls: object, message: str) -> None:
    with pytest.raises(LockConfigError, match=message):
        parse_master_urls(urls)


def test_what_redlock_mode_refuses_says_why() -> None:
    clients = master_clients(["redis://a:1", "redis://b:1", "redis://c:1"])
    with pytest.raises(LockConfigError, match=r"limit must be None or 1 in RedLock mode.*\{A,B\}"):
        RedLock(clients, "x", ttl=5, limit=2)
    with pytest.raises(LockConfigError, match="limit must be None or 1"):
        RedLock(clients, "x", ttl=5, mode="read", limit=3)
    with pytest.raises(LockConfigError, match="fair=True is not available in RedLock mode"):
        RedLock(clients, "x", ttl=5, fair=True)
    with pytest.raises(LockConfigError, match="min_replicas does not apply"):
        RedLock(clients, "x", ttl=5, min_replicas=1)
    with pytest.raises(LockConfigError, match=r"masters must be redis\.Redis clients"):
        RedLock([*clients[:2], "redis://c:1"], "x", ttl=5)  # type: ignore[list-item]
    with pytest.raises(LockConfigError, match="same client more than once"):
        RedLock([clients[0], clients[1], clients[0]], "x", ttl=5)
    with pytest.raises(LockConfigError, match=r"list of RedLock masters.*got str"):
        lock_factory("redis://a:1", "x", ttl=5)  # type: ignore[arg-type]
    # limit 1 is a mutex: safe (two majorities share a master, which admits one holder).
    assert RedLock(clients, "x", ttl=5, limit=1).limit == 1
    assert isinstance(lock_factory(clients[0], "x", ttl=5), Lock)
    assert not isinstance(lock_factory(clients[0], "x", ttl=5), RedLock)
    made = lock_factory(["redis://a:1", "redis://b:1", "redis://c:1"], "x", ttl=5)
    assert isinstance(made, RedLock) and made.masters == clients  # clients made once


def test_the_settings_select_redlock_for_celery_and_rq() -> None:
    from celery import Celery

    from celery_redislock.integrations.celery import install
    from celery_redislock.integrations.celery.settings import check_app, settings_for
    from celery_redislock.integrations.rq import Settings

    urls = "redis://a:1,redis://b:1,redis://c:1"
    app = install(Celery("redlock-settings", broker="memory://"))
    app.conf.redislock_url = "redis://locks:6379/0"  # (unique claims stay there)
    app.conf.redislock_redlock_urls = urls
    assert check_app(app, needs_redis=True) == []  # a known setting, no warning
    settings = settings_for(app)
    assert settings.redlock_urls == ("redis://a:1", "redis://b:1", "redis://c:1")
    # The integrations' one call: RedLock when the setting is there, else the one client.
    lock = lock_factory(settings.redlock_urls or redis.Redis(), "job", ttl=settings.ttl)
    assert isinstance(lock, RedLock) and len(lock.masters) == 3
    app.conf.redislock_redlock_urls = "redis://a:1,redis://b:1"
    with pytest.raises(LockConfigError, match="setting redislock_redlock_urls must name an odd"):
        settings_for(app)
    app.conf.redislock_redlock_urls = urls
    app.conf.redislock_sentinels = "h:26379"
    app.conf.redislock_sentinel_master = "m"
    with pytest.raises(LockConfigError, match="redislock_redlock_urls and redislock_sentinels"):
        settings_for(app)

    rq = Settings.from_env({"REDISLOCK_REDLOCK_URLS": urls})
    assert rq.redlock_urls == ("redis://a:1", "redis://b:1", "redis://c:1")
    assert Settings(redlock_urls=list(rq.redlock_urls)).redlock_urls == rq.redlock_urls  # type: ignore[arg-type]
    assert Settings().redlock_urls is None
    with pytest.raises(LockConfigError, match=r"REDISLOCK_REDLOCK_URLS.*same Redis server"):
        Settings.from_env({"REDISLOCK_REDLOCK_URLS": "redis://a:1,redis://a:1,redis://c:1"})
    with pytest.raises(LockConfigError, match="redlock_urls and sentinels"):
        Settings(redlock_urls=urls, sentinels="h:1", sentinel_master="m")  # type: ignore[arg-type]


# -- the lock ------------------------------------------------------------------------------


def test_a_lease_is_held_on_every_master_and_given_back(masters: Masters) -> None:
    lock = masters.lock(ttl=5)
    with lock.acquire(info={"task_id": "t1"}) as lease:
        assert isinstance(lease, RedLease)
        wait_until(lambda: masters.holding(lock) == [0, 1, 2], "every master holds it")
        with pytest.raises(LockNotAcquired):
            lock.acquire(blocking=False)
        [holder] = lock.holders()
        assert (holder.token, holder.fence, holder.info["task_id"]) == (
            lease.token,
            lease.fence,
            "t1",
        )
        assert 4 < holder.expires_in <= 5
        assert lock.locked()
        lease.check()
    assert lease.released and not lock.locked() and masters.holding(lock) == []
    with lock as again:  # the Lock API's own context manager
        assert again.fence > lease.fence
    with pytest.raises(LockNotOwned):
        again.release()


def test_fences_grow_across_majorities(masters: Masters) -> None:
    """The fence is the highest any granting master gave, raised on the others before the
    acquire returns: a later acquisition on another majority still gets a higher one."""
    lock = masters.lock(ttl=5)
    first = lock.acquire()
    first.release()
    # Master 2's clock runs far ahead (or it served other holders): its mark is high.
    ahead = first.fence + 10**9
    masters.direct[2].hset(lock.keys.meta, "fence", ahead)
    masters.servers[0].stop()  # the majority is {1, 2}
    second = lock.acquire()
    assert second.fence > ahead
    second.release()
    masters.servers[0].start()  # (empty)
    masters.servers[2].stop()  # the next majority is {0, 1}: only the raise told master 1
    third = lock.acquire()
    assert third.fence > second.fence
    third.release()


def test_one_master_down_still_works_and_two_down_fail_closed(masters: Masters) -> None:
    lock = masters.lock(ttl=5)
    masters.servers[0].stop()
    lease = lock.acquire(timeout=2)
    assert masters.holding(lock) == [1, 2]
    lease.renew()
    lease.release()
    masters.servers[1].stop()
    for blocking in (False, True):
        began = time.monotonic()
        with pytest.raises(
            LockBackendError, match=r"2 of 3 RedLock masters failed; a majority \(2\)"
        ):
            lock.acquire(blocking=blocking, timeout=120 if blocking else None)
        # At once, not after the 120 s timeout (the 60 s: liveness only).
        assert time.monotonic() - began < 60
    # The one master that granted gives it back, as soon as its answer is in (the acquire
    # raised before: a majority was out of reach once two had failed).
    wait_for(lambda: masters.holding(lock) == [], "the grant to be given back", timeout=30)
    with pytest.raises(LockBackendError, match="a majority"):
        lock.holders()


@pytest.mark.topology
def test_five_masters_work_with_two_down_and_fail_closed_with_three(five: Masters) -> None:
    lock = five.lock(ttl=5)
    five.servers[0].stop()
    five.servers[3].stop()
    lease = lock.acquire(timeout=2)
    assert five.holding(lock) == [1, 2, 4]
    with pytest.raises(LockNotAcquired):
        five.lock(ttl=5).acquire(blocking=False)
    lease.renew()
    lease.release()
    five.servers[4].stop()
    with pytest.raises(LockBackendError, match=r"3 of 5 RedLock masters failed; a majority \(3\)"):
        lock.acquire(timeout=5)
    # What the failed try took is given back; on a master whose answer came after the outcome
    # was decided (three refused at once), when that answer comes.
    wait_for(lambda: five.holding(lock) == [], "the failed try's leases given back", 30)


def test_owner_job_and_release_where(masters: Masters) -> None:
    lock = masters.lock(ttl=5)
    lease = lock.acquire(owner="task-1", reentrant=False, info={"task_id": "task-1"}, job="j1")
    with pytest.raises(LockNotAcquired) as refused:
        lock.acquire(owner="task-1", reentrant=False, timeout=5)  # at once, never waits on itself
    assert refused.value.owner_expires_in is not None and 4 < refused.value.owner_expires_in <= 5
    assert lock.acquire(owner="task-1").token == lease.token  # re-entry: the same lease
    lock.release(lease)
    assert not lease.released  # one level left
    lease.release(finish_job="j1", keep=60)
    assert not lock.locked()
    with pytest.raises(JobFinished):
        lock.acquire(job="j1")
    assert masters.holding(lock) == []  # the masters that granted gave it back
    held = lock.acquire(info={"task_id": "t2", "pid": "42"})
    assert lock.release_where(task_id="t2", pid="42") == [held.token]
    # A master whose grant landed after the majority's (its call still out when the acquire
    # returned) may hold a stray lease, which holds nothing, until its ttl: seen once, quiet.
    wait_until(lambda: masters.holding(lock) == [], "no master holds it", timeout=15)


def test_readers_share_and_writers_exclude_over_majorities(masters: Masters) -> None:
    readers = masters.lock("rw", mode="read")
    writers = masters.lock("rw", mode="write")
    one, two = readers.acquire(), readers.acquire()
    assert len(readers.holders()) == 2
    with pytest.raises(LockNotAcquired):
        writers.acquire(blocking=False)
    one.release()
    two.release()
    writer = writers.acquire(blocking=False)
    with pytest.raises(LockNotAcquired):
        readers.acquire(blocking=False)
    writer.release()


def test_a_blocking_acquire_takes_the_lock_soon_after_its_release(masters: Masters) -> None:
    # The lease lasts 240 s: the waiter, patient for 60 s, can only get in by trying again
    # after the release (no wake-up crosses masters), however slow the machine.
    lock = masters.lock(ttl=240)
    lease = lock.acquire()
    got: list[float] = []
    tries = _script_calls(masters.direct[0])
    waiter = threading.Thread(target=lambda: got.append(_acquired_at(lock)))
    waiter.start()
    # It tries again and again while the lock is held (each try: one script call per master).
    wait_until(lambda: _script_calls(masters.direct[0]) >= tries + 3, "the waiter tried 3 times")
    released = time.monotonic()
    lease.release()
    waiter.join(90)
    assert got and 0 <= got[0] - released < 30, "the waiter did not try again after the release"
    with pytest.raises(LockNotAcquired, match=r"gave up after 0\.3s"):
        held = lock.acquire()
        try:
            lock.acquire(timeout=0.3)
        finally:
            held.release()


def _script_calls(client: redis.Redis) -> int:
    """The script calls (EVALSHA) a master ran so far."""
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def _acquired_at(lock: Lock) -> float:
    lease = lock.acquire(timeout=60)
    at = time.monotonic()
    lease.release()
    return at


# -- validity, drift, renewal --------------------------------------------------------------


def test_the_validity_is_the_ttl_less_the_time_taken_and_the_drift(masters: Masters) -> None:
    """Validity = ttl - elapsed - (1% of ttl + 2 ms), from the start of the attempt; every
    master keeps the lease past its end, read on the master's own clock, with the drift to
    spare for a master clock that runs fast."""
    lock = masters.lock(ttl=10)
    began = time.monotonic()
    lease = lock.acquire()
    returned = time.monotonic()
    drift = 10 * 0.01 + 0.002
    assert began + 10 - drift <= lease.valid_until <= returned + 10 - drift
    for client in masters.direct:
        # The acquire returned on a majority: the last master's grant may still be on its way.
        wait_until(
            lambda c=client: c.zscore(lock.keys.leases, lease.token) is not None,
            "every master to hold the lease",
        )
        sent = time.monotonic()
        seconds, micros = client.time()  # the master's clock, read after `sent`
        validity_end_ms = seconds * 1000 + micros / 1000 + (lease.valid_until - sent) * 1000
        expiry = client.zscore(lock.keys.leases, lease.token)
        assert expiry is not None and expiry >= validity_end_ms
    lease.release()


@pytest.mark.slow  # about 6 s on 2 quiet cores
def test_a_slow_master_shrinks_the_validity_and_past_it_the_acquire_fails(
    masters: Masters,
) -> None:
    """Master 0 answers at once, master 1 through a proxy that delays its replies, master 2 is
    down: a majority needs the slow one, and its delay is taken off the validity; a delay past
    the validity fails the acquire (and the slow master's grant is given back when it comes)."""
    masters.servers[2].stop()
    with FaultProxy("127.0.0.1", masters.servers[1].port) as proxy:
        slow = redis.Redis.from_url(proxy.url, socket_timeout=10)
        clients = [masters.clients[0], slow, masters.clients[2]]
        lock = RedLock(clients, "slow", ttl=1)
        lock.acquire().release()  # connections made
        for name in ("acquire", "release", "redlock_fence"):  # every script loaded there
            slow.script_load(script(name).script)
        proxy.delay(replies=0.3)
        began = time.monotonic()
        lease = lock.acquire()
        returned = time.monotonic()
        assert returned - began >= 0.3
        assert lease.valid_until - returned <= 1 - 0.012 - 0.3  # the delay taken off
        lease.release()
        late = masters.direct[1]
        mark = int(late.hget(lock.keys.meta, "fence") or 0)
        # What happens to the lease on the slow master, seen as Redis's own events: a grant
        # given back shows as a removal, a grant left to lapse as "expired".
        late.config_set("notify-keyspace-events", "KA")
        events = late.pubsub()
        events.subscribe(f"__keyspace@0__:{lock.keys.leases}")
        proxy.delay(requests=4)  # far more than the validity (0.988 s)
        with pytest.raises(LockBackendError, match="1 no answer within the validity"):
            lock.acquire(blocking=False)
        # It gave up at the end of the validity, before the slow master even had the request.
        assert int(late.hget(lock.keys.meta, "fence") or 0) == mark
        proxy.heal()  # (the request held back still arrives late; what follows does not)
        # The slow master grants it after all (4 s in, for a ttl): given back as soon as its
        # answer comes, not left to lapse (the 30 s: liveness only).
        wait_until(lambda: int(late.hget(lock.keys.meta, "fence") or 0) > mark, "granted late", 30)
        wait_until(lambda: late.zcard(lock.keys.leases) == 0, "given back", 30)
        seen: list[str] = []
        while (message := events.get_message(timeout=1.0)) is not None:  # (all arrived)
            if message["type"] == "message":
                seen.append(message["data"].decode())
        events.close()
        assert "zadd" in seen and "expired" not in seen, seen
        assert seen.index("zadd") < max(seen.index(e) for e in ("zrem", "del") if e in seen)
        slow.close()


@pytest.mark.slow  # about 5 s on 2 quiet cores
def test_renewal_keeps_a_lease_past_its_ttl_and_reports_it_lost_without_a_majority(
    masters: Masters,
) -> None:
    ttl = 1.5
    lock = masters.lock(ttl=ttl)
    lost: list[tuple[Lease, float, BaseException | None]] = []
    heartbeat = Heartbeat.current()
    lease = lock.acquire()
    first = lease.valid_until
    heartbeat.register(lease, on_lost=lambda gone, e: lost.append((gone, time.monotonic(), e)))
    try:
        # Renewed past two ttls on every master meanwhile: seen by its validity, not slept for.
        wait_until(lambda: lease.valid_until > first + 2 * ttl, "renewed past two ttls", 30)
        lease.check()
        assert masters.holding(lock) == [0, 1, 2]
        masters.servers[0].stop()
        masters.servers[1].stop()
        promised = lease.valid_until  # no renewal can succeed from now on
        wait_until(lambda: lost, "the heartbeat reported the lease lost", 30)  # (liveness)
    finally:
        heartbeat.unregister(lease)
    [(reported, _, error)] = lost
    assert reported is lease and lease.lost
    assert lease.valid_until == promised  # no renewal counted after the majority was gone
    assert isinstance(error, LockBackendError) and "a majority (2) is needed" in str(error)
    with pytest.raises(LockLost):
        lease.check()


def test_a_renewal_answered_after_the_validity_loses_the_lease(masters: Masters) -> None:
    """Two masters renew at once but their answers come back after the lease's validity ended:
    the lease is lost (LockLost), not renewed late."""
    with (
        FaultProxy("127.0.0.1", masters.servers[1].port) as one,
        FaultProxy("127.0.0.1", masters.servers[2].port) as two,
    ):
        slow = [redis.Redis.from_url(p.url, socket_timeout=10) for p in (one, two)]
        lock = RedLock([masters.clients[0], *slow], "late", ttl=1)
        lease = lock.acquire()
        for client in slow:
            client.script_load(script("renew").script)
        one.delay(replies=1.2)
        two.delay(replies=1.2)
        with pytest.raises(LockLost):
            lease.renew()
        assert lease.lost
        for client in slow:
            client.close()


def test_renewal_reports_at_once_a_lease_a_majority_no_longer_has(masters: Masters) -> None:
    lock = masters.lock(ttl=5)
    lease = lock.acquire()
    for server in masters.servers[:2]:
        server.restart()  # empty: no persistence
    report = renew_leases([lease])
    assert report.lost == [lease] and lease.lost
    with pytest.raises(LockLost):
        lease.renew()


# -- under contention (topology) -----------------------------------------------------------


def _contend(lock: RedLock, rounds: int, log: list[tuple[float, float]]) -> None:
    for _ in range(rounds):
        with lock.acquire(timeout=30) as lease:
            began = time.monotonic()
            time.sleep(0.002)  # (held a while: an overlap needs time to show)
            lease.check()  # still within its validity as it ends
            log.append((began, time.monotonic()))


def _no_overlap(log: list[tuple[float, float]]) -> None:
    ordered = sorted(log)
    for (_, end), (start, _) in itertools.pairwise(ordered):
        assert start >= end, f"two holders at once: one until {end}, the next from {start}"


@pytest.mark.topology
@pytest.mark.parametrize("count", [3, 5])
def test_exclusion_under_contention_from_threads(count: int) -> None:
    with ExitStack() as stack:
        group = Masters(stack, count)
        log: list[tuple[float, float]] = []
        threads = [
            threading.Thread(target=_contend, args=(group.lock("hot", ttl=5), 15, log))
            for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(log) == 90
        _no_overlap(log)


def _process_contend(urls: list[str], rounds: int, out: multiprocessing.Queue[object]) -> None:
    lock = RedLock(master_clients(urls, socket_timeout=SOCKET_TIMEOUT), "hot", ttl=5)
    log: list[tuple[float, float]] = []
    try:
        _contend(lock, rounds, log)  # (time.monotonic() is one clock for every process)
        out.put(log)
    except BaseException as exc:
        out.put(repr(exc))


@pytest.mark.topology
def test_exclusion_under_contention_from_processes(masters: Masters) -> None:
    # Forked after this process's RedLock threads ran: the children must make their own.
    masters.lock("hot").acquire().release()
    context = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[object] = context.Queue()
    children = [
        context.Process(target=_process_contend, args=(masters.urls, 15, out)) for _ in range(3)
    ]
    for child in children:
        child.start()
    results = [out.get(timeout=120) for _ in children]
    for child in children:
        child.join(30)
    log = []
    for result in results:
        assert isinstance(result, list), result
        log += result
    assert len(log) == 45
    _no_overlap(log)


# -- a master restarted empty (topology) ---------------------------------------------------


@pytest.mark.topology
def test_one_master_restarted_empty_while_all_hold_keeps_the_lock(masters: Masters) -> None:
    """Held on all three, one restarts without persistence: the other two are a majority,
    nobody else gets the lock, and renewal goes on."""
    lock = masters.lock(ttl=5)
    lease = lock.acquire()
    masters.servers[0].restart()
    with pytest.raises(LockNotAcquired):
        masters.lock(ttl=5).acquire(timeout=0.5)
    lease.renew()
    assert masters.holding(lock) == [1, 2]
    lease.release()


@pytest.mark.topology
def test_restarting_a_master_at_once_can_grant_the_lock_twice_and_a_delayed_restart_cannot(
    masters: Masters,
) -> None:
    """The documented stance: a crashed master must stay down for a ttl (or keep its data,
    appendfsync always). Held on {0, 1} while 2 was down: 0 restarted empty at once with 2 back
    lets another client take {0, 2} while the first still believes it holds the lock (it
    learns at its next renewal). Restarted after a ttl, the first holder's validity ended
    (its renewals lacked a majority) before anybody else could take it."""
    ttl = 1.0
    lock = masters.lock(ttl=ttl)
    masters.servers[2].stop()
    first = lock.acquire()
    masters.servers[0].restart()  # at once, empty
    masters.servers[2].start()
    second = lock.acquire(blocking=False)  # granted twice
    first.check()  # the first holder cannot tell yet
    with pytest.raises(LockLost):
        first.renew()
    second.release()

    # Delayed restart: the first holder keeps renewing through the heartbeat meanwhile.
    masters.servers[1].restart()
    masters.servers[2].restart()  # (nothing held anywhere now)
    masters.servers[2].stop()
    lost: list[float] = []
    holder = lock.acquire()
    heartbeat = Heartbeat.current()
    heartbeat.register(holder, on_lost=lambda lease, error: lost.append(time.monotonic()))
    try:
        masters.servers[0].stop()  # crashed; back only after a ttl
        time.sleep(ttl)  # (a ttl passing is the point: the documented stance)
        masters.servers[0].start()
        masters.servers[2].start()
        other = masters.lock(ttl=ttl).acquire(timeout=60)  # (liveness only)
        taken = time.monotonic()
    finally:
        heartbeat.unregister(holder)
    assert holder.valid_until <= taken  # the first holder had stopped counting on it
    wait_until(lambda: lost, "the first holder was told", 30)
    other.release()
