"""Model-based test: random acquire/release/renew/expiry sequences against a plain-Python model.

Every lock kind (mutex, cap of 3 writers, read/write; each plain and fair) is driven by a
Hypothesis state machine through the public API on a real Redis. After every step the live
leases Redis reports must equal the model's, and the raw keys must be exactly what the scripts
promise. Expiry is made deterministic by moving a lease's expiry score into the past, which the
scripts cannot tell from natural expiry; one plain test shows natural expiry with a real sleep.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
import redis
from conftest import wait_for
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from celery_redislock import (
    Lease,
    Lock,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    LockUpgradeError,
    Mode,
)
from celery_redislock.contrib.redis_server import RedisServer

TTL = 30.0  # long enough that nothing lapses by accident while an example runs
GRACE_MS = 1000  # _time.lua: how long the lock's keys outlive the last lease
KEEP_S = 2.0  # how long the fence mark outlives the lock's last use (Lock(fence_keep=...))
OWNERS = (None, "alice", "b|1|2|ob")  # a tiny pool, so owners re-enter; one with the separator
RENEW_TTLS = (None, 1.0, 60.0)  # shorter than the lease (no change), the default, longer
TOKEN_FIELD = re.compile(r"[a-z]:[0-9a-f]{32}")  # a per-lease field of the meta hash

SETTINGS = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@dataclass(frozen=True)
class Kind:
    """One way of using a lock name: the modes its callers take and the write limit."""

    label: str
    modes: tuple[Mode, ...]
    limit: int | None

    def capacity(self, mode: Mode) -> int | None:
        """How many leases of ``mode`` may be live at once (None: unbounded)."""
        return None if mode == "read" else (self.limit or 1)


KINDS = (
    Kind("mutex", ("write",), None),
    Kind("cap3", ("write",), 3),
    Kind("rw", ("read", "write"), None),
)


@dataclass
class Held:
    """The model's view of one live lease."""

    mode: Mode
    owner: str | None
    fence: int
    info: str
    count: int = 1
    handles: list[Lease] = field(default_factory=list)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


class LockModel(RuleBasedStateMachine):
    """Drives one fresh lock name per example; the subclass made per test sets the class vars."""

    client: ClassVar[redis.Redis]
    kind: ClassVar[Kind]
    fair: ClassVar[bool]

    def __init__(self) -> None:
        super().__init__()
        self.name = f"model-{uuid.uuid4().hex[:12]}"
        self.locks = {
            mode: Lock(
                self.client,
                self.name,
                ttl=TTL,
                mode=mode,
                limit=self.kind.limit if mode == "write" else None,
                fair=self.fair,
                fence_keep=KEEP_S,
            )
            for mode in self.kind.modes
        }
        self.keys = self.locks[self.kind.modes[0]].keys
        self.prefix = self.keys.prefix
        self.live: dict[str, Held] = {}
        self.dead: dict[str, list[Lease]] = {}  # released or expired; never live again
        self.seen: set[str] = set()
        self.last_fence = 0
        self.acquisitions = 0
        # Whether the last script to touch the name purged and settled it (acquire, release);
        # moving a score into the past leaves expired members behind until the next one does.
        self.settled = True
        # False from the start of a step until its checks pass: teardown then skips its own
        # checks, so a failure is reported as itself and not as a teardown mismatch.
        self.consistent = True

    # -- the model -------------------------------------------------------------------------

    def fits(self, mode: Mode) -> bool:
        """Whether a new lease of ``mode`` may be taken beside the live ones."""
        if not self.live:
            return True
        if any(h.mode != mode for h in self.live.values()):
            return False
        cap = self.kind.capacity(mode)
        return cap is None or len(self.live) < cap

    def by_fence(self) -> list[str]:
        """Live tokens in acquisition order, so a drawn index means the same when shrinking."""
        return sorted(self.live, key=lambda t: self.live[t].fence)

    def bury(self, token: str) -> None:
        self.dead[token] = self.live.pop(token).handles

    # -- rules -----------------------------------------------------------------------------

    @rule(data=st.data(), owner=st.sampled_from(OWNERS))
    def acquire(self, data: st.DataObject, owner: str | None) -> None:
        """Non-blocking acquire: succeeds exactly when the model has room (or re-enters)."""
        self.try_acquire(data, owner)

    @rule(data=st.data())
    def acquire_anonymous(self, data: st.DataObject) -> None:
        """A second acquire rule without owner, so shared and capped locks fill up often."""
        self.try_acquire(data, None)

    def try_acquire(self, data: st.DataObject, owner: str | None) -> None:
        self.consistent = False
        mode: Mode = data.draw(st.sampled_from(self.kind.modes), label="mode")
        mine = next(
            (t for t, h in self.live.items() if owner is not None and h.owner == owner), None
        )
        if mine is not None:
            expected = "upgrade" if (self.live[mine].mode, mode) == ("read", "write") else "reenter"
        else:
            expected = "new" if self.fits(mode) else "busy"
        self.acquisitions += 1
        info = str(self.acquisitions)
        try:
            lease = self.locks[mode].acquire(blocking=False, owner=owner, info={"n": info})
        except LockUpgradeError:
            got = "upgrade"
        except LockNotAcquired:
            got = "busy"
        else:
            got = "reenter" if lease.token in self.live else "new"
        self.settled = True
        assert got == expected, f"{mode} acquire by {owner!r}: got {got}, model says {expected}"
        if got == "reenter":
            assert lease.token == mine
            held = self.live[lease.token]
            assert lease.fence == held.fence
            held.count += 1
            held.handles.append(lease)
        elif got == "new":
            assert lease.token not in self.seen, "token reused"
            assert lease.fence > self.last_fence, "fence did not grow"
            self.seen.add(lease.token)
            self.last_fence = lease.fence
            self.live[lease.token] = Held(mode, owner, lease.fence, info, handles=[lease])
        if got in ("reenter", "new"):
            score = self.client.zscore(self.keys.leases, lease.token)
            assert score is not None and int(score) == lease.expires_at_ms

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release_held(self, data: st.DataObject) -> None:
        """Releasing gives back one re-entry level through any handle of the lease."""
        self.consistent = False
        token = data.draw(st.sampled_from(self.by_fence()), label="token")
        held = self.live[token]
        data.draw(st.sampled_from(held.handles), label="handle").release()
        self.settled = True
        held.count -= 1
        if held.count == 0:
            self.bury(token)

    @precondition(lambda self: self.dead)
    @rule(data=st.data())
    def release_dead(self, data: st.DataObject) -> None:
        """A released or expired lease cannot be released again."""
        self.consistent = False
        token = data.draw(st.sampled_from(list(self.dead)), label="token")
        handle = data.draw(st.sampled_from(self.dead[token]), label="handle")
        known_released = handle.released  # refused without a call to Redis: nothing purged
        with pytest.raises(LockNotOwned):
            handle.release()
        self.settled = self.settled or not known_released

    @precondition(lambda self: self.live)
    @rule(data=st.data(), ttl=st.sampled_from(RENEW_TTLS))
    def renew_held(self, data: st.DataObject, ttl: float | None) -> None:
        """Renewing a live lease never fails and never shortens it."""
        self.consistent = False
        token = data.draw(st.sampled_from(self.by_fence()), label="token")
        lease = data.draw(st.sampled_from(self.live[token].handles), label="handle")
        before = self.client.zscore(self.keys.leases, token)
        lease.renew(ttl)
        after = self.client.zscore(self.keys.leases, token)
        assert before is not None and after is not None
        assert int(after) == lease.expires_at_ms >= int(before)

    @precondition(lambda self: self.dead)
    @rule(data=st.data(), ttl=st.sampled_from(RENEW_TTLS))
    def renew_dead(self, data: st.DataObject, ttl: float | None) -> None:
        """A released or expired lease is never revived by renewal."""
        self.consistent = False
        token = data.draw(st.sampled_from(list(self.dead)), label="token")
        lease = data.draw(st.sampled_from(self.dead[token]), label="handle")
        with pytest.raises(LockLost):
            lease.renew(ttl)
        assert lease.lost

    @precondition(lambda self: self.live)
    @rule(data=st.data(), ago_ms=st.sampled_from((0, 1, 5000)))
    def expire(self, data: st.DataObject, ago_ms: int) -> None:
        """Natural expiry, without waiting: the lease's expiry score moves to server now or
        before (a score equal to now already counts as expired)."""
        self.consistent = False
        token = data.draw(st.sampled_from(self.by_fence()), label="token")
        score = _server_ms(self.client) - ago_ms
        assert self.client.zadd(self.keys.leases, {token: score}, xx=True, ch=True) == 1
        self.settled = False
        self.bury(token)

    # -- checks ----------------------------------------------------------------------------

    @invariant()
    def check(self) -> None:
        """Holders equal the model, the modes exclude each other, and the keys are tidy."""
        self.check_holders()
        self.check_keys()
        self.consistent = True

    def check_holders(self) -> None:
        holders = self.locks[self.kind.modes[0]].holders()
        got = {h.token: (h.mode, h.owner, h.count, h.fence, h.info.get("n")) for h in holders}
        want = {t: (h.mode, h.owner, h.count, h.fence, h.info) for t, h in self.live.items()}
        assert got == want
        # The same promises once more, read off Redis alone.
        writers = [h for h in holders if h.mode == "write"]
        assert not (writers and len(writers) < len(holders)), "readers beside a writer"
        assert len(writers) <= (self.kind.capacity("write") or 0), "too many writers"
        fences = [h.fence for h in holders]
        assert fences == sorted(set(fences))
        assert all(0 < h.expires_in <= max(TTL, 60.0) for h in holders)

    def check_keys(self) -> None:
        """Raw keys: nobody queued, every key expiring, and once purged nothing of dead leases."""
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.keys(f"{self.prefix}:*")
        pipe.hgetall(self.keys.meta)
        pipe.zrange(self.keys.leases, 0, -1, withscores=True)
        pipe.pttl(self.keys.leases)
        pipe.pttl(self.keys.meta)
        (sec, usec), raw_keys, raw_meta, raw_leases, pttl_leases, pttl_meta = pipe.execute()
        now = int(sec) * 1000 + int(usec) // 1000
        keys = {_text(k) for k in raw_keys}
        meta = {_text(k): _text(v) for k, v in raw_meta.items()}
        scores = {_text(m): int(s) for m, s in raw_leases}
        ttls = {self.keys.leases: pttl_leases, self.keys.meta: pttl_meta}

        # Non-blocking calls leave nobody in line: no queue, deadlines, wake lists or waiters.
        assert keys <= {self.keys.leases, self.keys.meta}, f"waiter keys left: {keys}"
        assert not [f for f in meta if f.startswith("q:")]
        assert int(meta.get("qw", "0")) == 0
        assert all(ttls[k] > 0 for k in keys), f"a key without expiry: {ttls}"
        if "fence" in meta or self.live:
            assert int(meta["fence"]) == self.last_fence

        # Per-lease fields ('l:<token>' and any other '<x>:<token>') belong to members of the set.
        records = {f[2:] for f in meta if f.startswith("l:")}
        per_lease = {f[2:] for f in meta if TOKEN_FIELD.fullmatch(f)}
        owners = {f[2:]: v for f, v in meta.items() if f.startswith("o:")}
        want_owners = {h.owner: t for t, h in self.live.items() if h.owner is not None}
        assert set(scores) >= set(self.live) and records >= set(self.live)
        assert per_lease <= set(scores) | set(self.dead)
        assert owners.items() >= want_owners.items()
        assert all(scores[t] > now for t in self.live)
        assert all(s <= now for t, s in scores.items() if t not in self.live)
        if self.settled:
            # The last script purged: nothing of an expired or released lease is left.
            assert set(scores) == set(self.live) == records == per_lease
            assert owners == want_owners
        if self.live:
            assert meta["m"] == next(iter(self.live.values())).mode[0]
            # The fence and the records outlive the last lease: no key lapses under a holder.
            last = max(scores[t] for t in self.live)
            assert pttl_leases + now >= last + GRACE_MS - 50
            assert pttl_meta + now >= last + GRACE_MS - 50
        elif self.settled:
            self.check_idle(keys, meta, pttl_meta)

    def check_idle(self, keys: set[str], meta: dict[str, str], pttl_meta: int) -> None:
        """Nothing held: only the fence high-water mark (and the tokens last released, so that a
        release run twice says released) may remain, for the lock's fence_keep."""
        assert keys <= {self.keys.meta}, f"keys survive the last lease: {keys}"
        if keys:
            assert set(meta) <= {"fence", "g"} and "fence" in meta, f"meta fields survive: {meta}"
            assert 0 < pttl_meta <= KEEP_S * 1000

    def teardown(self) -> None:
        """Releasing everything leaves at most the fence; a fresh lease then still fences higher."""
        if not self.consistent:
            return
        for token in self.by_fence():
            held = self.live[token]
            while held.count:
                held.handles[-1].release()
                held.count -= 1
            self.bury(token)
            self.settled = True  # a release purges and settles the whole name
        self.check()
        lease = self.locks[self.kind.modes[-1]].acquire(blocking=False)
        assert lease.fence > self.last_fence and lease.token not in self.seen
        self.last_fence = lease.fence
        lease.release()
        self.settled = True
        self.check()


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
@pytest.mark.parametrize("kind", KINDS, ids=[k.label for k in KINDS])
def test_lock_matches_model(redis_server: RedisServer, kind: Kind, fair: bool) -> None:
    """Random sequences of every operation agree with the model, for each kind of lock."""
    client = redis.Redis.from_url(redis_server.url)
    machine = type(
        f"LockModel_{kind.label}_{'fair' if fair else 'plain'}",
        (LockModel,),
        {"client": client, "kind": kind, "fair": fair},
    )
    try:
        run_state_machine_as_test(machine, settings=SETTINGS)
    finally:
        client.close()


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
def test_natural_expiry_uses_server_time(redis_server: RedisServer, fair: bool) -> None:
    """The score trick above stands in for real expiry: check real expiry once, with sleeps.

    Short leases lapse by Redis TIME, the lapsed holder can neither renew nor release, the
    next holder gets a higher fence, and an abandoned lock's keys lapse on their own.
    """
    client = redis.Redis.from_url(redis_server.url)
    try:
        name = f"expiry-{uuid.uuid4().hex[:12]}"
        reader = Lock(client, name, ttl=0.2, mode="read", fair=fair, fence_keep=0.5)
        writer = Lock(client, name, ttl=0.2, mode="write", fair=fair, fence_keep=0.5)
        first = reader.acquire(blocking=False)
        with pytest.raises(LockNotAcquired):
            writer.acquire(blocking=False)
        wait_for(lambda: not reader.holders(), "the read lease expired")
        second = writer.acquire(blocking=False)
        assert second.fence > first.fence
        with pytest.raises(LockLost):
            first.renew()
        with pytest.raises(LockNotOwned):
            first.release()
        # Abandoned: the lease lapses after 0.2 s and every key, fence included, fence_keep later.
        wait_for(lambda: not client.keys(f"{writer.keys.prefix}:*"), "the lock's keys expired")
        third = writer.acquire(blocking=False)
        assert third.fence > second.fence  # server microseconds carry on past the lost mark
        third.release()
    finally:
        client.close()


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
def test_fence_grows_past_a_mark_ahead_of_the_clock(redis_server: RedisServer, fair: bool) -> None:
    """Fences are max(mark + 1, server us): when the mark is ahead of the clock (the clock
    stepped back, or many grants in one microsecond) they must still grow, one by one."""
    client = redis.Redis.from_url(redis_server.url)
    try:
        lock = Lock(client, f"ahead-{uuid.uuid4().hex[:12]}", ttl=TTL, limit=3, fair=fair)
        lock.acquire(blocking=False).release()
        seconds, micros = client.time()
        mark = int(seconds) * 1_000_000 + int(micros) + 60_000_000  # a minute ahead
        client.hset(lock.keys.meta, "fence", str(mark))  # within the grace: the mark is kept
        first = lock.acquire(blocking=False)
        second = lock.acquire(blocking=False)
        assert (first.fence, second.fence) == (mark + 1, mark + 2)
        first.release()
        second.release()
    finally:
        client.close()
