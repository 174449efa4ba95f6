"""Model-based test of the unique-task claim scripts (unique_claim.lua, unique_release.lua).

A Hypothesis state machine claims and releases one unique key for a few task ids, through
``core.claims.claim`` and ``release_claim`` on a real Redis, beside a real run lease of the same
name (``Lock.acquire(owner=task_id, info={"task_id": ...})``, as a running task holds it). A
plain-Python model predicts every status: duplicate (of a queued or of a running copy), claimed,
replaced, cancelled (a running copy replaced), re-publish unclaimed, a once_per_period run's
start keeping the key for its period, and what a release says when its task was superseded. After
every step the claim key and the replaced set must be exactly the model's, and both expire.
No Celery worker is needed: these are pure Redis operations.
"""

from __future__ import annotations

import os
import uuid
from typing import ClassVar

import pytest
import redis
from helpers import wait_for
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from celery_redislock import Lease, Lock, LockNotOwned
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.claims import ClaimKind, ReleaseMode, claim, release_claim
from celery_redislock.core.keys import DEFAULT_NAMESPACE, LockKeys
from celery_redislock.core.layout import set_layout
from celery_redislock.core.protocol import ClaimStatus

IDS = ("t1", "t2", "t3")  # a tiny pool of task ids, so they meet often
LIFETIMES = (30.0, 60.0)  # seconds: a shorter one must not shorten a longer claim
RUN_TTL = 30.0  # the run lease's ttl
SLACK_MS = 1000  # time that may pass between a script's reply and the TTL read after it

SETTINGS = settings(
    max_examples=200,
    stateful_step_count=30,
    deadline=None,
    database=None,  # no example database in the working tree
    phases=[Phase.explicit, Phase.generate],  # no shrinking: see test_model.py
    suppress_health_check=[HealthCheck.too_slow],
)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class ClaimModel(RuleBasedStateMachine):
    """One fresh unique key per example; the subclass made per test sets ``client``."""

    client: ClassVar[redis.Redis]
    namespace: ClassVar[str] = DEFAULT_NAMESPACE
    lean: ClassVar[bool] = False  # the namespace's layout is lean (set by the test)

    def __init__(self) -> None:
        super().__init__()
        self.name = f"claim-{uuid.uuid4().hex[:12]}"
        self.keys = LockKeys.of(self.namespace, self.name)
        self.run_lock = Lock(self.client, self.name, ttl=RUN_TTL, namespace=self.namespace)
        self.queued: str | None = None  # the id whose message holds the key
        self.started = False  # the holder is a once_per_period run that started
        self.replaced: set[str] = set()  # ids replaced while queued: they must not run
        self.running: tuple[str, Lease] | None = None  # the id running, and its run lease

    # -- rules -----------------------------------------------------------------------------

    @rule(
        task_id=st.sampled_from(IDS),
        kind=st.sampled_from(list(ClaimKind)),
        running_counts=st.booleans(),
        lifetime=st.sampled_from(LIFETIMES),
    )
    def claim(self, task_id: str, kind: ClaimKind, running_counts: bool, lifetime: float) -> None:
        """A publish claims the key: the model says which status, holder and state."""
        before = self.client.pttl(self.keys.queued)
        runner = self.running[0] if self.running else None
        same_job = kind in (ClaimKind.REPUBLISH, ClaimKind.CONFIRM)
        started, also = False, None
        if kind is ClaimKind.CONFIRM:
            # A publish went through: only this id's own claim is extended, none is made (the
            # copy may have started and given it up already).
            if self.queued == task_id:
                want, holder, running = ClaimStatus.CLAIMED, task_id, False
            else:
                want, holder = ClaimStatus.REPUBLISH_UNCLAIMED, self.queued or "-"
                running = False
        elif running_counts and not same_job and runner not in (None, task_id):
            if kind is ClaimKind.CANCEL:  # the runner is stopped; a queued copy replaced
                want, holder, running = ClaimStatus.REPLACED, runner, True
                also = self.queued if self.queued not in (None, task_id) else None
            else:
                want, holder, running = ClaimStatus.DUPLICATE, runner, True
        elif self.queued in (None, task_id):
            want, holder, running = ClaimStatus.CLAIMED, task_id, False
        elif kind is ClaimKind.REPUBLISH:
            want, holder, running = ClaimStatus.REPUBLISH_UNCLAIMED, self.queued, False
        elif self.started:  # a run within its period: nothing replaces it
            want, holder, running, started = ClaimStatus.DUPLICATE, self.queued, False, True
        elif kind in (ClaimKind.REPLACE, ClaimKind.CANCEL):
            want, holder, running = ClaimStatus.REPLACED, self.queued, False
        else:
            want, holder, running = ClaimStatus.DUPLICATE, self.queued, False
        got = claim(
            self.client,
            self.namespace,
            self.name,
            task_id=task_id,
            lifetime=lifetime,
            kind=kind,
            running_counts=running_counts,
        )
        assert (got.status, got.holder, got.running, got.started, got.also) == (
            want,
            holder,
            running,
            started,
            also,
        ), f"{kind.name} claim by {task_id} (running counts: {running_counts}): {got}"
        after = self.client.pttl(self.keys.queued)
        if kind is ClaimKind.CONFIRM and want is ClaimStatus.REPUBLISH_UNCLAIMED:
            assert got.ms_left == 0
        elif want in (ClaimStatus.DUPLICATE, ClaimStatus.REPUBLISH_UNCLAIMED):
            # What the holder has left: its claim, or its run lease when it runs.
            assert 0 < got.ms_left <= (RUN_TTL if running else max(LIFETIMES)) * 1000
            if not running:
                assert abs(got.ms_left - after) <= SLACK_MS
        else:
            assert got.ms_left == 0
        own_period = self.started and self.queued == task_id
        if want is ClaimStatus.CLAIMED and own_period:
            assert abs(after - before) <= SLACK_MS  # a started period is neither cut nor grown
        elif want is ClaimStatus.CLAIMED:
            # The claim lasts its lifetime; claimed again by the same id it is never shortened.
            assert after >= lifetime * 1000 - SLACK_MS
            if self.queued == task_id:
                assert after >= before - SLACK_MS
            self.queued = task_id
        elif want is ClaimStatus.REPLACED:
            if running:  # a cancel: the runner (and a copy it queued earlier) must not run
                self.replaced.add(holder)
                if also is not None:
                    self.replaced.add(also)
                if self.queued != task_id:
                    assert after >= lifetime * 1000 - SLACK_MS
                    self.queued, self.started = task_id, False
                return
            assert after >= lifetime * 1000 - SLACK_MS
            self.replaced.add(holder)
            self.queued = task_id
            # The replaced ids are remembered at least as long as the claim that replaced them.
            assert self.client.pttl(self.keys.replaced) >= after - SLACK_MS

    def _given_up(self, task_id: str) -> str | None:
        """The model of a give-up by ``task_id``: who superseded it (None: released)."""
        if task_id in self.replaced:
            return self.queued or "-"
        if self.queued == task_id and self.started:
            return None  # the run happened: its period stands
        if self.queued in (None, task_id):
            self.queued = None
            return None
        return self.queued

    def _period_started(self, task_id: str) -> tuple[str | None, bool]:
        """The model of a once_per_period start by ``task_id``: who superseded it, and whether
        its period starts now."""
        if task_id in self.replaced:
            return self.queued or "-", False
        if self.queued is None or (self.queued == task_id and not self.started):
            self.queued, self.started = task_id, True
            return None, True
        if self.queued == task_id:
            return None, False  # started already (a redelivery): the period is not restarted
        return self.queued, False

    @rule(task_id=st.sampled_from(IDS))
    def release(self, task_id: str) -> None:
        """A task gives up its claim (it starts, was revoked or skipped): only its own, and a
        replaced task is told who superseded it."""
        want = self._given_up(task_id)
        got = release_claim(self.client, self.namespace, self.name, task_id)
        assert got == want, f"release by {task_id}: got {got!r}, model says {want!r}"

    @rule(task_id=st.sampled_from(IDS), period=st.sampled_from(LIFETIMES))
    def start_period(self, task_id: str, period: float) -> None:
        """A once_per_period run starts: it keeps the key for its period from now (a start
        found superseded is told by whom, and changes nothing)."""
        before = self.client.pttl(self.keys.queued)
        want, taken = self._period_started(task_id)
        got = release_claim(
            self.client,
            self.namespace,
            self.name,
            task_id,
            mode=ReleaseMode.START,
            keep=period,
        )
        assert got == want, f"start by {task_id}: got {got!r}, model says {want!r}"
        after = self.client.pttl(self.keys.queued)
        assert abs(after - (period * 1000 if taken else before)) <= SLACK_MS

    @precondition(lambda self: self.running is None)
    @rule(task_id=st.sampled_from(IDS), period=st.sampled_from((None, *LIFETIMES)))
    def start_run_ending_its_claim(self, task_id: str, period: float | None) -> None:
        """A copy starts as a unique run does: its lease taken and its claim given up (or its
        period started) in one call in the lean layout; on the general path the lease alone,
        then the claim's end in a call of its own. Either way the model's answer."""
        before = self.client.pttl(self.keys.queued)
        if period is None:
            want, taken = self._given_up(task_id), False
        else:
            want, taken = self._period_started(task_id)
        how = "g" if period is None else f"s{int(period * 1000)}"
        lease, ended = self.run_lock.acquire_giving_up(
            how, False, None, owner=task_id, info={"task_id": task_id}, job=None
        )
        self.running = (task_id, lease)
        if ended is None:
            assert not self.lean, "the fast path ends the claim with the lease"
            mode = ReleaseMode.GIVE_UP if period is None else ReleaseMode.START
            got = release_claim(
                self.client, self.namespace, self.name, task_id, mode=mode, keep=period or 0.0
            )
        else:
            assert self.lean, "only the fast path ends a claim in the acquire"
            got = ended.superseded_by
        assert got == want, f"start of {task_id} ({how}): got {got!r}, model says {want!r}"
        if period is not None:
            after = self.client.pttl(self.keys.queued)
            assert abs(after - (period * 1000 if taken else before)) <= SLACK_MS

    @precondition(lambda self: self.queued is not None)
    @rule()
    def force_release(self) -> None:
        """An operator frees the key, started or not."""
        holder = self.queued
        assert holder is not None
        forced = release_claim(
            self.client, self.namespace, self.name, holder, mode=ReleaseMode.FORCE
        )
        if holder in self.replaced:  # (an id once replaced is refused, even by an operator)
            assert forced == holder, forced
        else:
            assert forced is None, forced
            self.queued, self.started = None, False

    @precondition(lambda self: self.running is None)
    @rule(task_id=st.sampled_from(IDS))
    def start_run(self, task_id: str) -> None:
        """A copy starts running: it holds the run lease, recording its task id."""
        lease = self.run_lock.acquire(blocking=False, owner=task_id, info={"task_id": task_id})
        self.running = (task_id, lease)

    @precondition(lambda self: self.running is not None)
    @rule(lapse=st.booleans())
    def end_run(self, lapse: bool) -> None:
        """The running copy finishes (releases), or dies and its lease lapses (its score moves
        into the past, which the scripts cannot tell from natural expiry)."""
        assert self.running is not None
        _, lease = self.running
        self.running = None
        if not lapse:
            lease.release()
            return
        seconds, micros = self.client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        if not self.client.zadd(self.keys.leases, {lease.token: now_ms - 1}, xx=True, ch=True):
            # A fast-path lease (the lean layout): its expiry is the record's second field.
            record = _text(self.client.hget(self.keys.meta, "L") or b"").split("|")
            assert record[0] == lease.token, record
            record[1] = str(now_ms - 1)
            self.client.hset(self.keys.meta, "L", "|".join(record))
        with pytest.raises(LockNotOwned):
            lease.release()

    @precondition(lambda self: self.queued is not None)
    @rule()
    def lapse_claim(self) -> None:
        """The claim's lifetime runs out (cut to 1 ms here): the key is free again, but the
        replaced ids stay refused."""
        assert self.client.pexpire(self.keys.queued, 1)
        wait_for(lambda: not self.client.exists(self.keys.queued), "the claim lapsed")
        self.queued, self.started = None, False

    # -- checks ----------------------------------------------------------------------------

    @invariant()
    def check(self) -> None:
        """The claim key and the replaced set are the model's, and neither lives for ever."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.queued)
        pipe.smembers(self.keys.replaced)
        pipe.pttl(self.keys.queued)
        pipe.pttl(self.keys.replaced)
        queued, replaced, pttl_queued, pttl_replaced = pipe.execute()
        model = None if self.queued is None else ("!" if self.started else "") + self.queued
        assert (_text(queued) if queued is not None else None) == model
        assert {_text(r) for r in replaced} == self.replaced
        if self.queued is not None:
            assert 0 < pttl_queued <= max(LIFETIMES) * 1000
        if self.replaced:
            assert 0 < pttl_replaced <= max(LIFETIMES) * 1000

    def teardown(self) -> None:
        if self.running is not None:
            self.running[1].release()


@pytest.mark.slow
@pytest.mark.parametrize("lean", [False, True], ids=["shared", "lean"])
def test_claims_match_model(redis_server: RedisServer, lean: bool) -> None:
    """Random claims, releases, runs and lapses agree with the model, in either layout (in the
    lean one a run's claim ends in its acquire)."""
    client = redis.Redis.from_url(redis_server.url)
    namespace = "claims-lean" if lean else DEFAULT_NAMESPACE
    if lean:
        set_layout(client, namespace, "lean")
    forced = os.environ.get("REDISLOCK_TEST_LAYOUT") == "lean"  # (every namespace lean)
    machine = type(
        "ClaimModelRun",
        (ClaimModel,),
        {"client": client, "namespace": namespace, "lean": lean or forced},
    )
    try:
        run_state_machine_as_test(machine, settings=SETTINGS)
    finally:
        client.close()
