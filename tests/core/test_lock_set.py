"""Several locks taken all or nothing (``acquire_all``, ``lock=`` as a list): a lease in each or
in none, nothing written for a refused call, waits, owners, finished jobs, lost replies, sets
that cannot be taken at once, overlapping sets under contention, and the declarations."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import redis
from faultproxy import FaultProxy
from helpers import free_port, wait_for
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redislock import JobFinished, LockConfigError, LockNotAcquired
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.admin import set_limits
from celery_redislock.core.line import Parked, park
from celery_redislock.core.lock import Lock
from celery_redislock.core.lock_set import acquire_all, check_lock_set
from celery_redislock.core.options import call_signature, parse_lock_option
from celery_redislock.core.protocol import AcquireAllArgs, AcquireAllReply, AcquireAllStatus
from celery_redislock.core.redlock import RedLock
from celery_redislock.core.scripts import run, script


def lock(client: redis.Redis, name: str, **options: object) -> Lock:
    return Lock(client, name, ttl=30, **options)  # type: ignore[arg-type]


def tokens(lk: Lock) -> set[str]:
    return {h.token for h in lk.holders()}


def script_calls(client: redis.Redis) -> int:
    """The scripts Redis ran since the last CONFIG RESETSTAT."""
    stats = client.info("commandstats")
    return sum(
        int(v["calls"]) for k, v in stats.items() if k.startswith(("cmdstat_eval", "cmdstat_fcall"))
    )


def test_a_free_set_is_taken_in_every_lock_with_fences(client: redis.Redis) -> None:
    a, b = lock(client, "tenant:a"), lock(client, "api", limit=3)
    first = lock(client, "api", limit=3).acquire()
    leases = acquire_all([a, b])
    assert [lease.name for lease in leases] == ["tenant:a", "api"]
    assert leases[0].token != leases[1].token  # (a lease is known by its token)
    assert leases[1].fence > first.fence
    assert tokens(a) == {leases[0].token} and tokens(b) == {first.token, leases[1].token}
    for lease in leases:
        lease.release()
    assert tokens(a) == set() and tokens(b) == {first.token}


def test_a_full_lock_refuses_the_set_and_nothing_is_written_in_the_others(
    client: redis.Redis,
) -> None:
    a, b = lock(client, "tenant:a"), lock(client, "api")
    held = b.acquire()
    with pytest.raises(LockNotAcquired) as refused:
        acquire_all([a, b], blocking=False)
    assert refused.value.name == "api"  # the error names the lock with no room
    assert client.keys("*tenant:a*") == []  # the free lock was not touched at all
    held.release()
    assert len(acquire_all([a, b], blocking=False)) == 2


def test_caps_per_tenant_and_shared(client: redis.Redis) -> None:
    """A tenant's cap of 1 and a shared cap of 2: each refuses on its own, naming itself."""
    shared = lock(client, "all", limit=2)

    def take(tenant: str) -> list[object]:
        return acquire_all([lock(client, f"t:{tenant}"), shared], blocking=False)  # type: ignore[return-value]

    take("a")
    with pytest.raises(LockNotAcquired) as same_tenant:
        take("a")
    assert same_tenant.value.name == "t:a"
    take("b")
    with pytest.raises(LockNotAcquired) as full:
        take("c")
    assert full.value.name == "all"
    assert lock(client, "t:c").holders() == []


def test_a_cap_set_at_runtime_and_readers_and_writers_count(client: redis.Redis) -> None:
    shared = lock(client, "all", limit=5)
    set_limits(client, "all", cap=1)
    acquire_all([lock(client, "t:a"), shared], blocking=False)
    with pytest.raises(LockNotAcquired):
        acquire_all([lock(client, "t:b"), shared], blocking=False)
    # Readers share, a writer excludes them.
    r1, r2 = lock(client, "doc", mode="read"), lock(client, "x")
    acquire_all([r1, r2], blocking=False)
    acquire_all([r1, lock(client, "y")], blocking=False)
    with pytest.raises(LockNotAcquired) as writer:
        acquire_all([lock(client, "z"), lock(client, "doc")], blocking=False)
    assert writer.value.name == "doc"


def test_a_lock_handed_to_a_parked_task_is_not_taken(client: redis.Redis) -> None:
    a, b = lock(client, "a"), lock(client, "b")
    held = b.acquire()
    place = park(b, "payload", token="Lparked", owner="job-1", info={})
    assert isinstance(place, Parked)  # behind the holder
    held.release()  # handed to the parked task
    with pytest.raises(LockNotAcquired):
        acquire_all([a, b], blocking=False)
    assert a.holders() == []


def test_a_blocking_set_is_taken_once_the_last_lock_frees(client: redis.Redis) -> None:
    a, b = lock(client, "a"), lock(client, "b")
    held_a, held_b = a.acquire(), b.acquire()
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(acquire_all([a, b], timeout=20)))
    waiter.start()
    held_a.release()
    # The waiter asks again with a free (a script run Redis counts after the release): it must
    # still hold nothing.
    client.config_resetstat()
    wait_for(lambda: script_calls(client) >= 1, "the waiter asked again", 30)
    assert tokens(a) == set()
    held_b.release()
    waiter.join(25)
    assert len(got) == 1 and len(got[0]) == 2  # type: ignore[arg-type]


def test_a_blocking_set_gives_up_after_its_timeout_holding_nothing(client: redis.Redis) -> None:
    a, b = lock(client, "a"), lock(client, "b")
    b.acquire()
    started = time.monotonic()
    with pytest.raises(LockNotAcquired, match=r"gave up after 0\.3s"):
        acquire_all([a, b], timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 5
    assert a.holders() == []


def test_an_owner_holding_one_of_the_locks_is_told_so(client: redis.Redis) -> None:
    a, b = lock(client, "a"), lock(client, "b", limit=2)
    b.acquire(owner="job-1", reentrant=False)
    with pytest.raises(LockNotAcquired) as refused:
        acquire_all([a, b], owner="job-1", reentrant=False)
    assert refused.value.name == "b" and refused.value.owner_expires_in is not None
    assert 29 < refused.value.owner_expires_in <= 30
    assert a.holders() == []
    with pytest.raises(LockConfigError, match="not re-entrant"):
        acquire_all([a, b], owner="job-2")


def test_a_finished_job_is_not_taken_again(client: redis.Redis) -> None:
    a, b = lock(client, "a"), lock(client, "b")
    leases = acquire_all([a, b], owner="job-1", reentrant=False, job="job-1")
    leases[0].release(finish_job="job-1", keep=60)
    leases[1].release()
    with pytest.raises(JobFinished):
        acquire_all([a, b], owner="job-1", reentrant=False, job="job-1")
    assert a.holders() == [] and b.holders() == []


def test_the_same_call_run_again_answers_its_leases_or_gives_up_a_part_gone(
    client: redis.Redis,
) -> None:
    a, b = lock(client, "a"), lock(client, "b")
    keys = [*a.encoded_keys, *b.encoded_keys]
    args = AcquireAllArgs(tokens=["t1", "t2"], specs=[a.spec, b.spec], info="{}").encode()
    once = AcquireAllReply.decode(run("acquire_all", client, keys, args))
    again = AcquireAllReply.decode(run("acquire_all", client, keys, args))
    assert once.status is AcquireAllStatus.HELD and again == once
    assert tokens(a) == {"t1"} and tokens(b) == {"t2"}
    b.release_tokens(["t2"])  # gone by hand between the two runs
    gone = AcquireAllReply.decode(run("acquire_all", client, keys, args))
    assert gone.status is AcquireAllStatus.PART_GONE and gone.at == 1


@pytest.fixture
def proxy(redis_server: RedisServer, client: redis.Redis) -> Iterator[FaultProxy]:
    client.script_load(script("acquire_all").script)  # (a NOSCRIPT would be among what is lost)
    client.script_load(script("release").script)
    with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        yield proxy


@pytest.mark.faults
@pytest.mark.parametrize("retries", [0, 1])
def test_a_lost_reply_leaves_all_or_nothing(
    client: redis.Redis, proxy: FaultProxy, retries: int
) -> None:
    through = redis.Redis.from_url(proxy.url, socket_timeout=0.5, retry=Retry(NoBackoff(), retries))
    through.ping()
    a, b = lock(through, "a"), lock(through, "b")
    proxy.drop_replies(1, command="EVALSHA")
    try:
        leases = acquire_all([a, b])
    except Exception:
        assert retries == 0  # not retried: an error, and what the script made is given back
        assert lock(client, "a").holders() == [] and lock(client, "b").holders() == []
    else:
        assert retries == 1  # retried: the same leases, once each
        assert [len(lock(client, n).holders()) for n in "ab"] == [1, 1]
        assert tokens(lock(client, "a")) == {leases[0].token}
    through.close()


def test_sets_that_cannot_be_taken_at_once_are_refused(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    a = lock(client, "a")
    with pytest.raises(LockConfigError, match="at least two"):
        check_lock_set([a])
    with pytest.raises(LockConfigError, match="differ by name"):
        check_lock_set([a, lock(client, "a")])
    # The arguments are checked as Lock.acquire checks them, before anything is sent.
    pair = [a, lock(client, "b")]
    with pytest.raises(LockConfigError, match="job must be None or a non-empty string"):
        acquire_all(pair, job="two words")
    with pytest.raises(LockConfigError, match="timeout makes no sense"):
        acquire_all(pair, blocking=False, timeout=1)
    other = redis.Redis.from_url(redis_server.url)
    with pytest.raises(LockConfigError, match="share one Redis client"):
        check_lock_set([a, lock(other, "b")])
    other.close()
    # (Refused before any call: nothing need listen at the masters' ports.)
    masters = [redis.Redis(port=free_port()) for _ in range(3)]
    quorum = [RedLock(masters, n, ttl=5) for n in "ab"]  # type: ignore[arg-type]
    with pytest.raises(LockConfigError, match="RedLock"):
        acquire_all(quorum)
    assert client.keys("*") == []


def test_overlapping_sets_never_overlap_holders_nor_deadlock(client: redis.Redis) -> None:
    """Threads take random sets of 2 or 3 of 4 mutexes, in random orders, waiting: each mutex
    has one holder at a time, and every thread gets through."""
    names = ["m1", "m2", "m3", "m4"]
    inside: Counter[str] = Counter()
    worst: Counter[str] = Counter()
    guard = threading.Lock()
    done: list[int] = []
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        own = redis.Redis(connection_pool=client.connection_pool)
        try:
            for _ in range(15):
                picked = rnd.sample(names, rnd.choice([2, 3]))
                leases = acquire_all([lock(own, n) for n in picked], timeout=30)
                with guard:
                    inside.update(picked)
                    worst.update({n: 0 for n in picked})
                    for n in picked:
                        worst[n] = max(worst[n], inside[n])
                time.sleep(rnd.uniform(0, 0.003))
                with guard:
                    inside.subtract(picked)
                for lease in leases:
                    lease.release()
            done.append(seed)
        except BaseException as exc:  # (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and sorted(done) == list(range(6))
    assert set(worst.values()) == {1}


# -- the task option ---------------------------------------------------------------------------


def sync(tenant: str, order: int) -> None: ...


SIGNATURE = call_signature(sync, bound=False)


def test_lock_as_a_list_is_the_first_lock_with_the_others() -> None:
    options = parse_lock_option(
        "sync",
        SIGNATURE,
        [
            {"key": "t:{tenant}", "on_conflict": "wait", "timeout": 5},
            {"key": "api", "limit": 10, "ttl": 60},
            "orders:{order}",
        ],
    )
    assert options is not None
    assert (options.key, options.on_conflict, options.timeout) == ("t:{tenant}", "wait", 5)
    assert [(o.key, o.limit, o.ttl) for o in options.also] == [
        ("api", 10, 60),
        ("orders:{order}", None, None),
    ]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (["t:{tenant}"], "two or more locks"),
        (["t:{tenant}", {"limit": 2}], "lock 2 of the list needs a 'key'"),
        (["t:{tenant}", {"key": "api", "on_conflict": "skip"}], "lock 2 of the list sets 'on_"),
        (["api", "api"], "must differ by key"),
        ([{"key": "t:{tenant}", "on_conflict": "queue"}, "api"], "cannot take on_conflict='q"),
        (["t:{tenant}", {"key": "api", "bogus": 1}], "unknown lock 2 option"),
        (["t:{tenant}", 7], "lock 2 must be a key template string or a dict"),
        (["t:{nope}", "api"], "names argument"),
    ],
)
def test_bad_lists_are_refused_at_declaration(value: object, says: str) -> None:
    with pytest.raises(LockConfigError, match=says):
        parse_lock_option("sync", SIGNATURE, value)  # type: ignore[arg-type]
