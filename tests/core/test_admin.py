"""The admin API (celery_redislock.core.admin) on a real Redis: what it shows of holders and
waiters, and that forced releases free exactly what they are asked to."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from helpers import free_port, wait_for, wait_until_queued
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redislock import Lease, Lock, LockBackendError, LockConfigError, LockLost, RateLimit
from celery_redislock.core import admin, lock_base
from celery_redislock.core.claims import ClaimKind, claim


@pytest.fixture
def waiter(client: redis.Redis) -> Iterator[tuple[Lock, list[Lease], threading.Thread]]:
    """A thread blocked on the lock ``job`` (held by the test), in line when the test starts;
    it records its lease when it gets one and releases it at the end."""
    lock = Lock(client, "job", ttl=30)
    got: list[Lease] = []
    thread = threading.Thread(
        target=lambda: got.append(lock.acquire(timeout=20, info={"task_id": "w-1"}))
    )
    yield lock, got, thread
    thread.join(25)
    for lease in got:
        lease.release()


def test_describe_lock_shows_holders_and_waiters(
    client: redis.Redis, waiter: tuple[Lock, list[Lease], threading.Thread]
) -> None:
    lock, got, thread = waiter
    lease = lock.acquire(info={"task_id": "t-1", "task": "proj.sync"})
    thread.start()
    wait_until_queued(client, lock)
    state = admin.describe_lock(client, "job")
    assert state.name == "job" and state.mode == "write"
    (holder,) = state.holders
    assert holder.token == lease.token and holder.fence == lease.fence
    assert holder.info["task_id"] == "t-1" and holder.info["task"] == "proj.sync"
    assert holder.info["pid"] == str(os.getpid()) and holder.info["host"]
    held_for = state.held_for(holder)
    assert held_for is not None and 0 <= held_for < 10
    assert state.expires_in is not None and 20 < state.expires_in <= 30
    (line,) = state.waiters
    assert line.position == 1 and line.mode == "write" and line.info["task_id"] == "w-1"
    assert line.info["pid"] == str(os.getpid())
    assert line.expires_in is not None and 0 < line.expires_in <= 4
    lease.release()
    thread.join(10)
    assert got


def test_list_locks_filters_by_pattern_and_liveness(client: redis.Redis) -> None:
    leases = [Lock(client, name, ttl=30).acquire() for name in ("a:1", "a:2", "b:1")]
    Lock(client, "a:3", ttl=30, namespace="other").acquire()
    lapsed = Lock(client, "a:4", ttl=0.1)
    lapsed.acquire()
    wait_for(lambda: not lapsed.holders(), "the lease lapsed")  # (its keys outlive it a while)
    assert [s.name for s in admin.list_locks(client, "a:*")] == ["a:1", "a:2"]
    assert [s.name for s in admin.list_locks(client)] == ["a:1", "a:2", "b:1"]
    assert admin.list_locks(client, "zz*") == []
    assert [s.name for s in admin.list_locks(client, namespace="other")] == ["a:3"]
    for lease in leases:
        lease.release()


def test_force_release_by_task_id_frees_only_that_task(client: redis.Redis) -> None:
    lock = Lock(client, "cap", ttl=30, limit=3)
    stuck = lock.acquire(info={"task_id": "t-1"})
    other = lock.acquire(info={"task_id": "t-2"})
    dry = admin.force_release(client, "cap", task_id="t-1", dry_run=True)
    assert dry.dry_run and [h.token for h in dry.holders] == [stuck.token]
    assert {h.token for h in lock.holders()} == {stuck.token, other.token}
    freed = admin.force_release(client, "cap", task_id="t-1")
    assert not freed.dry_run and [h.token for h in freed.holders] == [stuck.token]
    assert [h.token for h in lock.holders()] == [other.token]
    with pytest.raises(LockLost):
        stuck.renew()
    assert admin.force_release(client, "cap", task_id="t-1").holders == []
    other.release()


def test_force_release_by_token_and_all(client: redis.Redis) -> None:
    lock = Lock(client, "rw", ttl=30, mode="read")
    first, second, third = (lock.acquire(info={"task_id": f"t-{i}"}) for i in range(3))
    # Re-entered leases go whole.
    again = lock.acquire(owner="o", info={"task_id": "t-3"})
    lock.acquire(owner="o")
    freed = admin.force_release(client, "rw", token=again.token)
    assert [h.token for h in freed.holders] == [again.token] and freed.holders[0].count == 2
    assert admin.force_release(client, "rw", token="not-a-token").holders == []
    freed = admin.force_release(client, "rw", token=first.token)
    assert [h.token for h in freed.holders] == [first.token]
    freed = admin.force_release(client, "rw", everything=True, dry_run=True)
    assert {h.token for h in freed.holders} == {second.token, third.token}
    assert len(lock.holders()) == 2
    freed = admin.force_release(client, "rw", everything=True)
    assert {h.token for h in freed.holders} == {second.token, third.token}
    assert lock.holders() == []


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"token": "x", "task_id": "y"}, {"everything": True, "task_id": "y"}, {"token": ""}],
)
def test_force_release_needs_exactly_one_selector(
    client: redis.Redis, kwargs: dict[str, object]
) -> None:
    with pytest.raises(LockConfigError):
        admin.force_release(client, "job", **kwargs)  # type: ignore[arg-type]


def test_force_release_wakes_a_waiter(
    client: redis.Redis,
    waiter: tuple[Lock, list[Lease], threading.Thread],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lock, got, thread = waiter
    # The holder's lease lasts 240 s and the waiter's fallback look (every second) is pushed out
    # to 120 s: only the forced release's push can let it in before its 20 s run out, however
    # slow the machine.
    monkeypatch.setattr(lock_base, "_WAIT_SLICE_S", 120.0)
    monkeypatch.setattr(lock_base, "QUEUE_ENTRY_MS", 122_000)
    monkeypatch.setattr(lock_base, "WAKE_LIST_MS", 122_000)
    Lock(client, "job", ttl=240).acquire(info={"task_id": "t-1"})
    thread.start()
    wait_until_queued(client, lock)
    assert admin.force_release(client, "job", task_id="t-1").holders
    thread.join(25)
    assert got, "the forced release did not wake the waiter"
    assert [h.info["task_id"] for h in lock.holders()] == ["w-1"]


def _claim(client: redis.Redis, name: str, task_id: str) -> bool:
    found = claim(
        client,
        "redislock",
        name,
        task_id=task_id,
        lifetime=60,
        kind=ClaimKind.NEW,
        running_counts=False,
    )
    return not found.duplicate


def test_claims_listed_and_freed_only_for_their_holder(client: redis.Redis) -> None:
    assert _claim(client, "report:daily", "t-1") and _claim(client, "report:weekly", "t-2")
    assert _claim(client, "other", "t-3")
    listed = admin.list_claims(client, "report:*")
    assert [(c.name, c.task_id) for c in listed] == [
        ("report:daily", "t-1"),
        ("report:weekly", "t-2"),
    ]
    assert all(c.expires_in is not None and 50 < c.expires_in <= 60 for c in listed)
    assert admin.force_release_claim(client, "report:daily", task_id="t-9") is None
    dry = admin.force_release_claim(client, "report:daily", dry_run=True)
    assert dry is not None and dry.task_id == "t-1"
    assert not _claim(client, "report:daily", "t-4")  # still claimed: a duplicate
    freed = admin.force_release_claim(client, "report:daily", task_id="t-1")
    assert freed is not None and freed.task_id == "t-1"
    assert admin.force_release_claim(client, "report:daily") is None
    assert _claim(client, "report:daily", "t-4")  # free again: the next call is published
    assert [c.task_id for c in admin.list_claims(client, "report:*")] == ["t-4", "t-2"]


def test_unreachable_redis_is_a_backend_error_naming_it() -> None:
    # A closed port refuses at once; no client retries (redis-py's default backs off for
    # seconds between ten of them): the error comes from the first attempt.
    port = free_port()
    client = redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_connect_timeout=1,
        socket_timeout=1,
        retry=Retry(NoBackoff(), 0),
    )
    refused = rf"Redis failed: Error \d+ connecting to 127\.0\.0\.1:{port}\. Connection refused"
    calls: list[tuple[str | None, Callable[[], object]]] = [
        (None, lambda: admin.list_locks(client)),
        ("job", lambda: admin.describe_lock(client, "job")),
        (None, lambda: admin.list_claims(client)),
        ("job", lambda: admin.force_release(client, "job", everything=True)),
        ("report", lambda: admin.force_release_claim(client, "report")),
    ]
    for name, call in calls:
        with pytest.raises(LockBackendError, match=f"^lock {name!r}: {refused}") as caught:
            call()
        assert caught.value.name == name
        assert isinstance(caught.value.__cause__, redis.ConnectionError)


def test_bad_pattern_and_name_are_config_errors(client: redis.Redis) -> None:
    with pytest.raises(LockConfigError, match="pattern"):
        admin.list_locks(client, "")
    with pytest.raises(LockConfigError, match="name"):
        admin.describe_lock(client, "}x")


# -- rate limits: limits set at runtime, pauses ------------------------------------------------


def test_rate_limits_set_shown_listed_and_cleared(client: redis.Redis) -> None:
    from celery_redislock.core.rate import Rate, RateLimit

    assert admin.list_rates(client) == []
    state = admin.set_limits(client, "partner:api", rate="50/m", burst=5)
    assert state == admin.RateState("partner:api", Rate(50, 60.0), 5, 0.0)
    assert client.hgetall("redislock:{partner:api}:limits") == {
        b"rate": b"50 60000",
        b"burst": b"5",
    }
    # Each set alone keeps the other.
    assert admin.set_limits(client, "partner:api", burst=2).rate == Rate(50, 60.0)
    assert admin.set_limits(client, "partner:api", rate="1/s").burst == 2
    assert admin.describe_rate(client, "partner:api") == admin.RateState(
        "partner:api", Rate(1, 1.0), 2, 0.0
    )
    # The code's limits give way to them at the next call.
    assert RateLimit(client, "partner:api", "100/s").reserve("r").rate == Rate(1, 1.0)
    # A name with a bucket but nothing set at runtime and no pause is not listed.
    RateLimit(client, "plain", "1/s").reserve("r")
    admin.pause_rate(client, "paused:one", 60)
    assert [s.name for s in admin.list_rates(client)] == ["partner:api", "paused:one"]
    assert [s.name for s in admin.list_rates(client, "paused:*")] == ["paused:one"]
    cleared = admin.clear_limits(client, "partner:api")
    # (The slot reserved above keeps its bucket booked a second ahead: usage, not a limit.)
    assert cleared == admin.RateState("partner:api", None, None, 0.0, booked_for=cleared.booked_for)
    assert 0 < cleared.booked_for <= 1
    assert not client.exists("redislock:{partner:api}:limits")
    assert [s.name for s in admin.list_rates(client)] == ["paused:one"]


def test_rate_limits_in_another_namespace(client: redis.Redis) -> None:
    admin.set_limits(client, "api", burst=3, namespace="jobs")
    assert client.exists("jobs:{api}:limits") and not client.exists("redislock:{api}:limits")
    assert admin.list_rates(client) == []
    assert [s.burst for s in admin.list_rates(client, namespace="jobs")] == [3]


def test_a_rate_limit_paused_and_resumed(client: redis.Redis) -> None:
    from celery_redislock.core.rate import RateLimit

    limit = RateLimit(client, "api", "10/s")
    state = admin.pause_rate(client, "api", 30)
    assert state.rate is None and state.burst is None and 29 < state.paused_for <= 30
    got = limit.reserve("r")
    assert got.granted and 29 < got.delay <= 30  # the code's rate, after the pause
    assert admin.pause_rate(client, "api", 5).paused_for > 29  # a longer pause is kept
    assert admin.resume_rate(client, "api").paused_for == 0.0
    assert limit.usage().paused_for == 0.0
    assert admin.resume_rate(client, "api").paused_for == 0.0  # nothing to end: no error


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: admin.set_limits(c, "api", rate="fast"), "rate must be"),
        (lambda c: admin.set_limits(c, "api", burst=0), "burst must be an integer"),
        (lambda c: admin.set_limits(c, "api", rate="1/s", burst=1.5), "burst must be"),  # type: ignore[arg-type]
        (lambda c: admin.set_limits(c, "api"), "needs a rate, a burst or a cap"),
        (lambda c: admin.set_limits(c, "", rate="1/s"), "name must be"),
        (lambda c: admin.set_limits(c, "api", rate="1/s", namespace="a{b"), "namespace"),
        (lambda c: admin.clear_limits(c, ""), "name must be"),
        (lambda c: admin.pause_rate(c, "api", 0), "pause must be a number of seconds"),
        (lambda c: admin.pause_rate(c, "api", -1), "pause must be a number of seconds"),
        (lambda c: admin.pause_rate(c, "", 1), "name must be"),
        (lambda c: admin.resume_rate(c, "}x"), "must not start with '}'"),
        (lambda c: admin.describe_rate(c, ""), "name must be"),
        (lambda c: admin.list_rates(c, ""), "pattern must be"),
    ],
)
def test_bad_rate_admin_arguments_are_config_errors_and_write_nothing(
    client: redis.Redis, call: Callable[[redis.Redis], object], message: str
) -> None:
    with pytest.raises(LockConfigError, match=message):
        call(client)
    assert client.keys("*") == []


def test_rate_admin_with_redis_unreachable_is_a_backend_error() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    for call in (
        lambda: admin.set_limits(client, "api", rate="1/s"),
        lambda: admin.clear_limits(client, "api"),
        lambda: admin.pause_rate(client, "api", 1),
        lambda: admin.resume_rate(client, "api"),
        lambda: admin.describe_rate(client, "api"),
    ):
        with pytest.raises(LockBackendError) as info:
            call()
        assert info.value.name == "api"
    with pytest.raises(LockBackendError):
        admin.list_rates(client)


def test_describe_claim_reads_one_claim_and_writes_nothing(client: redis.Redis) -> None:
    assert admin.describe_claim(client, "report:daily") is None
    claim(
        client,
        "redislock",
        "report:daily",
        task_id="t-1",
        lifetime=60,
        kind=ClaimKind.NEW,
        running_counts=False,
    )
    before = client.pttl("redislock:{report:daily}:queued")
    state = admin.describe_claim(client, "report:daily")
    assert state is not None and (state.name, state.task_id, state.started) == (
        "report:daily",
        "t-1",
        False,
    )
    assert state.expires_in is not None and 55 < state.expires_in <= 60
    assert client.pttl("redislock:{report:daily}:queued") <= before  # not extended
    with pytest.raises(LockConfigError, match="name"):
        admin.describe_claim(client, "")


def test_a_rate_limits_usage_is_how_far_its_slots_are_booked(client: redis.Redis) -> None:
    """Five slots of a 2/s limit reach 2 s ahead, whatever rate the reader knows (the admin
    API reads the bucket without the code's rate)."""
    assert admin.describe_rate(client, "api").booked_for == 0
    api = RateLimit(client, "api", "2/s")
    began = time.monotonic()
    for i in range(5):
        api.reserve(f"r-{i}")
    asked = time.monotonic()
    booked = admin.describe_rate(client, "api").booked_for
    read = time.monotonic()
    # 2.5 s from the first reservation, less the time taken since (however long: the bound
    # is measured, not guessed); 2 ms for the rounding to milliseconds.
    assert 2.5 - (read - began) - 0.002 <= booked <= 2.5
    later = api.usage().booked_for
    # The same bucket, read later: by the time from the first read's call (the server read its
    # clock somewhere in it) to the end of the second.
    assert 0 <= booked - later <= time.monotonic() - asked + 0.002
