"""A restricted Redis user: the commands the docs list are enough, and a user without one of
them gets an error naming the command it lacks."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import redis
from helpers import wait_for, wait_until_queued

from celery_redislock import (
    Lock,
    LockBackendError,
    LockNotAcquired,
    acquire_all,
    iter_locks,
    renew_leases,
)
from celery_redislock.core.admin import (
    clear_limits,
    describe_rate,
    list_rates,
    pause_rate,
    resume_rate,
    set_limits,
)
from celery_redislock.core.line import Parked, park, sweep
from celery_redislock.core.rate import Rate, RateLimit

# The list in docs/topologies.md ("Redis permissions"), as one ACL rule set.
DOCUMENTED_RULES = [
    "~redislock:*",
    "+evalsha",
    "+script|load",
    "+blpop",
    "+scan",
    "+hget",
    "+hset",
    "+ping",
    # run inside the scripts
    *[
        "+time",
        "+get",
        "+set",
        "+del",
        "+exists",
        "+pttl",
        "+pexpire",
        "+hdel",
        "+hincrby",
        "+rpush",
        "+sadd",
        "+sismember",
    ],
    *["+zadd", "+zcard", "+zrange", "+zrangebyscore", "+zrem", "+zremrangebyscore", "+zscore"],
    "+zrangebylex",  # tenants in the task line
    "+hmget",  # the runtime limits (rate.lua, limits.lua, a lock's cap and pause) and the bucket
]


def _documented() -> list[str]:
    """The rules of the ACL SETUSER line in docs/topologies.md ("Redis permissions")."""
    text = (Path(__file__).parents[2] / "docs" / "topologies.md").read_text()
    block = text.split("## Redis permissions (ACL)", 1)[1].split("```", 2)[1]
    return [word for word in block.split() if word.startswith(("~", "+"))]


def _user(client: redis.Redis, name: str, rules: list[str]) -> redis.Redis:
    client.acl_setuser(name, enabled=True, passwords=["+pw"], reset_keys=True, reset_channels=True)
    client.execute_command("ACL", "SETUSER", name, "-@all", *rules)
    kwargs = client.connection_pool.connection_kwargs
    return redis.Redis(host=kwargs["host"], port=kwargs["port"], username=name, password="pw")


def test_the_listed_permissions_are_enough(client: redis.Redis) -> None:
    restricted = _user(client, "locks", DOCUMENTED_RULES)
    client.script_flush()  # the restricted user loads the scripts itself
    lock = Lock(restricted, "acl", ttl=5, fair=True)
    lease = lock.acquire()
    renew_leases([lease])
    assert [h.token for h in lock.holders()] == [lease.token]
    assert list(iter_locks(restricted)) == ["acl"]
    waiter = threading.Thread(target=lambda: lock.acquire(timeout=5).release())
    waiter.start()
    wait_until_queued(client, lock)  # the waiting commands run as the restricted user too
    lease.release()
    waiter.join(5)
    assert not waiter.is_alive()
    lock.finish_job("job-1", keep=5)
    assert lock.release_where(pid="0") == []
    plain = Lock(restricted, "acl-plain", ttl=5)
    with plain.acquire(), pytest.raises(LockNotAcquired, match="held"):
        plain.acquire(blocking=False)
    # Several locks at once (a lock= list): taken, and refused by a held one.
    pair = [Lock(restricted, "acl-a", ttl=5, mode="read"), Lock(restricted, "acl-b", ttl=5)]
    both = acquire_all(pair, owner="job-2", reentrant=False, job="job-2")
    with pytest.raises(LockNotAcquired, match="acl-b"):
        acquire_all(pair, blocking=False)
    for held in both:
        held.release()


def test_the_listed_permissions_run_the_task_line(client: redis.Redis) -> None:
    """Parking (taking a free lock with a claim, waiting in line, lapsing out of it) runs only
    listed commands."""
    restricted = _user(client, "liner", DOCUMENTED_RULES)
    client.script_flush()
    lock = Lock(restricted, "acl-line", ttl=5, limit=2)
    leases = [park(lock, "first", owner="a"), park(lock, "second", owner="b")]  # beside a lease
    assert not any(isinstance(lease, Parked) for lease in leases)
    assert isinstance(park(lock, "third", owner="c", max_wait=1), Parked)

    def purged() -> bool:
        with pytest.raises(LockNotAcquired):
            lock.acquire(blocking=False)  # purges the lapsed parked entry, as the restricted user
        return client.zcard(lock.keys.all[2]) == 0

    wait_for(purged, "the lapsed parked task out of line")
    # Tenants: parked among their tenant's tasks, handed the lock in turn; a hand-over nobody
    # publishes lapses, and goes back at its tenant's turn.
    a0 = park(lock, "a0", owner="a0", tenant="A")
    b0 = park(lock, "b0", owner="b0", tenant="B", priority=1)
    assert isinstance(a0, Parked) and isinstance(b0, Parked)
    for lease in leases:
        assert not isinstance(lease, Parked)
        lease.release()  # (`lock` cannot publish: its hand-overs lapse, back in line)
    handed = {a0.token.encode(), b0.token.encode()}
    assert set(client.zrange(lock.keys.leases, 0, -1)) == handed
    sweep(lock)
    assert set(client.zrange(lock.keys.leases, 0, -1)) == handed


def test_the_documented_list_is_the_tested_one() -> None:
    assert sorted(_documented()) == sorted(DOCUMENTED_RULES)


def test_the_listed_permissions_run_a_rate_limit(client: redis.Redis) -> None:
    """Every rate limit call and the admin functions, as a user with the listed permissions;
    the keys are the namespace's (bucket, request records, runtime limits)."""
    restricted = _user(client, "rates", DOCUMENTED_RULES)
    client.script_flush()
    limit = RateLimit(restricted, "acl-rate", "2/s", burst=2)
    first, second, third = (limit.reserve(f"r{i}") for i in range(3))
    assert first.granted and second.granted and third.granted
    assert first.delay == 0 and second.delay == 0 and third.delay > 0.3
    assert limit.reserve("r2").slot_ms == third.slot_ms  # the same slot
    refused = limit.reserve("r3", max_delay=0.1, cost=2)
    assert not refused.granted
    limit.settle("r0", 2)
    limit.settle("gone", 0, estimate=1)
    assert limit.pause(30).paused_for > 29
    assert limit.resume().paused_for == 0.0
    assert limit.usage().rate == Rate(2, 1.0)
    limit.reset()
    assert set_limits(restricted, "acl-rate", rate="1/s", burst=3).burst == 3
    assert pause_rate(restricted, "acl-rate", 10).paused_for > 9
    assert [s.name for s in list_rates(restricted)] == ["acl-rate"]
    assert resume_rate(restricted, "acl-rate").paused_for == 0.0
    assert describe_rate(restricted, "acl-rate").rate == Rate(1, 1.0)
    assert clear_limits(restricted, "acl-rate").rate is None
    assert all(key.startswith(b"redislock:{acl-rate}:") for key in client.keys("*"))


def test_rate_limits_without_hmget_name_it(client: redis.Redis) -> None:
    restricted = _user(client, "nohmget", [r for r in DOCUMENTED_RULES if r != "+hmget"])
    with pytest.raises(LockBackendError, match=r"rate limit 'acl-rate'.*\+hmget"):
        RateLimit(restricted, "acl-rate", "2/s").reserve("r0")


def test_a_missing_permission_is_named(client: redis.Redis) -> None:
    without_zadd = _user(client, "nozadd", [r for r in DOCUMENTED_RULES if r != "+zadd"])
    with pytest.raises(LockBackendError, match=r"lock 'acl'.*lacks the permission \+zadd"):
        Lock(without_zadd, "acl", ttl=5).acquire(blocking=False)
    without_keys = _user(client, "nokeys", [r for r in DOCUMENTED_RULES if not r.startswith("~")])
    with pytest.raises(LockBackendError, match=r"lock 'acl'.*no permissions to access one of"):
        Lock(without_keys, "acl", ttl=5).acquire(blocking=False)
