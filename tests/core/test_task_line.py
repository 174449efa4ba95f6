"""The task line in the core: tasks park as data when their lock is taken, and are handed the
lock (published again) in arrival order by whoever frees it; nothing parked is lost when a
publisher dies, and nothing handed over runs twice."""

from __future__ import annotations

import json
import time

import pytest
import redis
from helpers import wait_for

from celery_redislock import LineFull, Lock, LockConfigError, LockNotAcquired
from celery_redislock.core import admin
from celery_redislock.core.claims import ClaimKind, claim
from celery_redislock.core.handover import hand_over
from celery_redislock.core.line import (
    Handed,
    Parked,
    drop_hand_over,
    lines_key,
    park,
    sweep,
    sweep_lines,
)
from celery_redislock.core.protocol import ClaimStatus, Grant
from celery_redislock.errors import JobFinished


class Publisher:
    """Records what a lock hands over, in order (the integrations publish a message here)."""

    def __init__(self, fail: bool = False) -> None:
        self.handed: list[Handed] = []
        self.fail = fail

    def __call__(self, handed: Handed) -> None:
        if self.fail:
            raise ConnectionError("broker down")
        self.handed.append(handed)

    @property
    def payloads(self) -> list[str]:
        return [h.payload for h in self.handed]


def _lock(client: redis.Redis, publisher: Publisher, **kw: object) -> Lock:
    return Lock(client, "line-task", ttl=30, handover=publisher, **kw)  # type: ignore[arg-type]


def _parked(client: redis.Redis, lock: Lock) -> list[bytes]:
    return client.zrange(lock.keys.all[2], 0, -1)


def test_parked_tasks_are_handed_the_lock_in_arrival_order(client: redis.Redis) -> None:
    publisher = Publisher()
    lock = _lock(client, publisher)
    first = park(lock, "t0", owner="t0")
    assert not isinstance(first, Parked)  # free: taken at once
    places = [park(lock, f"t{i}", owner=f"t{i}") for i in range(1, 4)]
    assert [type(p) for p in places] == [Parked] * 3
    assert [p.parked for p in places if isinstance(p, Parked)] == [1, 2, 3]
    # A newcomer that would not park (skip, retry, raise) finds the lock taken, even when free
    # for a moment: the line goes first.
    first.release()
    assert publisher.payloads == ["t1"]
    with pytest.raises(LockNotAcquired):
        lock.acquire(blocking=False)
    # The task published for the hand-over claims its lease with its token.
    handed = places[0]
    assert isinstance(handed, Parked)
    lease = park(lock, "t1", token=handed.token, owner="t1")
    assert not isinstance(lease, Parked) and lease.token == handed.token
    now_ms = int(client.time()[0]) * 1000
    assert lease.expires_at_ms - now_ms > 25_000  # claimed for the full ttl
    lease.release()
    assert publisher.payloads == ["t1", "t2"]


def test_a_hand_over_delivered_twice_runs_once(client: redis.Redis) -> None:
    publisher = Publisher()
    lock = _lock(client, publisher)
    held = lock.acquire(owner="x")
    place = park(lock, "job", owner="task-1")
    assert isinstance(place, Parked)
    held.release()
    first = park(lock, "job", token=place.token, owner="task-1", job="task-1.L")
    assert not isinstance(first, Parked)
    # The same hand-over delivered again (published twice): refused as another copy holding it.
    with pytest.raises(LockNotAcquired) as refused:
        park(lock, "job", token=place.token, owner="task-1", job="task-1.L")
    assert refused.value.owner_expires_in is not None and refused.value.owner_expires_in > 20
    first.release(finish_job="task-1.L", keep=60)
    # Once the first finished, a late copy is dropped by its job's finish record.
    with pytest.raises(JobFinished):
        park(lock, "job", token=place.token, owner="task-1", job="task-1.L")


def test_a_publisher_that_fails_leaves_the_task_in_line_at_its_place(
    client: redis.Redis,
) -> None:
    failing = Publisher(fail=True)
    lock = _lock(client, failing)
    held = lock.acquire(owner="x")
    a = park(lock, "a", owner="a")
    b = park(lock, "b", owner="b")
    assert isinstance(a, Parked) and isinstance(b, Parked)
    held.release()  # handed to a; its publish fails: a is still the only copy, in meta
    meta = lock.keys.meta
    assert client.hexists(meta, f"p:{a.token}")
    # Its short lease lapses (simulated: the publish window is 10 s), then a sweep by a process
    # that can publish puts it back at the head of the line and hands it over.
    client.zadd(lock.keys.leases, {a.token: 1})
    publisher = Publisher()
    sweeper = _lock(client, publisher)
    reply = sweep(sweeper)
    assert publisher.payloads == ["a"]
    assert reply.parked == 1  # b still waits, behind a
    assert _parked(client, lock) == [b.token.encode()]
    assert not client.hexists(meta, f"p:{a.token}")  # confirmed: the broker has it now


def test_an_unconfirmed_hand_over_is_published_again_and_claimed_once(
    client: redis.Redis,
) -> None:
    publisher = Publisher()
    lock = _lock(client, publisher)
    held = lock.acquire(owner="x")
    place = park(lock, "a", owner="task-a")
    assert isinstance(place, Parked)
    # The hand-over is made but its publisher dies before confirming: run the release script
    # through a lock with no publisher (nothing is published, nothing confirmed).
    silent = Lock(client, "line-task", ttl=30)
    held.release()  # (through `lock`, which publishes: undo that to model the dead publisher)
    assert publisher.payloads == ["a"]
    client.delete(lock.keys.leases, lock.keys.meta, *lock.keys.all[2:])
    held = silent.acquire(owner="x")
    place = park(silent, "a", owner="task-a")
    assert isinstance(place, Parked)
    held.release()
    assert client.hexists(silent.keys.meta, f"p:{place.token}")  # not confirmed
    client.zadd(silent.keys.leases, {place.token: 1})  # its publish window passed
    again = Publisher()
    sweep(_lock(client, again))
    assert again.payloads == ["a"]
    # Both copies may arrive: the first claims the lease, the second is refused.
    got = park(silent, "a", token=place.token, owner="task-a")
    assert not isinstance(got, Parked)
    with pytest.raises(LockNotAcquired):
        park(silent, "a", token=place.token, owner="task-a")
    got.release()


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.mark.parametrize("newcomer", ["plain", "fair", "parks"])
def test_a_newcomer_never_overtakes_a_parked_task_back_at_the_head_of_the_line(
    client: redis.Redis, newcomer: str
) -> None:
    """The lock is free: the hand-over made to the parked task lapsed unconfirmed (its publish
    failed), and nothing else holds it. A newcomer still finds the task ahead of it: a plain or
    fair acquire is refused, a task that parks queues behind it, and the lock goes to it."""
    lock = _lock(client, Publisher(fail=True))
    held = lock.acquire(owner="x")
    a = park(lock, "a", owner="a")
    assert isinstance(a, Parked)
    held.release()  # handed to a; its publish fails: a's short lease is all that holds the lock
    assert client.hexists(lock.keys.meta, f"p:{a.token}")
    client.zadd(lock.keys.leases, {a.token: 1})  # its publish window passed, unconfirmed
    assert lock.holders() == []  # free
    publisher = Publisher()
    if newcomer == "parks":
        b = park(_lock(client, publisher), "b", owner="b")
        assert isinstance(b, Parked)  # behind a...
        assert _parked(client, lock) == [b.token.encode()]
    else:
        fresh = Lock(client, "line-task", ttl=30, fair=newcomer == "fair")
        with pytest.raises(LockNotAcquired):
            fresh.acquire(blocking=False)
        assert [h.token for h in lock.holders()] == []  # (a fair call handed a's turn on)
        sweep(_lock(client, publisher))
    assert publisher.payloads == ["a"]  # ...which is handed the lock first
    got = park(lock, "a", token=a.token, owner="a")
    assert not isinstance(got, Parked) and [h.token for h in lock.holders()] == [a.token]
    got.release()


def test_a_published_hand_over_waits_the_handover_window_for_its_task(
    client: redis.Redis,
) -> None:
    """Published and confirmed, a hand-over's lease waits ``handover_window`` for its task (not
    the 10 s it had until published, nor any other time); past it the lock goes to the next in
    line, and the task, coming late, joins the line again at its end."""
    publisher = Publisher()
    lock = _lock(client, publisher, handover_window=30)
    held = lock.acquire(owner="x")
    a = park(lock, "a", owner="a")
    b = park(lock, "b", owner="b")
    assert isinstance(a, Parked) and isinstance(b, Parked)
    before = _server_ms(client)
    held.release()
    after = _server_ms(client)
    assert publisher.payloads == ["a"]
    assert not client.hexists(lock.keys.meta, f"p:{a.token}")  # confirmed
    expiry = client.zscore(lock.keys.leases, a.token)
    assert expiry is not None and before + 30_000 <= expiry <= after + 30_000
    # Meanwhile nothing hands the lock on: b waits.
    assert sweep(lock).granted == () and publisher.payloads == ["a"]
    assert _parked(client, lock) == [b.token.encode()]
    # The window ends (its score moved to the past): the lock goes to b; a, published already,
    # is neither published again nor put back in line.
    client.zadd(lock.keys.leases, {a.token: 1})
    sweep(lock)
    assert publisher.payloads == ["a", "b"]
    assert _parked(client, lock) == []
    late = park(lock, "a", token=a.token, owner="a")
    assert isinstance(late, Parked) and late.parked == 1
    assert _parked(client, lock) == [a.token.encode()]


@pytest.mark.parametrize("selector", ["everything", "token", "task_id"])
def test_a_forced_release_hands_the_lock_to_the_line_as_a_release_does(
    client: redis.Redis, selector: str
) -> None:
    """An operator's release publishes the next parked task through the publisher it is given,
    as the holder's release would; without one (a command that knows no framework), the short
    lease handed over lapses at once, the task is back at the head of the line (no newcomer
    overtakes it) and the next sweep publishes it: not 10 s later, when the lease would lapse
    unpublished."""
    lock = _lock(client, Publisher())
    held = lock.acquire(owner="x", info={"task_id": "stuck"})
    a = park(lock, "a", owner="a")
    b = park(lock, "b", owner="b")
    assert isinstance(a, Parked) and isinstance(b, Parked)
    chosen = {"everything": True, "token": held.token, "task_id": "stuck"}[selector]
    freed = admin.force_release(client, "line-task", **{selector: chosen})  # type: ignore[arg-type]
    assert [h.token for h in freed.holders] == [held.token]
    assert lock.holders() == []  # a's hand-over lapsed at once...
    with pytest.raises(LockNotAcquired):
        Lock(client, "line-task", ttl=30).acquire(blocking=False)  # ...and a is still ahead
    assert _parked(client, lock) == [a.token.encode(), b.token.encode()]
    publisher = Publisher()
    sweep(_lock(client, publisher))
    assert publisher.payloads == ["a"]
    assert _parked(client, lock) == [b.token.encode()]
    # With a publisher (`celery redislock release`), the hand-over is published at once.
    got = park(lock, "a", token=a.token, owner="a", info={"task_id": "stuck-too"})
    assert not isinstance(got, Parked)
    direct = Publisher()
    chosen = {"everything": True, "token": a.token, "task_id": "stuck-too"}[selector]
    freed = admin.force_release(
        client,
        "line-task",
        handover=direct,
        handover_window=20,
        **{selector: chosen},  # type: ignore[arg-type]
    )
    assert [h.token for h in freed.holders] == [a.token]
    assert direct.payloads == ["b"]
    assert not client.hexists(lock.keys.meta, f"p:{b.token}")  # confirmed
    expiry = client.zscore(lock.keys.leases, b.token)
    assert expiry is not None and 15_000 < expiry - _server_ms(client) <= 20_000


def test_releasing_by_token_leaves_a_parked_tasks_place_in_line_alone(client: redis.Redis) -> None:
    """An operator's token may name a parked task whose hand-over lapsed back into line (it was
    a holder a moment before): only live leases are released, the task keeps its place and its
    payload (its only copy)."""
    lock = _lock(client, Publisher())
    held = lock.acquire(owner="x")
    a = park(lock, "a", owner="a")
    assert isinstance(a, Parked)
    assert lock.release_tokens([a.token]) == []
    assert _parked(client, lock) == [a.token.encode()]
    assert client.hexists(lock.keys.meta, f"p:{a.token}")
    assert lock.release_tokens([]) == []
    with pytest.raises(LockConfigError, match="tokens"):
        lock.release_tokens(held.token)
    assert lock.release_tokens([held.token, held.token]) == [held.token]
    assert [h.token for h in lock.holders()] == [a.token]  # handed on, as by a release


def test_lapsing_a_hand_over_nobody_publishes_is_safe_to_run_twice(client: redis.Redis) -> None:
    """A caller without a publisher lapses the hand-overs it made; run again (its reply lost),
    it leaves alone a later hand-over of the same entry, told apart by its fence."""
    lock = _lock(client, Publisher(fail=True))
    held = lock.acquire(owner="x")
    a = park(lock, "a", owner="a")
    assert isinstance(a, Parked)
    held.release()  # handed to a, unpublished
    [handed] = lock.holders()
    grant = Grant(token=a.token, fence=handed.fence, expires_at_ms=0)
    silent = Lock(client, "line-task", ttl=30)
    hand_over(silent, [grant])
    hand_over(silent, [grant])  # run twice: the same lapsed lease
    assert lock.holders() == []
    publisher = Publisher()
    sweep(_lock(client, publisher))  # handed to a again, published, confirmed
    assert publisher.payloads == ["a"]
    [again] = lock.holders()
    assert again.token == a.token and again.fence > handed.fence
    hand_over(silent, [grant])  # the first call, late: the new hand-over stands
    assert [(h.token, h.fence) for h in lock.holders()] == [(a.token, again.fence)]


def test_a_full_line_refuses_a_new_task(client: redis.Redis) -> None:
    lock = _lock(client, Publisher())
    held = lock.acquire()
    assert isinstance(park(lock, "a", owner="a", max_waiting=2), Parked)
    assert isinstance(park(lock, "b", owner="b", max_waiting=2), Parked)
    with pytest.raises(LineFull) as full:
        park(lock, "c", owner="c", max_waiting=2)
    assert full.value.parked == 2 and full.value.name == "line-task"
    held.release()


def test_a_parked_task_past_its_wait_is_published_as_expired(client: redis.Redis) -> None:
    publisher = Publisher()
    lock = _lock(client, publisher)
    held = lock.acquire()
    place = park(lock, "late", owner="a", max_wait=1)
    assert isinstance(place, Parked)
    wait_for(
        lambda: sweep(lock).expired == () and publisher.handed,
        "the expired task to be published",
        timeout=5,
    )
    assert publisher.handed == [Handed(token=place.token, payload="late", expired=True)]
    assert _parked(client, lock) == []
    assert not client.hexists(lock.keys.meta, f"p:{place.token}")
    held.release()
    assert len(publisher.handed) == 1  # not handed the lock as well


@pytest.mark.slow
def test_a_parked_task_nobody_sweeps_for_a_while_is_still_published_as_expired(
    client: redis.Redis,
) -> None:
    # No sweeper and no call on the lock for seconds after the task's wait ended (every worker
    # down): the line must still hold it when one comes back. The old line keys lived the wait
    # + 4 s, then the task's record was left with nothing pointing at it.
    publisher = Publisher()
    lock = _lock(client, publisher, fence_keep=60)
    held = lock.acquire()
    place = park(lock, "late", owner="a", max_wait=1)
    assert isinstance(place, Parked)
    parked_at = time.monotonic()
    while time.monotonic() < parked_at + 6.5:  # past the old keys' life; nothing may run
        time.sleep(0.1)
    assert _parked(client, lock) == [place.token.encode()]
    sweep(lock)
    assert publisher.handed == [Handed(token=place.token, payload="late", expired=True)]
    assert not client.hexists(lock.keys.meta, f"p:{place.token}")
    held.release()


def test_a_dead_holder_is_handed_on_by_the_sweep(client: redis.Redis) -> None:
    publisher = Publisher()
    lock = Lock(client, "line-dead", ttl=1, handover=publisher)
    lock.acquire(owner="dead")  # never released: its holder "died"
    place = park(lock, "next", owner="b")
    assert isinstance(place, Parked)
    wait_for(
        lambda: sweep_lines(client, "redislock", publisher) == 0 and publisher.handed,
        "the sweep to hand the lapsed lock on",
        timeout=5,
    )
    assert publisher.payloads == ["next"]
    got = park(lock, "next", token=place.token, owner="b")
    assert not isinstance(got, Parked)
    got.release()
    # Nothing held or parked any more: the next sweep forgets the lock.
    sweep_lines(client, "redislock", publisher)
    assert not client.hexists(lines_key("redislock"), "line-dead")


def test_readers_behind_a_parked_writer_wait_and_then_share(client: redis.Redis) -> None:
    publisher = Publisher()
    writer = Lock(client, "line-rw", ttl=30, handover=publisher)
    reader = Lock(client, "line-rw", ttl=30, mode="read", handover=publisher)
    r0 = reader.acquire()
    w = park(writer, "w", owner="w")
    r1 = park(reader, "r1", owner="r1")
    r2 = park(reader, "r2", owner="r2")
    assert all(isinstance(p, Parked) for p in (w, r1, r2))  # r1, r2 queue behind the writer
    r0.release()
    assert publisher.payloads == ["w"]
    assert isinstance(w, Parked)
    got = park(writer, "w", token=w.token, owner="w")
    assert not isinstance(got, Parked)
    got.release()
    assert publisher.payloads == ["w", "r1", "r2"]  # the readers together


def test_a_park_whose_reply_was_lost_leaves_no_entry(client: redis.Redis) -> None:
    lock = _lock(client, Publisher())
    held = lock.acquire()
    place = park(lock, "a", owner="a")
    assert isinstance(place, Parked)
    lock._abandon(place.token)  # what park() does after a LockBackendError
    assert _parked(client, lock) == []
    assert not client.hexists(lock.keys.meta, f"p:{place.token}")
    held.release()
    assert json.loads(client.hget(lock.keys.meta, "qp") or "0") == 0


def test_a_hand_over_whose_task_will_not_run_is_dropped_and_handed_on(
    client: redis.Redis,
) -> None:
    publisher = Publisher()
    lock = _lock(client, publisher)
    held = lock.acquire()
    a = park(lock, "a", owner="a")
    b = park(lock, "b", owner="b")
    c = park(lock, "c", owner="c")
    assert isinstance(a, Parked) and isinstance(b, Parked) and isinstance(c, Parked)
    held.release()
    assert publisher.payloads == ["a"]
    # a's message was revoked and discarded: its hand-over goes, b is handed the lock at once.
    assert drop_hand_over(lock, a.token)
    assert publisher.payloads == ["a", "b"]
    # b claimed it: dropping it now (a late revoke) leaves the running task alone.
    got = park(lock, "b", token=b.token, owner="b")
    assert not isinstance(got, Parked)
    assert not drop_hand_over(lock, b.token)
    assert [h.token for h in lock.holders()] == [b.token]
    # c, revoked while still in line, leaves it.
    assert drop_hand_over(lock, c.token)
    assert _parked(client, lock) == []
    got.release()
    assert publisher.payloads == ["a", "b"]


def test_the_line_is_refused_over_redlock_masters(client: redis.Redis) -> None:
    from celery_redislock.core.redlock import RedLock

    lock = RedLock([client, client.__class__(port=1), client.__class__(port=2)], "rl", ttl=5)
    with pytest.raises(LockConfigError, match="not available over RedLock masters"):
        park(lock, "x", owner="a")


def test_a_replaced_parked_copy_leaves_the_line_as_it_is_replaced(client: redis.Redis) -> None:
    """keep_last (a unique key that is its run lock's name): a copy replaced while parked leaves
    the line in the replacing call's claim, and a copy parked after it was replaced leaves it
    in its own claim as it parks; the release hands the lock to the newest alone, and a sweep
    hands the replaced ones on as replaced (to end unrun). Each step run twice changes nothing
    more (a lost reply)."""
    publisher = Publisher()
    lock = _lock(client, publisher)
    running = park(lock, "run", owner="run")
    assert not isinstance(running, Parked)

    def claimed(task: str, kind: ClaimKind, parked_as: str = "") -> ClaimStatus:
        found = claim(
            client,
            lock.namespace,
            lock.name,
            task_id=task,
            lifetime=60,
            kind=kind,
            running_counts=False,
            parked_as=parked_as,
        )
        return found.status

    def parked(task: str) -> str:
        place = park(lock, task, owner=task)
        assert isinstance(place, Parked)
        return place.token

    # t1 is published, delivered and parks (keeping its claim, noted as the key's parked copy).
    assert claimed("t1", ClaimKind.REPLACE) is ClaimStatus.CLAIMED
    t1 = parked("t1")
    for _ in range(2):
        assert claimed("t1", ClaimKind.REPUBLISH, t1) is ClaimStatus.CLAIMED
    assert _parked(client, lock) == [t1.encode()]
    # t2 replaces it: t1 leaves the line in the same step.
    assert claimed("t2", ClaimKind.REPLACE) is ClaimStatus.REPLACED
    assert _parked(client, lock) == []
    # t3 replaces t2 before t2 parks: t2 leaves the line as it parks, t3 stays.
    assert claimed("t3", ClaimKind.REPLACE) is ClaimStatus.REPLACED
    t2 = parked("t2")
    for _ in range(2):
        assert claimed("t2", ClaimKind.REPUBLISH, t2) is ClaimStatus.REPUBLISH_UNCLAIMED
    t3 = parked("t3")
    assert claimed("t3", ClaimKind.REPUBLISH, t3) is ClaimStatus.CLAIMED
    assert _parked(client, lock) == [t3.encode()]
    # The release hands the lock to the newest; a sweep hands on the replaced, as replaced.
    running.release()
    assert publisher.handed == [Handed(t3, "t3", expired=False, replaced=False)]
    reply = sweep(lock)
    assert reply.parked == 0
    ended = sorted(publisher.handed[1:])
    assert ended == sorted(
        [
            Handed(t1, "t1", expired=True, replaced=True),
            Handed(t2, "t2", expired=True, replaced=True),
        ]
    )
    assert sweep(lock).expired == ()  # confirmed: handed on once
    assert len(publisher.handed) == 3
