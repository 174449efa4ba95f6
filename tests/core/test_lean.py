"""The lean layout's fast path (lua/lean_*.lua, core/layout.py): a plain mutex's lease in its meta
hash alone, the general path seeing it (promote), and the namespace's switch."""

from __future__ import annotations

import json
import threading

import pytest
import redis
from helpers import wait_for

from celery_redislock import Lock, LockNotAcquired
from celery_redislock.core import layout
from celery_redislock.core.admin import pause_lock, resume_lock
from celery_redislock.core.claims import ClaimKind, claim
from celery_redislock.core.protocol import (
    AcquireArgs,
    AcquireReply,
    AcquireStatus,
    ReleaseClaimReply,
)
from celery_redislock.core.scripts import run

NS = "lean"


@pytest.fixture
def lean(client: redis.Redis) -> redis.Redis:
    layout.set_layout(client, NS, "lean")
    return client


def _commands(client: redis.Redis) -> dict[str, int]:
    return {
        key.removeprefix("cmdstat_"): int(value["calls"])
        for key, value in client.info("commandstats").items()
        if not key.startswith(("cmdstat_info", "cmdstat_config"))
    }


def _lock(client: redis.Redis, name: str = "job", **options: object) -> Lock:
    return Lock(client, name, ttl=30, namespace=NS, **options)  # type: ignore[arg-type]


def test_an_uncontended_pair_runs_eight_commands_on_two_keys(lean: redis.Redis) -> None:
    lock = _lock(lean)
    lock.acquire().release()  # (scripts loaded, the layout read, the key's life set)
    lean.config_resetstat()
    lock.acquire(info={"task_id": "t-1"}).release()
    assert _commands(lean) == {"evalsha": 2, "time": 2, "hmget": 2, "hset": 2}
    assert lean.exists(lock.keys.leases) == 0  # nothing but the meta hash
    assert lean.hget(lock.keys.meta, "L") == b""


def test_fences_grow_and_survive_the_loss_of_the_mark(lean: redis.Redis) -> None:
    lock = _lock(lean)
    fences = []
    for _ in range(3):
        lease = lock.acquire()
        fences.append(lease.fence)
        lease.release()
    lean.delete(lock.keys.meta)  # a restart without persistence: the mark is gone
    fences.append(lock.acquire().fence)
    assert fences == sorted(set(fences))


def test_the_general_path_sees_a_lean_lease_and_takes_it_over(lean: redis.Redis) -> None:
    lock = _lock(lean)
    lease = lock.acquire(info={"task_id": "t-1"})
    assert lean.hget(lock.keys.meta, "L")
    # A fair caller of the same name runs the general path: the lean lease is moved, not missed.
    with pytest.raises(LockNotAcquired):
        _lock(lean, fair=True).acquire(blocking=False)
    assert lean.hget(lock.keys.meta, "L") == b""
    assert lean.zscore(lock.keys.leases, lease.token) is not None
    (holder,) = lock.holders()
    assert holder.token == lease.token and holder.info["task_id"] == "t-1"
    lease.renew()  # renewed and released on the general path now
    lease.release()
    assert lock.holders() == []
    # Free again: the fast path takes it once the general path has tidied up.
    lean.config_resetstat()
    lock.acquire().release()
    assert "zadd" not in _commands(lean)


def test_reentry_counts_once_per_call_and_once_refuses(lean: redis.Redis) -> None:
    lock = _lock(lean)
    outer = lock.acquire(owner="task-1")
    inner = lock.acquire(owner="task-1")
    assert inner.token == outer.token and inner.fence == outer.fence
    with pytest.raises(LockNotAcquired):
        lock.acquire(owner="task-1", reentrant=False, blocking=False)
    with pytest.raises(LockNotAcquired):
        lock.acquire(owner="task-2", blocking=False)
    inner.release()
    with pytest.raises(LockNotAcquired):  # still held once
        lock.acquire(owner="task-2", blocking=False)
    outer.release()
    lock.acquire(owner="task-2", blocking=False).release()


def test_holders_renewal_and_a_waiter_woken_by_the_release(lean: redis.Redis) -> None:
    lock = _lock(lean)
    lease = lock.acquire(info={"task_id": "t-1"})
    (holder,) = lock.holders()
    assert holder.token == lease.token and holder.fence == lease.fence
    before = lean.pttl(lock.keys.meta)
    lease.renew(ttl=60)
    assert lean.hget(lock.keys.meta, "L").split(b"|")[0] == lease.token.encode()
    assert lean.pttl(lock.keys.meta) >= min(before, 60_000)
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=60).fence))
    waiter.start()
    # The waiter is refused once (its deadline 'Q' set), then blocks on the wake list.
    wait_for(lambda: lean.hget(lock.keys.meta, "Q"), "the waiter refused once", 30)
    lease.release()
    waiter.join(60)
    assert got and got[0] > lease.fence


@pytest.mark.parametrize("how", ["release_where", "force_release"])
def test_a_release_on_the_general_path_wakes_a_waiter_refused_on_the_fast_path(
    lean: redis.Redis, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A lean lease freed by a general-path script (release_where, an operator's release): the
    waiter refused on the fast path has no place in line; the release wakes it all the same."""
    from celery_redislock.core import admin, lock_base

    # The waiter's own look again pushed out to 120 s: only the release's wake-up is in time.
    monkeypatch.setattr(lock_base, "_WAIT_SLICE_S", 120.0)
    lease = _lock(lean).acquire(info={"task_id": "t-1"})
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(_lock(lean).acquire(timeout=90).fence))
    waiter.start()
    wait_for(lambda: lean.hget(_lock(lean).keys.meta, "Q"), "the waiter refused once", 30)
    if how == "release_where":
        assert _lock(lean).release_where(task_id="t-1") == [lease.token]
    else:
        assert admin.force_release(lean, "job", namespace=NS, everything=True).holders
    waiter.join(60)
    assert got and got[0] > lease.fence, "the waiter was not woken"


def test_a_pause_holds_back_the_fast_path(lean: redis.Redis) -> None:
    lock = _lock(lean)
    lease = lock.acquire()
    pause_lock(lean, "job", 60, namespace=NS)
    lease.release()  # a holder may release during a pause
    with pytest.raises(LockNotAcquired):
        lock.acquire(blocking=False)
    resume_lock(lean, "job", namespace=NS)
    lock.acquire(blocking=False).release()


def test_switching_back_to_shared_keeps_lean_leases_seen(lean: redis.Redis) -> None:
    lock = _lock(lean)
    lease = lock.acquire()
    layout.set_layout(lean, NS, "shared")
    lean.config_resetstat()
    with pytest.raises(LockNotAcquired):
        _lock(lean).acquire(blocking=False)  # the general path, which moved the lease
    lease.release()
    _lock(lean).acquire(blocking=False).release()


def test_a_lean_lease_is_listed_and_described(lean: redis.Redis) -> None:
    from celery_redislock.core import admin

    lease = _lock(lean, "sync:1").acquire(info={"task_id": "t-1"})
    _lock(lean, "idle").acquire().release()  # (its meta key stays: listed, then not held)
    assert sorted(admin.iter_locks(lean, NS)) == ["idle", "sync:1"]
    (state,) = admin.list_locks(lean, namespace=NS)
    assert state.name == "sync:1" and [h.token for h in state.holders] == [lease.token]
    lease.release()


def test_a_caller_blocked_on_the_fast_path_is_shown(lean: redis.Redis) -> None:
    """A refused waiter has no place in line: what `redislock list`, `show` and the web view
    show of it is its deadline, as the latest of its lock's blocked callers."""
    from celery_redislock.core import admin
    from celery_redislock.core.admin import render
    from celery_redislock.web import snapshot

    lease = _lock(lean, "busy").acquire()
    state = admin.describe_lock(lean, "busy", namespace=NS)
    assert state.blocked_for is None and not state.waited_for
    waiter = threading.Thread(target=lambda: _lock(lean, "busy").acquire(timeout=60).release())
    waiter.start()
    wait_for(lambda: lean.hget(_lock(lean, "busy").keys.meta, "Q"), "the waiter refused once")
    state = admin.describe_lock(lean, "busy", namespace=NS)
    assert state.waiters == [] and state.blocked_for is not None and 0 < state.blocked_for <= 60
    assert [s.name for s in admin.list_locks(lean, namespace=NS)] == ["busy"]
    assert render.lock_row(state)[4] == "0+"
    assert render.lock_lines(state)[-1].startswith("  callers blocked on the fast path")
    assert render.lock_dict(state, detail=True)["blocked_for"] == round(state.blocked_for, 3)
    assert snapshot._lock_row(lean, NS, "busy")["blocked_for"] is not None
    lease.release()
    waiter.join(60)
    assert not waiter.is_alive()
    lean.hdel(_lock(lean, "busy").keys.meta, "Q")  # (its deadline stays until it passes)
    assert not admin.describe_lock(lean, "busy", namespace=NS).waited_for


def test_the_cli_shows_and_sets_the_layout(client: redis.Redis) -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = Path(sys.executable).parent / "redislock"
    url = client.connection_pool.connection_kwargs
    target = f"redis://{url['host']}:{url['port']}"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(script), "--url", target, "--namespace", NS, "layout", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert cli().stdout == f"{NS}: shared\n"
    assert cli("lean").stdout == f"{NS}: lean\n"
    assert layout.read_layout(client, NS) == "lean"
    assert cli("shared").stdout == f"{NS}: shared\n"
    assert json.loads(cli("--json").stdout) == {"namespace": NS, "layout": "shared"}
    refused = cli("fast")
    assert refused.returncode == 2 and "'lean', 'shared'" in refused.stderr


def test_the_asyncio_lock_takes_the_fast_path_and_meets_the_synchronous_one(
    lean: redis.Redis,
) -> None:
    """The asyncio lock's pair is the synchronous one's eight commands; each sees the other's
    lease, and a waiter of one is woken by the other's release."""
    import asyncio

    import redis.asyncio

    from celery_redislock.asyncio import AsyncLock

    url = lean.connection_pool.connection_kwargs

    async def main() -> None:
        client = redis.asyncio.Redis(host=url["host"], port=url["port"])
        alock = AsyncLock(client, "job", ttl=30, namespace=NS)
        await (await alock.acquire()).release()  # (scripts loaded, the layout read)
        lean.config_resetstat()
        await (await alock.acquire(info={"task_id": "t-1"})).release()
        assert _commands(lean) == {"evalsha": 2, "time": 2, "hmget": 2, "hset": 2}

        lease = _lock(lean).acquire()
        with pytest.raises(LockNotAcquired):
            await alock.acquire(blocking=False)
        waiting = asyncio.create_task(alock.acquire(timeout=60))
        async with asyncio.timeout(60):  # refused once ('Q' set): it blocks on the wake list
            while not lean.hget(_lock(lean).keys.meta, "Q"):
                await asyncio.sleep(0.01)
        lease.release()
        got = await waiting
        assert got.fence > lease.fence and lean.hget(_lock(lean).keys.meta, "L")
        with pytest.raises(LockNotAcquired):
            _lock(lean).acquire(blocking=False)
        await got.release()
        await client.aclose()

    asyncio.run(main())


# -- a unique run's claim ends with its lease (AcquireArgs.give_up) ------------------------------


def _claimed(client: redis.Redis, lock: Lock, task_id: str, running_counts: bool = True) -> None:
    claim(
        client,
        NS,
        lock.name,
        task_id=task_id,
        lifetime=60,
        kind=ClaimKind.NEW,
        running_counts=running_counts,
    )


def test_a_unique_run_gives_its_claim_up_in_the_acquire_itself(lean: redis.Redis) -> None:
    lock = _lock(lean)
    _claimed(lean, lock, "t-0")  # (scripts loaded, the layout read)
    lock.acquire_giving_up("g", False, None, owner="t-0", info=None, job=None)[0].release()
    _claimed(lean, lock, "t-1")
    lean.config_resetstat()
    lease, ended = lock.acquire_giving_up(
        "g", False, None, owner="t-1", info={"task_id": "t-1"}, job=None
    )
    # One script call: the lease and the claim's end (GET, SISMEMBER, DEL) together (the
    # meta key outlives the lease already: no PEXPIRE).
    assert _commands(lean) == {
        "evalsha": 1,
        "time": 1,
        "hmget": 1,
        "get": 1,
        "sismember": 1,
        "del": 1,
        "hset": 1,
    }
    assert ended is not None and ended.superseded_by is None
    assert lean.exists(lock.keys.queued) == 0
    lease.release()


def test_a_replaced_copy_hears_it_from_its_acquire(lean: redis.Redis) -> None:
    lock = _lock(lean)
    _claimed(lean, lock, "old")
    claim(
        lean, NS, lock.name, task_id="new", lifetime=60, kind=ClaimKind.REPLACE, running_counts=True
    )
    lease, ended = lock.acquire_giving_up("g", False, None, owner="old", info=None, job=None)
    assert ended is not None and ended.superseded_by == "new"
    assert lean.get(lock.keys.queued) == b"new"  # the newer copy's claim stands
    lease.release()


def test_a_period_starts_with_the_lease_and_a_lost_reply_counts_once(lean: redis.Redis) -> None:
    lock = _lock(lean)
    _claimed(lean, lock, "t-1")
    args = AcquireArgs(
        token="a" * 32,
        spec=lock.spec,
        wait=False,
        info="{}",
        once=True,
        owner="t-1",
        give_up="s60000",
    ).encode()
    keys = [lock.keys.meta, lock.keys.queued, lock.keys.replaced]
    first = AcquireReply.decode(run("lean_acquire", lean, keys, args))
    again = AcquireReply.decode(run("lean_acquire", lean, keys, args))  # (its reply was lost)
    assert first.status is again.status is AcquireStatus.HELD
    assert first.gave_up == again.gave_up == ReleaseClaimReply(None)
    assert (first.token, first.fence) == (again.token, again.fence)
    assert lean.get(lock.keys.queued) == b"!t-1"
    assert 59_000 < lean.pttl(lock.keys.queued) <= 60_000


def test_a_refused_acquire_leaves_the_claim_alone(lean: redis.Redis) -> None:
    lock = _lock(lean)
    held = lock.acquire(owner="other")
    _claimed(lean, lock, "t-1", running_counts=False)  # (until_started: queued behind it)
    with pytest.raises(LockNotAcquired):
        lock.acquire_giving_up("g", False, None, owner="t-1", info=None, job=None)
    assert lean.get(lock.keys.queued) == b"t-1"
    held.release()


@pytest.mark.parametrize("where", ["shared layout", "fair lock", "a job"])
def test_off_the_fast_path_the_claim_is_left_to_the_caller(client: redis.Redis, where: str) -> None:
    if where != "shared layout":
        layout.set_layout(client, NS, "lean")
    lock = _lock(client, fair=True) if where == "fair lock" else _lock(client)
    _claimed(client, lock, "t-1")
    job = "t-1.0" if where == "a job" else None
    lease, ended = lock.acquire_giving_up("g", False, None, owner="t-1", info=None, job=job)
    assert ended is None
    assert client.get(lock.keys.queued) == b"t-1"  # untouched: the run ends it by itself
    lease.release()
