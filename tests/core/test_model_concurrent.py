"""Model-based test with real concurrency: threads call one lock at once, and the history of
their calls must be explained by the sequential model (tests/lockhistory.py).

Three threads run seeded random programs against one lock name on a real Redis: non-blocking
and blocking acquires (short timeouts), re-entry and ``reentrant=False`` by owners, releases of
one level, ``release_where`` (a whole lease, whatever its count), renewals, ``holders()`` and
``locked()``, in read and write modes with a limit of 2. Two or three threads share each owner
id, so one owner makes calls at once: a re-entry racing a release, two re-entries, a renewal of a
lease another thread of the owner drops. Every call is recorded with two ticks of a shared
counter (before the call, after it returned) and its result; the history must be linearizable
against the model and keep the invariants read off it directly (see lockhistory.py).

Leases last 30 s so nothing lapses during a history (a second or so), except in one dedicated
case of 0.1 s leases in plain mode, where the model lets expiries pass (see lockhistory.lapses).
A failure prints the seed, the programs and the whole history as Python that
``lockhistory.check`` takes again. ``CONCURRENT_MODEL_EXAMPLES`` runs more histories per case
(default 6), ``CONCURRENT_MODEL_SEED`` other ones.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from helpers import wait_until_queued
from lockhistory import Op, Rules, check, concurrent, linearize
from test_model import KINDS, Kind

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

EXAMPLES = int(os.environ.get("CONCURRENT_MODEL_EXAMPLES", "6"))
SEED = int(os.environ.get("CONCURRENT_MODEL_SEED", "0"))
THREADS = 3
STEPS = (5, 8)  # calls per thread
TTL = 30.0  # nothing lapses while a history runs
TIMEOUTS = (0.01, 0.05, 0.2)  # of blocking acquires
OWNERS = ("alice", "bob")  # shared by every thread: one owner makes calls at once
RENEW_TTLS = (None, 1.0, 60.0)  # the default, shorter than the lease (no change), longer
# A lease handed to a fair waiter lasts 3 s until the waiter claims it, inside its own acquire
# call: a call slower than this (a stalled machine) might have let it lapse, which the model
# does not know of, so such a history is not judged.
SLOW_CALL_S = 2.5
CASES = [k for k in KINDS if k.label in ("mutex", "rw-bounded")]  # rw-bounded: limit 2 each


PAUSES = (0.0, 0.0, 0.0, 0.0005, 0.002)  # before a call: varies the interleaving
# The dedicated case where leases lapse during the history: a ttl as short as allowed, pauses
# about as long, so leases lapse between calls and under blocked callers.
SHORT_TTL = 0.1
SHORT_PAUSES = (0.0, 0.0, 0.02, 0.06, 0.12)
SHORT_RENEW_TTLS = (None, 0.1, 0.3)


def _program(
    rng: random.Random,
    thread: int,
    kind: Kind,
    fair: bool,
    pauses: tuple[float, ...] = PAUSES,
    renew_ttls: tuple[float | None, ...] = RENEW_TTLS,
    renew_share: float = 0.08,
) -> list[tuple[Any, ...]]:
    """One thread's calls; ``pick`` chooses among the lease levels it holds when it runs."""
    # release_where drops a whole lease, every level of its owner. In fair mode a lease is
    # handed to a blocked caller, which claims it moments later: dropped in between by another
    # thread of its owner, the claim fails and the caller queues again under the same token, a
    # second life of one token that no call of the history made. So there a thread drops only
    # its own anonymous leases.
    whos = [f"t{thread}"]
    if not fair:
        whos += [*OWNERS, *(f"t{t}" for t in range(THREADS) if t != thread)]
    steps: list[tuple[Any, ...]] = []
    for _ in range(rng.randint(*STEPS)):
        pause = rng.choice(pauses)
        r = rng.random()
        if r < 0.45:
            owner = rng.choice((None, *OWNERS, *OWNERS))
            once = owner is not None and rng.random() < 0.2
            timeout = rng.choice((None, None, *TIMEOUTS))
            steps.append((pause, "acquire", rng.choice(kind.modes), owner, once, timeout))
        elif r < 0.83 - renew_share:
            steps.append((pause, "release", rng.randrange(1000)))
        elif r < 0.83:
            steps.append((pause, "renew", rng.randrange(1000), rng.choice(renew_ttls)))
        elif r < 0.9:
            steps.append((pause, "release_where", rng.choice(whos)))
        else:
            steps.append((pause, rng.choice(("holders", "locked"))))
    return steps


class History:
    """Runs the calls of one history on a fresh lock name and records each: its ticks (before
    the call, after it returned), the call and its result."""

    def __init__(self, client: redis.Redis, kind: Kind, fair: bool, ttl: float = TTL) -> None:
        name = f"concurrent-{uuid.uuid4().hex[:12]}"
        self.locks = {
            mode: Lock(client, name, ttl=ttl, mode=mode, limit=kind.lock_limit(mode), fair=fair)
            for mode in kind.modes
        }
        self.any_lock = self.locks[kind.modes[0]]
        self.ticks = itertools.count()  # next() on it is atomic: one shared clock of events
        self.ops: list[Op] = []
        self.slowest = 0.0
        # The lease levels each thread holds: one Lease per acquire that returned one, given
        # back by one release each. A thread's Lease objects are its own (their flags are).
        self.levels: dict[int, list[Lease]] = {t: [] for t in range(THREADS + 1)}

    def record(self, thread: int, call: tuple[Any, ...], fn: Callable[[], tuple[Any, ...]]) -> None:
        started = time.monotonic()
        inv = next(self.ticks)
        try:
            result = fn()
        except LockUpgradeError:
            result = ("upgrade",)
        except LockNotAcquired as exc:
            result = ("busy",) if exc.owner_expires_in is None else ("owned",)
        except LockLost:
            result = ("lost",) if call[0] == "renew" else ("error", "LockLost")
        except LockNotOwned:
            result = ("not_owned",) if call[0] == "release" else ("error", "LockNotOwned")
        except Exception as exc:  # judged by the model: no call may raise anything else
            result = ("error", repr(exc))
        res = next(self.ticks)
        self.slowest = max(self.slowest, time.monotonic() - started)
        self.ops.append(Op(inv, thread, inv, res, call, result))

    def acquire(
        self, thread: int, mode: Mode, owner: str | None, once: bool, timeout: float | None
    ) -> None:
        who = owner or f"t{thread}"
        lock = self.locks[mode]

        def fn() -> tuple[Any, ...]:
            if timeout is None:
                lease = lock.acquire(
                    blocking=False, owner=owner, info={"w": who}, reentrant=not once
                )
            else:
                lease = lock.acquire(
                    timeout=timeout, owner=owner, info={"w": who}, reentrant=not once
                )
            self.levels[thread].append(lease)
            return ("lease", lease.token, lease.fence, lease.expires_at_ms, lease.mode)

        self.record(thread, ("acquire", mode, owner, once, timeout, who), fn)

    def release(self, thread: int, lease: Lease) -> None:
        def fn() -> tuple[Any, ...]:
            lease.release()
            return ("released", lease.released)

        self.record(thread, ("release", lease.token), fn)

    def renew(self, thread: int, lease: Lease, ttl: float | None) -> None:
        def fn() -> tuple[Any, ...]:
            lease.renew(ttl)
            return ("renewed", lease.expires_at_ms)

        ttl_ms = None if ttl is None else round(ttl * 1000)
        self.record(thread, ("renew", lease.token, ttl_ms), fn)

    def release_where(self, thread: int, who: str) -> None:
        def fn() -> tuple[Any, ...]:
            return ("dropped", tuple(sorted(self.any_lock.release_where(w=who))))

        self.record(thread, ("release_where", who), fn)

    def holders(self, thread: int) -> None:
        def fn() -> tuple[Any, ...]:
            return (
                "holders",
                tuple(
                    (h.token, h.mode, h.owner, h.count, h.fence, h.info.get("w"))
                    for h in self.any_lock.holders()
                ),
            )

        self.record(thread, ("holders",), fn)

    def locked(self, thread: int) -> None:
        self.record(thread, ("locked",), lambda: ("locked", self.any_lock.locked()))

    def run_step(self, thread: int, step: tuple[Any, ...]) -> None:
        pause, kind, *args = step
        if pause:
            time.sleep(pause)  # varies the interleaving; nothing waits on it
        levels = self.levels[thread]
        if kind == "acquire":
            self.acquire(thread, *args)
        elif kind == "release" and levels:
            self.release(thread, levels.pop(args[0] % len(levels)))
        elif kind == "renew" and levels:
            self.renew(thread, levels[args[0] % len(levels)], args[1])
        elif kind == "release_where":
            self.release_where(thread, args[0])
        elif kind == "locked":
            self.locked(thread)
        else:  # holders, or a release or renewal with nothing held
            self.holders(thread)

    def run(self, programs: list[list[tuple[Any, ...]]]) -> list[Op]:
        """Runs the programs at once, one thread each, then gives back every level left (one
        thread, after the others) and reads the holders: a history that ends with the lock
        free."""
        start = threading.Barrier(len(programs))
        failures: list[BaseException] = []

        def thread_main(thread: int) -> None:
            try:
                start.wait(timeout=30)
                for step in programs[thread]:
                    self.run_step(thread, step)
            except BaseException as exc:  # a fault of this harness: fail the test with it
                failures.append(exc)

        threads = [
            threading.Thread(target=thread_main, args=(t,), name=f"history-{t}")
            for t in range(len(programs))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a history thread hangs"
        assert not failures, failures
        last = len(programs)
        for thread in range(len(programs)):
            for lease in self.levels[thread]:
                self.release(last, lease)
        self.holders(last)
        # Numbered in the order the calls began.
        ordered = sorted(self.ops, key=lambda o: o.inv)
        return [op._replace(i=k) for k, op in enumerate(ordered)]


def _same_owner_overlaps(ops: list[Op]) -> int:
    """How many pairs of calls of one owner, from two threads, overlapped in time."""
    owner_of = {o.result[1]: o.call[2] for o in ops if o.result[0] == "lease" and o.call[2]}

    def owner(op: Op) -> str | None:
        if op.call[0] == "acquire":
            return op.call[2]  # type: ignore[no-any-return]
        if op.call[0] in ("release", "renew"):
            return owner_of.get(op.call[1])
        return None

    return sum(
        1
        for a, b in itertools.combinations(ops, 2)
        if a.thread != b.thread and owner(a) and owner(a) == owner(b) and concurrent(a, b)
    )


def _rules(kind: Kind, fair: bool, ttl: float = TTL) -> Rules:
    caps = {m: kind.capacity(m) for m in ("read", "write")}
    return Rules(caps, fair, round(ttl * 1000), expiring=ttl != TTL)


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
@pytest.mark.parametrize("kind", CASES, ids=[k.label for k in CASES])
def test_concurrent_histories_are_linearizable(
    redis_server: RedisServer, kind: Kind, fair: bool
) -> None:
    """Seeded random programs on three threads: each history is explained by the model, keeps
    the invariants, and some calls of one owner really overlapped."""
    client = redis.Redis.from_url(redis_server.url)
    rules = _rules(kind, fair)
    overlaps = judged = 0
    try:
        for example in range(EXAMPLES):
            seed = SEED * 100_000 + example
            rng = random.Random(f"{seed}-{kind.label}-{fair}")
            programs = [_program(rng, t, kind, fair) for t in range(THREADS)]
            history = History(client, kind, fair)
            ops = history.run(programs)
            if fair and history.slowest > SLOW_CALL_S:
                continue  # see SLOW_CALL_S
            judged += 1
            overlaps += _same_owner_overlaps(ops)
            header = (
                f"CONCURRENT_MODEL_SEED={SEED} example {example} ({kind.label}, "
                f"{'fair' if fair else 'plain'}); programs = {programs!r}"
            )
            check(rules, ops, header)
            assert ops[-1].result == ("holders", ()), "the lock is not free at the end"
    finally:
        client.close()
    assert judged == 0 or overlaps > 0, "no two calls of one owner ever overlapped"


def test_a_wait_with_a_millisecond_left_ends_on_time(redis_server: RedisServer) -> None:
    """Found by the histories above: a blocked acquire whose time runs out while it waits must
    give up on time. Redis 6.2 reads a BLPOP timeout of 0.001 s as 0, "block for ever": a
    waiter with a millisecond left then waited for the next wake-up or the client's socket
    timeout (redis-py's default: 5 s, then LockBackendError)."""
    # A socket timeout of 60 s: a wait that blocked for ever would fail the bound below.
    client = redis.Redis.from_url(redis_server.url, socket_timeout=60)
    try:
        for fair in (False, True):
            lock = Lock(client, f"late-{uuid.uuid4().hex[:12]}", ttl=TTL, fair=fair)
            held = lock.acquire(blocking=False)
            for timeout in (0.001, 0.0012):
                started = time.monotonic()
                with pytest.raises(LockNotAcquired):
                    lock.acquire(timeout=timeout)
                # Redis ends blocking calls on its 100 ms tick: a generous bound.
                assert time.monotonic() - started < 20, f"fair={fair} timeout={timeout}"
            held.release()
    finally:
        client.close()


@pytest.mark.parametrize("kind", CASES, ids=[k.label for k in CASES])
def test_histories_with_lapsing_leases_are_linearizable(
    redis_server: RedisServer, kind: Kind
) -> None:
    """The same with leases of 0.1 s that lapse between calls (plain mode, where every lease's
    expiry is known): the model lets the server clock pass any expiries before each call, in
    order, and the calls that tell the clock (a new lease, an extension) pin it."""
    client = redis.Redis.from_url(redis_server.url)
    rules = _rules(kind, False, SHORT_TTL)
    lapsed = 0
    try:
        for example in range(EXAMPLES):
            seed = SEED * 100_000 + example
            rng = random.Random(f"{seed}-{kind.label}-lapsing")
            programs = [
                _program(rng, t, kind, False, SHORT_PAUSES, SHORT_RENEW_TTLS, renew_share=0.25)
                for t in range(THREADS)
            ]
            ops = History(client, kind, False, SHORT_TTL).run(programs)
            header = (
                f"CONCURRENT_MODEL_SEED={SEED} example {example} ({kind.label}, lapsing); "
                f"programs = {programs!r}"
            )
            check(rules, ops, header)
            lapsed += sum(o.result[0] in ("lost", "not_owned") for o in ops)
    finally:
        client.close()
    assert lapsed > 0, "no lease ever lapsed under its holder"


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
def test_two_blocked_calls_of_one_owner_share_one_lease(
    redis_server: RedisServer, fair: bool
) -> None:
    """Found by the histories above: two calls of one owner blocked behind a writer, both let in
    by its release (readers share). The owner must end with one lease entered twice, as when its
    calls come one after the other, not two leases (two of the readers' places, and an owner
    that holds more than one lease)."""
    client = redis.Redis.from_url(redis_server.url)
    name = f"owner-{uuid.uuid4().hex[:12]}"
    reader = Lock(client, name, ttl=TTL, mode="read", limit=2, fair=fair)
    writer = Lock(client, name, ttl=TTL, fair=fair)
    got: list[Lease] = []
    try:
        held = writer.acquire(blocking=False)
        threads = [
            threading.Thread(target=lambda: got.append(reader.acquire(timeout=10, owner="bob")))
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        wait_until_queued(client, reader, 2)
        held.release()
        for t in threads:
            t.join(15)
        assert len(got) == 2
        assert [(h.owner, h.count) for h in reader.holders()] == [("bob", 2)]
        assert got[0].token == got[1].token
    finally:
        for lease in got:
            with contextlib.suppress(LockNotOwned):
                lease.release()
        client.close()


# -- the oracle itself: it accepts what the lock may do and rejects what it must not -----------

MUTEX = Rules({"read": None, "write": 1}, False, 30_000)
NOW = 1_700_000_000_000  # server ms


def _ops(*rows: tuple[int, int, int, tuple[Any, ...], tuple[Any, ...]]) -> list[Op]:
    """(thread, inv, res, call, result) rows."""
    return [Op(k, t, inv, res, call, result) for k, (t, inv, res, call, result) in enumerate(rows)]


def _lease(token: str, at_ms: int, mode: str = "write") -> tuple[Any, ...]:
    return ("lease", token, at_ms * 1000, at_ms + 30_000, mode)


def _acq(owner: str | None, who: str = "x") -> tuple[Any, ...]:
    return ("acquire", "write", owner, False, None, owner or who)


def test_oracle_takes_a_same_owner_race_either_way() -> None:
    """A release racing a re-entry by the same owner: the count may drop to 0 first (the
    re-entry then makes a new lease) or rise to 2 first; both are explained, a mix is not."""
    held = (0, 0, 1, _acq("alice"), _lease("a", NOW))
    first_release = _ops(
        held,
        (0, 2, 5, ("release", "a"), ("released", True)),
        (1, 3, 6, _acq("alice"), _lease("b", NOW + 1)),
        (
            2,
            7,
            8,
            ("holders",),
            ("holders", (("b", "write", "alice", 1, (NOW + 1) * 1000, "alice"),)),
        ),
    )
    check(MUTEX, first_release)
    first_reentry = _ops(
        held,
        (0, 2, 5, ("release", "a"), ("released", False)),
        (1, 3, 6, _acq("alice"), ("lease", "a", NOW * 1000, NOW + 1 + 30_000, "write")),
        (2, 7, 8, ("holders",), ("holders", (("a", "write", "alice", 1, NOW * 1000, "alice"),))),
    )
    check(MUTEX, first_reentry)
    mixed = _ops(
        held,
        (0, 2, 5, ("release", "a"), ("released", False)),  # a level left: the re-entry came first
        (1, 3, 6, _acq("alice"), _lease("b", NOW + 1)),  # yet a new lease
    )
    assert linearize(MUTEX, mixed).order is None
    with pytest.raises(AssertionError, match="no order"):
        check(MUTEX, mixed)


def test_oracle_rejects_two_exclusive_holders() -> None:
    both = _ops(
        (0, 0, 1, _acq(None, "t0"), _lease("a", NOW)),
        (1, 2, 3, _acq(None, "t1"), _lease("b", NOW + 1)),
    )
    with pytest.raises(AssertionError, match="2 write leases held at once"):
        check(MUTEX, both)


def test_oracle_rejects_a_fence_that_does_not_grow() -> None:
    later_lower = _ops(
        (0, 0, 1, _acq(None, "t0"), _lease("a", NOW + 5)),
        (0, 2, 3, ("release", "a"), ("released", True)),
        (
            1,
            4,
            5,
            _acq(None, "t1"),
            ("lease", "b", (NOW + 5) * 1000 - 1, NOW + 6 + 30_000, "write"),
        ),
    )
    with pytest.raises(AssertionError, match="fence"):
        check(MUTEX, later_lower)


def test_oracle_rejects_a_count_that_does_not_add_up() -> None:
    twice = _ops(
        (0, 0, 1, _acq("alice"), _lease("a", NOW)),
        (1, 2, 3, _acq("alice"), ("lease", "a", NOW * 1000, NOW + 1 + 30_000, "write")),
        (1, 4, 5, ("holders",), ("holders", (("a", "write", "alice", 3, NOW * 1000, "alice"),))),
    )
    with pytest.raises(AssertionError, match="count 3 not in"):
        check(MUTEX, twice)


def test_oracle_rejects_a_busy_lock_that_was_free() -> None:
    """Refused although free, with nobody waiting: not explained (a blocked caller at the same
    time would explain it)."""
    free = _ops((0, 0, 1, _acq(None, "t0"), ("busy",)))
    with pytest.raises(AssertionError, match="room"):
        check(MUTEX, free)
    busy = (0, 1, 2, _acq(None, "t0"), ("busy",))
    waiting = (1, 0, 9, ("acquire", "write", None, False, 0.05, "t1"), _lease("w", NOW))
    check(MUTEX._replace(fair=True), _ops(busy, waiting))
