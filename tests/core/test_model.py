"""Model-based test: random acquire, wait, release, renew and expiry sequences against a model.

Every lock kind (mutex, cap of 3 writers, read/write, read/write with at most 2 readers and 2
writers; each plain and fair) is driven by a Hypothesis state machine on a real Redis. After
every step the live leases Redis reports must equal the model's, and the raw keys (the line of
waiters included) must be exactly what the scripts promise.

Waiting needs no threads: a blocked caller is one acquire script call with the ``wait`` flag
set, exactly what ``Lock.acquire`` sends before it blocks, and each later step of its loop (a
retry after a wake-up or a time slice, the last try that leaves the line, popping a fair-mode
hand-over) is one more call. So the line, writer preference, fair hand-over in arrival order
and the deadlines of places in line are all deterministic. Expiry (of leases and of places in
line) is made deterministic by moving a score into the past, which the scripts cannot tell from
natural expiry; one plain test shows natural expiry with a real sleep.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
import redis
from helpers import wait_for
from hypothesis import HealthCheck, Phase, event, settings
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
from celery_redislock.core.protocol import (
    AcquireArgs,
    AcquireReply,
    AcquireStatus,
    LockSpec,
    NotifyArgs,
    RenewArgs,
    RenewReply,
    Wake,
)
from celery_redislock.core.scripts import run

TTL = 30.0  # long enough that nothing lapses by accident while an example runs
TTL_MS = int(TTL * 1000)
# How long a raw waiter's place in line lasts unless refreshed (the lock itself uses 3 s): long
# enough never to lapse while an example runs, and shorter than TTL, so that a lease handed to a
# waiter that has not woken yet (which lasts min(ttl, entry)) is told apart from a claimed one.
ENTRY_MS = 20_000
GRACE_MS = 1000  # _time.lua: how long the lock's keys outlive the last lease
KEEP_S = 2.0  # how long the fence mark outlives the lock's last use (Lock(fence_keep=...))
WAKE_LIST_MS = 3000  # lock.py: a fair waiter's wake list lives this long unless popped
SIGNAL_MS = 2000  # _grant.lua WAKE_MS: a plain lock's wake-up signals live this long
OWNERS = (None, "alice", "b|1|2|ob")  # a tiny pool, so owners re-enter; one with the separator
GROUPS = ("a", "b")  # the 'g' info field that release_where matches on
RENEW_TTLS = (None, 1.0, 60.0)  # shorter than the lease (no change), the default, longer
TOKEN_FIELD = re.compile(r"[a-z]:[0-9a-f]{32}")  # a per-lease field of the meta hash

SETTINGS = settings(
    max_examples=30,
    stateful_step_count=40,
    deadline=None,
    database=None,  # no example database in the working tree; failures print their steps
    # No shrinking: it takes minutes on a failure (past the suite's per-test timeout), and the
    # failing steps are printed as they are.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@dataclass(frozen=True)
class Kind:
    """One way of using a lock name: the modes its callers take and each mode's limit."""

    label: str
    modes: tuple[Mode, ...]
    limit: int | None  # Lock(limit=...) of the writers
    read_limit: int | None = None  # Lock(limit=...) of the readers

    def lock_limit(self, mode: Mode) -> int | None:
        return self.read_limit if mode == "read" else self.limit

    def capacity(self, mode: Mode) -> int | None:
        """How many leases of ``mode`` may be live at once (None: unbounded)."""
        limit = self.lock_limit(mode)
        return limit if limit is not None else (None if mode == "read" else 1)


KINDS = (
    Kind("mutex", ("write",), None),
    Kind("cap3", ("write",), 3),
    Kind("rw", ("read", "write"), None),
    Kind("rw-bounded", ("read", "write"), 2, read_limit=2),
)


@dataclass
class Held:
    """The model's view of one live lease."""

    mode: Mode
    owner: str | None
    fence: int
    info: str
    group: str
    count: int = 1
    handles: list[Lease] = field(default_factory=list)
    # Handed to a waiter in line (fair mode) that has not woken to claim it yet: the lease lasts
    # no longer than a place in line, and the waiter's wake list holds its fence.
    unclaimed: bool = False
    granted_at: float = 0.0  # time.monotonic() of the hand-over


@dataclass
class Waiter:
    """The model's view of a caller blocked in Lock.acquire: one place in line."""

    token: str
    mode: Mode
    owner: str | None
    info: str
    group: str


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
                limit=self.kind.lock_limit(mode),
                fair=self.fair,
                fence_keep=KEEP_S,
            )
            for mode in self.kind.modes
        }
        self.keys = self.locks[self.kind.modes[0]].keys
        self.prefix = self.keys.prefix
        self.live: dict[str, Held] = {}
        self.dead: dict[str, list[Lease]] = {}  # released or expired; never live again
        self.line: list[Waiter] = []  # in arrival order
        # Wake lists that may linger: of hand-overs whose lease went before its waiter woke, or
        # that were claimed by a retry instead of a pop (they lapse by themselves).
        self.stale_lists: set[str] = set()
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

    def admits(self, mode: Mode) -> bool:
        """Plain mode: free capacity is taken at once, except that a reader yields to any
        writer in line (writer preference)."""
        if mode == "write" or all(w.mode == "read" for w in self.line):
            return self.fits(mode)
        if self.fits(mode):
            event("plain: a reader that fits waits behind a writer in line")
        return False

    def advance(self) -> list[str]:
        """Fair mode: the line is served strictly in arrival order, the head as soon as it
        fits, and as many as fit (several readers at once); returns the tokens handed over."""
        granted = []
        while self.line and self.fits(self.line[0].mode):
            waiter = self.line.pop(0)
            self.live[waiter.token] = Held(
                waiter.mode,
                waiter.owner,
                0,  # learnt from Redis right after, checked to grow
                waiter.info,
                waiter.group,
                unclaimed=True,
                granted_at=time.monotonic(),
            )
            granted.append(waiter.token)
        if granted:
            event(f"fair: {min(len(granted), 3)}+ handed over in one call")
        behind = [w.mode for w in self.line[:2]] == ["write", "read"]
        if behind and self.fits("read"):
            event("fair: a reader that fits waits behind a writer in line")
        return granted

    def busy_owners(self) -> set[str]:
        """Owners blocked in an acquire call (in line, or handed a lease they have not woken
        to): such a caller makes no other call until that one returns."""
        waiting = {w.owner for w in self.line}
        waiting |= {h.owner for h in self.live.values() if h.unclaimed}
        return {o for o in waiting if o is not None}

    def by_fence(self, handled: bool = True) -> list[str]:
        """Live tokens in acquisition order, so a drawn index means the same when shrinking;
        ``handled``: only those a caller holds a Lease for."""
        return sorted(
            (t for t, h in self.live.items() if h.handles or not handled),
            key=lambda t: self.live[t].fence,
        )

    def bury(self, token: str) -> None:
        held = self.live.pop(token)
        self.dead[token] = held.handles
        if held.unclaimed:
            self.stale_lists.add(token)

    def new_info(self, data: st.DataObject) -> tuple[str, str]:
        self.acquisitions += 1
        return str(self.acquisitions), data.draw(st.sampled_from(GROUPS), label="group")

    def owner_for(self, data: st.DataObject) -> str | None:
        busy = self.busy_owners()
        return data.draw(st.sampled_from([o for o in OWNERS if o not in busy]), label="owner")

    def spec(self, mode: Mode) -> str:
        """The lock's spec as Lock builds it, but with the raw waiters' place-in-line lifetime."""
        cap = self.kind.capacity(mode)
        return LockSpec(
            mode=mode,
            limit=cap or 0,
            ttl_ms=TTL_MS,
            fair=self.fair,
            entry_ms=ENTRY_MS,
            keep_ms=int(KEEP_S * 1000),
        ).encode()

    def handle(self, token: str, mode: Mode, owner: str | None, fence: int, expiry: int) -> Lease:
        """The Lease a blocked Lock.acquire call returns once it holds the lock."""
        return Lease(
            lock=self.locks[mode],
            token=token,
            fence=fence,
            mode=mode,
            owner=owner,
            expires_at_ms=expiry,
            valid_until=time.monotonic() + TTL,
        )

    def send(
        self, waiter: Waiter, *, wait: bool, once: bool = False, woke: bool = False
    ) -> AcquireReply:
        """One acquire script call of a blocking Lock.acquire, waking whoever it handed the lock
        to, as Lock.acquire does."""
        args = AcquireArgs(
            token=waiter.token,
            spec=self.spec(waiter.mode),
            wait=wait,
            info=json.dumps({"n": waiter.info, "g": waiter.group}),
            woke=woke,
            once=once,
            owner=waiter.owner,
        )
        lock = self.locks[waiter.mode]
        reply = AcquireReply.decode(run("acquire", self.client, lock.encoded_keys, args.encode()))
        if reply.granted:
            grants = NotifyArgs(list_ms=WAKE_LIST_MS, grants=reply.granted)
            waiter_keys = [self.keys.waiter(g.token) for g in reply.granted]
            run("notify", self.client, waiter_keys, grants.encode())
        self.settled = True
        return reply

    def learn_grants(self, order: list[str], own: dict[str, int] | None = None) -> None:
        """Checks the leases just made in ``order`` (arrival order): fresh tokens, fences growing
        in that order, and each waiter handed a lease woken with exactly its fence and expiry.
        ``own``: the fence the caller itself was told."""
        if not order:
            return
        holders = {h.token: h for h in self.locks[self.kind.modes[0]].holders()}
        for token in order:
            assert token in holders, f"waiter {token} was not handed the lock"
            fence = (own or {}).get(token, holders[token].fence)
            assert fence == holders[token].fence
            assert token not in self.seen, "token reused"
            assert fence > self.last_fence, "fence did not grow in arrival order"
            self.seen.add(token)
            self.last_fence = fence
            held = self.live[token]
            held.fence = fence
            if held.unclaimed:
                # A hand-over lasts no longer than a place in line: a waiter that died in line
                # holds the lock for that long, not a whole ttl.
                assert holders[token].expires_in <= ENTRY_MS / 1000
                expiry = self.client.zscore(self.keys.leases, token)
                assert expiry is not None
                wake = Wake(fence=fence, expires_at_ms=int(expiry)).encode()
                assert [_text(v) for v in self.client.lrange(self.keys.waiter(token), 0, -1)] == [
                    wake
                ]

    def check_signal(self) -> None:
        """Plain mode: after capacity was freed with callers in line, a wake-up is pending."""
        if not self.fair and self.line:
            assert self.client.llen(self.keys.all[4]) >= 1, "freed with waiters, nobody woken"

    def expect_owned(self, owner: str | None, mode: Mode, once: bool) -> tuple[str, str | None]:
        """What an acquire by ``owner`` must do when it holds a lease already."""
        mine = next(
            (t for t, h in self.live.items() if owner is not None and h.owner == owner), None
        )
        if mine is None:
            return "", None
        if once:
            return "owned", mine
        if (self.live[mine].mode, mode) == ("read", "write"):
            return "upgrade", mine
        return "reenter", mine

    def take(
        self, token: str, mode: Mode, owner: str | None, info: str, group: str, lease: Lease
    ) -> None:
        assert lease.token == token
        assert token not in self.seen, "token reused"
        assert lease.fence > self.last_fence, "fence did not grow"
        self.seen.add(token)
        self.last_fence = lease.fence
        self.live[token] = Held(mode, owner, lease.fence, info, group, handles=[lease])

    def reenter(self, mine: str, lease: Lease) -> None:
        held = self.live[mine]
        assert lease.token == mine and lease.fence == held.fence
        held.count += 1
        held.handles.append(lease)

    # -- rules: callers that do not wait -----------------------------------------------------

    @rule(data=st.data())
    def acquire(self, data: st.DataObject) -> None:
        """Non-blocking acquire: succeeds exactly when the model has room (or re-enters)."""
        self.try_acquire(data, self.owner_for(data))

    @rule(data=st.data())
    def acquire_anonymous(self, data: st.DataObject) -> None:
        """A second acquire rule without owner, so shared and capped locks fill up often."""
        self.try_acquire(data, None)

    def try_acquire(self, data: st.DataObject, owner: str | None) -> None:
        self.consistent = False
        mode: Mode = data.draw(st.sampled_from(self.kind.modes), label="mode")
        once = owner is not None and data.draw(st.booleans(), label="once")
        info, group = self.new_info(data)
        expected, mine = self.expect_owned(owner, mode, once)
        granted: list[str] = []
        if not expected:
            token = "?"  # the lock picks it
            if self.fair:
                # Joins the line behind everyone, the line advances, and it leaves if not served.
                me = Waiter(token, mode, owner, info, group)
                self.line.append(me)
                granted = self.advance()
                got = token in granted
                if got:
                    granted.remove(token)
                    self.live.pop(token)
                else:
                    self.line.remove(me)
                    granted += self.advance()
            else:
                got = self.admits(mode)
            expected = "new" if got else "busy"
        try:
            lease = self.locks[mode].acquire(
                blocking=False, owner=owner, info={"n": info, "g": group}, reentrant=not once
            )
        except LockUpgradeError:
            got_as = "upgrade"
        except LockNotAcquired as exc:
            left = exc.owner_expires_in  # set only when its own owner's lease was in the way
            got_as = "busy" if left is None else "owned"
            assert left is None or 0 < left <= max(TTL, 60.0)
        else:
            got_as = "reenter" if lease.token in self.live else "new"
        self.settled = True
        assert got_as == expected, (
            f"{mode} acquire by {owner!r} (once={once}): got {got_as}, model says {expected}"
        )
        # Waiters ahead of it in line were served first, with lower fences.
        self.learn_grants(granted)
        if got_as == "reenter":
            assert mine is not None
            self.reenter(mine, lease)
        elif got_as == "new":
            self.take(lease.token, mode, owner, info, group, lease)
        if got_as in ("reenter", "new"):
            score = self.client.zscore(self.keys.leases, lease.token)
            assert score is not None and int(score) == lease.expires_at_ms

    # -- rules: callers that wait in line ----------------------------------------------------

    @rule(data=st.data())
    def join_line(self, data: st.DataObject) -> None:
        """A blocking acquire's first call (wait flag set): it takes the lock, re-enters, is
        refused, or stays in line."""
        self.wait_in_line(data, self.owner_for(data))

    @rule(data=st.data())
    def join_line_anonymous(self, data: st.DataObject) -> None:
        """A second rule without owner, so that lines (of several readers) grow often."""
        self.wait_in_line(data, None)

    def wait_in_line(self, data: st.DataObject, owner: str | None) -> None:
        self.consistent = False
        mode: Mode = data.draw(st.sampled_from(self.kind.modes), label="mode")
        once = owner is not None and data.draw(st.booleans(), label="once")
        info, group = self.new_info(data)
        me = Waiter(uuid.uuid4().hex, mode, owner, info, group)
        expected, mine = self.expect_owned(owner, mode, once)
        if expected:
            # Not queued: re-entered, or refused whatever the line (the caller may poll).
            reply = self.send(me, wait=True, once=once)
            want = {
                "owned": AcquireStatus.OWNER_HOLDS,
                "upgrade": AcquireStatus.UPGRADE_REFUSED,
                "reenter": AcquireStatus.HELD,
            }[expected]
            assert reply.status is want and reply.token == mine, f"{expected}: {reply}"
            if expected == "owned":
                assert 0 < reply.ms_left <= max(TTL, 60.0) * 1000  # what its lease has left
            if expected == "reenter":
                assert mine is not None
                self.reenter(mine, self.handle(mine, mode, owner, reply.fence, reply.expires_at_ms))
            return
        order: list[str] = []
        if self.fair:
            # It joins the line at the end; the line advances in arrival order.
            self.line.append(me)
            order = self.advance()
            got = me.token in order
        else:
            got = self.admits(mode)
            if not got:
                self.line.append(me)
        self.check_reply(me, self.send(me, wait=True, once=once), got, order)

    def check_reply(self, me: Waiter, reply: AcquireReply, got: bool, order: list[str]) -> None:
        """The acquire call of waiter ``me`` took the lock exactly when the model says, and
        handed the lock to exactly the waiters the model serves, in arrival order (``order``:
        every lease the call made, its own included)."""
        others = [t for t in order if t != me.token]
        assert [g.token for g in reply.granted] == others, "hand-over not in arrival order"
        if not got:
            assert reply.status is AcquireStatus.NOT_HELD, f"model says not held: {reply}"
            self.learn_grants(order)
            return
        assert reply.status is AcquireStatus.HELD, f"model says held: {reply}"
        assert reply.token == me.token and reply.entered == 1
        # Served by its own call: the full ttl, not the hand-over's (at most ENTRY_MS; the 5 s
        # margin keeps the two apart however long the call took).
        assert reply.expires_at_ms >= _server_ms(self.client) + TTL_MS - 5000
        lease = self.handle(me.token, me.mode, me.owner, reply.fence, reply.expires_at_ms)
        if self.fair:
            held = self.live[me.token]
            held.unclaimed = False
            held.handles.append(lease)
        else:
            self.live[me.token] = Held(me.mode, me.owner, 0, me.info, me.group, handles=[lease])
        self.learn_grants(order or [me.token], own={me.token: reply.fence})

    def retry(self, me: Waiter, wait: bool) -> None:
        """The next call of the blocked caller ``me``: after a wake-up or its time slice (wait),
        or the last one as its timeout runs out (not wait: it leaves the line if not served)."""
        woke = False
        if not self.fair:
            # What the blocked caller's BLPOP would have taken: passed on if it cannot use it.
            woke = self.client.lpop(self.keys.all[4]) is not None
        order: list[str] = []
        if self.fair:
            # It keeps its place; the line advances; not served and not waiting, it leaves.
            order = self.advance()
            got = me.token in order
            if not got and not wait:
                self.line.remove(me)
                order += self.advance()
        else:
            got = self.admits(me.mode)
            if got or not wait:
                self.line.remove(me)
        self.check_reply(me, self.send(me, wait=wait, woke=woke), got, order)
        if woke and not got and not self.live and self.line:
            # A caller woken for a free lock it may not take (a writer waits) passes it on.
            assert self.client.llen(self.keys.all[4]) >= 1, "a wake-up was swallowed"

    @precondition(lambda self: self.line)
    @rule(data=st.data(), wait=st.booleans())
    def retry_waiter(self, data: st.DataObject, wait: bool) -> None:
        """A blocked caller tries again (see retry)."""
        self.consistent = False
        self.retry(data.draw(st.sampled_from(self.line), label="waiter"), wait)

    @precondition(lambda self: any(h.unclaimed for h in self.live.values()))
    @rule(data=st.data(), pop=st.booleans())
    def wake_granted(self, data: st.DataObject, pop: bool) -> None:
        """Fair mode: a waiter handed the lock wakes (pops its list and claims the full ttl, as
        Lock.acquire does), or, its wake-up late, finds the lease on its next try."""
        self.consistent = False
        token = data.draw(
            st.sampled_from([t for t in self.by_fence(handled=False) if self.live[t].unclaimed]),
            label="token",
        )
        self.wake(token, pop)

    def wake(self, token: str, pop: bool) -> None:
        held = self.live[token]
        lock = self.locks[held.mode]
        before = _server_ms(self.client)
        if pop and time.monotonic() - held.granted_at < WAKE_LIST_MS / 1000 - 0.5:
            popped = self.client.lpop(self.keys.waiter(token))
            assert popped is not None, "handed the lock, but not woken"
            wake = Wake.decode(popped)
            assert wake.fence == held.fence
            renew = RenewArgs(ttl_ms=TTL_MS, tokens=[token])
            expiry = RenewReply.decode(
                run("renew", self.client, lock.encoded_keys[:2], renew.encode())
            ).expiries[0]
        else:
            me = Waiter(token, held.mode, held.owner, held.info, held.group)
            reply = self.send(me, wait=True)
            assert reply.status is AcquireStatus.HELD and reply.token == token, f"{reply}"
            assert reply.fence == held.fence and reply.entered == 1 and not reply.granted
            expiry = reply.expires_at_ms
            self.stale_lists.add(token)  # never popped: it lapses by itself
        assert expiry >= before + TTL_MS, "the woken waiter did not claim the full ttl"
        held.unclaimed = False
        held.handles.append(self.handle(token, held.mode, held.owner, held.fence, expiry))

    @precondition(lambda self: self.line)
    @rule(data=st.data(), ago_ms=st.sampled_from((0, 1, 5000)))
    def expire_waiter(self, data: st.DataObject, ago_ms: int) -> None:
        """A blocked caller dies: its place in line lapses at its deadline (moved into the
        past here), and the next script drops it."""
        self.consistent = False
        me = data.draw(st.sampled_from(self.line), label="waiter")
        score = _server_ms(self.client) - ago_ms
        assert self.client.zadd(self.keys.all[3], {me.token: score}, xx=True, ch=True) == 1
        self.line.remove(me)
        self.settled = False

    # -- rules: holders ----------------------------------------------------------------------

    @precondition(lambda self: self.by_fence())
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
            self.check_signal()
        self.learn_grants(self.advance() if self.fair else [])

    @precondition(lambda self: any(self.dead.values()))
    @rule(data=st.data())
    def release_dead(self, data: st.DataObject) -> None:
        """A released or expired lease cannot be released again."""
        self.consistent = False
        token = data.draw(st.sampled_from([t for t, h in self.dead.items() if h]), label="token")
        handle = data.draw(st.sampled_from(self.dead[token]), label="handle")
        known_released = handle.released  # refused without a call to Redis: nothing purged
        with pytest.raises(LockNotOwned):
            handle.release()
        if not known_released:
            self.settled = True
            # The release script hands the lock on whatever it found (a lapse may have freed it).
            self.learn_grants(self.advance() if self.fair else [])

    @rule(data=st.data(), group=st.sampled_from((*GROUPS, "none")))
    def release_where(self, data: st.DataObject, group: str) -> None:
        """release_where drops every live lease whose info matches, whatever its count, and hands
        the lock on."""
        self.consistent = False
        want = {t for t, h in self.live.items() if h.group == group}
        got = self.locks[data.draw(st.sampled_from(self.kind.modes), label="mode")].release_where(
            g=group
        )
        self.settled = True
        assert len(got) == len(set(got)) and set(got) == want
        for token in sorted(want, key=lambda t: self.live[t].fence):  # draws must not vary
            self.bury(token)
        if want:
            self.check_signal()
        self.learn_grants(self.advance() if self.fair else [])

    @precondition(lambda self: self.by_fence())
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

    @precondition(lambda self: any(self.dead.values()))
    @rule(data=st.data(), ttl=st.sampled_from(RENEW_TTLS))
    def renew_dead(self, data: st.DataObject, ttl: float | None) -> None:
        """A released or expired lease is never revived by renewal."""
        self.consistent = False
        token = data.draw(st.sampled_from([t for t, h in self.dead.items() if h]), label="token")
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
        token = data.draw(st.sampled_from(self.by_fence(handled=False)), label="token")
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
        cap = self.kind.capacity(holders[0].mode) if holders else None
        assert cap is None or len(holders) <= cap, "over the limit"
        fences = [h.fence for h in holders]
        assert fences == sorted(set(fences))
        assert all(0 < h.expires_in <= max(TTL, 60.0) for h in holders)

    def check_keys(self) -> None:
        """Raw keys: the line is the model's, every key expires, and once purged nothing of
        dead leases or lapsed places in line is left."""
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.keys(f"{self.prefix}:*")
        pipe.hgetall(self.keys.meta)
        pipe.zrange(self.keys.leases, 0, -1, withscores=True)
        pipe.zrange(self.keys.all[2], 0, -1)
        pipe.zrange(self.keys.all[3], 0, -1, withscores=True)
        for key in (self.keys.leases, self.keys.meta, *self.keys.all[2:5]):
            pipe.pttl(key)
        (sec, usec), raw_keys, raw_meta, raw_leases, raw_queue, raw_qdl, *pttls = pipe.execute()
        now = int(sec) * 1000 + int(usec) // 1000
        keys = {_text(k) for k in raw_keys}
        meta = {_text(k): _text(v) for k, v in raw_meta.items()}
        scores = {_text(m): int(s) for m, s in raw_leases}
        queue = [_text(m) for m in raw_queue]
        deadlines = {_text(m): int(s) for m, s in raw_qdl}
        leases_key, meta_key, queue_key, qdl_key, wake_key = (
            self.keys.leases,
            self.keys.meta,
            *self.keys.all[2:5],
        )
        ttls = dict(zip((leases_key, meta_key, queue_key, qdl_key, wake_key), pttls, strict=True))
        line = [w.token for w in self.line]

        # Which keys may exist: a fair waiter's wake list only while it may not have popped it,
        # the plain lock's wake-up signals, and the line only while someone is (or was) in it.
        lists = {self.keys.waiter(t) for t in self.live if self.live[t].unclaimed}
        allowed = {leases_key, meta_key, queue_key, qdl_key, wake_key}
        allowed |= lists | {self.keys.waiter(t) for t in self.stale_lists}
        assert keys <= allowed, f"unexpected keys: {keys - allowed}"
        if self.fair:
            assert wake_key not in keys, "a fair lock signalled the plain wake list"
        fresh = {
            self.keys.waiter(t)
            for t in self.live
            if self.live[t].unclaimed
            and time.monotonic() - self.live[t].granted_at < WAKE_LIST_MS / 1000 - 0.5
        }
        assert fresh <= keys, "a waiter handed the lock was not woken"
        listed = sorted(keys - set(ttls))
        if listed:
            pipe = self.client.pipeline(transaction=False)
            for key in listed:
                pipe.pttl(key)
            ttls.update(zip(listed, pipe.execute(), strict=True))
        # A missing key reads -2: gone between the two reads (a wake list lapsing), not kept.
        assert all(ttls[k] > 0 or ttls[k] == -2 for k in keys), f"a key without expiry: {ttls}"
        assert all(ttls[k] <= WAKE_LIST_MS for k in listed), "a wake list outlives its waiter"
        if wake_key in keys:
            assert ttls[wake_key] <= SIGNAL_MS
        if "fence" in meta or self.live:
            assert int(meta["fence"]) == self.last_fence

        # The line: in arrival order, each place with its record and a deadline ahead.
        waiting = {f[2:] for f in meta if f.startswith("q:")}
        assert [t for t in queue if t in line] == line, f"line out of order: {queue} vs {line}"
        assert set(line) <= waiting and set(line) <= set(deadlines)
        assert all(now < deadlines[t] <= now + ENTRY_MS for t in line)
        writers_in_line = sum(w.mode == "write" for w in self.line)
        if self.settled:
            assert queue == line and set(deadlines) == set(line) == waiting
            assert int(meta.get("qw", "0")) == writers_in_line
        if line:
            # The line's keys outlive the last deadline in it: no place lapses with its keys.
            last = max(deadlines[t] for t in line)
            for key in (meta_key, queue_key, qdl_key):
                assert ttls[key] + now >= last + GRACE_MS - 50, f"{key} lapses before a waiter"

        # Per-lease fields ('l:<token>' and any other '<x>:<token>') belong to members of the set.
        records = {f[2:] for f in meta if f.startswith("l:")}
        per_lease = {f[2:] for f in meta if TOKEN_FIELD.fullmatch(f) and not f.startswith("q:")}
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
            assert ttls[leases_key] + now >= last + GRACE_MS - 50
            assert ttls[meta_key] + now >= last + GRACE_MS - 50
        elif self.settled and not line:
            self.check_idle(keys - {wake_key} - lists, meta, ttls[meta_key])

    def check_idle(self, keys: set[str], meta: dict[str, str], pttl_meta: int) -> None:
        """Nothing held, nobody in line: only the fence high-water mark (and the tokens last
        released, and the last release_where's answer, so that a release run twice says
        released) may remain, for fence_keep."""
        keys -= {self.keys.waiter(t) for t in self.stale_lists}
        assert keys <= {self.keys.meta}, f"keys survive the last lease: {keys}"
        if keys:
            assert set(meta) <= {"fence", "g", "w"} and "fence" in meta, (
                f"meta fields survive: {meta}"
            )
            assert 0 < pttl_meta <= KEEP_S * 1000

    def teardown(self) -> None:
        """Every caller gives up or releases: at most the fence is left; a fresh lease then still
        fences higher."""
        if not self.consistent:
            return
        while self.line or self.live:
            if self.line:
                self.retry(self.line[0], wait=False)  # its timeout ran out (it may be served)
                continue
            token = self.by_fence(handled=False)[0]
            held = self.live[token]
            if held.unclaimed:
                self.wake(token, pop=True)
            while held.count:
                held.handles[-1].release()
                held.count -= 1
            self.bury(token)
            self.settled = True  # a release purges and settles the whole name
            self.learn_grants(self.advance() if self.fair else [])
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
