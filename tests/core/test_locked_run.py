"""The core's locked run on its own, against a real Redis (no worker, no framework): one test per
outcome of ``LockedRun.take``, with the log line's logger and the signal each one sends."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redislock import RateLimit, current_lease, current_rate
from celery_redislock.core.claims import ClaimKind, claim
from celery_redislock.core.heartbeat import Heartbeat
from celery_redislock.core.keys import LockKeys
from celery_redislock.core.layout import set_layout
from celery_redislock.core.lock import Lock
from celery_redislock.core.options import call_signature, parse_lock_option
from celery_redislock.core.rate_options import parse_rate_option
from celery_redislock.core.run import (
    AwaitFirst,
    Delivery,
    DuplicateMark,
    Fail,
    Finished,
    Framework,
    Held,
    LockedRun,
    Parked,
    RetryAfter,
    RunUnlocked,
    Signals,
    Skip,
    TaskSpec,
    make_lock,
)
from celery_redislock.core.signal import Signal
from celery_redislock.core.unique_options import parse_unique_option
from celery_redislock.errors import (
    DuplicateTask,
    LineFull,
    LockBackendError,
    LockConfigError,
    LockNotAcquired,
)

FRAMEWORK = Framework(
    word="task",
    republish_claims=False,
    own_retries=False,
    whole_seconds=False,
    rate_wait_in_place=0.05,
)


@dataclass(frozen=True)
class _Settings:
    """Just the settings a run reads (the RunSettings protocol)."""

    namespace: str = "redislock"
    ttl: float = 15.0
    on_conflict: str = "skip"
    on_backend_error: str = "fail"
    queue_allowance: float = 600.0
    completion_ttl: float = 3600.0
    fence_keep: float = 3600.0
    line_handover_window: float = 5.0
    redlock_urls: tuple[str, ...] | None = None


def sync(customer_id: int) -> None:
    """The task the runs below run."""


SIGNATURE = call_signature(sync, bound=False)


def _spec(lock: Any = None, unique: Any = None, rate: Any = None) -> TaskSpec:
    options = parse_lock_option("sync", SIGNATURE, lock)
    unique_options, options = parse_unique_option("sync", SIGNATURE, unique, options)
    rate_options = parse_rate_option("sync", SIGNATURE, rate)
    return TaskSpec("sync", options, unique_options, rate_options, SIGNATURE)


@dataclass
class Bus:
    """The five signals of a run, and what they sent."""

    signals: Signals
    sent: list[tuple[str, dict[str, Any]]]


@pytest.fixture
def bus() -> Bus:
    sent: list[tuple[str, dict[str, Any]]] = []
    made = {name: Signal(name) for name in ("acquired", "released", "conflict", "lost", "backend")}
    for name, signal in made.items():
        signal.connect(lambda sender, _name=name, **kw: sent.append((_name, kw)))
    signals = Signals(
        made["acquired"], made["released"], made["conflict"], made["lost"], made["backend"], "sync"
    )
    return Bus(signals, sent)


def _run(
    client: Any,
    spec: TaskSpec,
    task_id: str,
    bus: Bus,
    settings: _Settings | None = None,
    **facts: Any,
) -> LockedRun:
    delivery = Delivery(task_id, (42,), {}, **facts)
    return LockedRun(
        spec,
        delivery,
        settings or _Settings(),
        client,
        bus.signals,
        FRAMEWORK,
        max_conflict_retries=2,
    )


def test_held_then_released_with_the_finish_record_then_a_copy_is_dropped(
    client: redis.Redis, bus: Bus
) -> None:
    spec = _spec(lock="sync:{customer_id}")
    run = _run(client, spec, "a", bus, finish_job="a.0")
    outcome = run.take()
    assert isinstance(outcome, Held) and outcome.lease is not None
    assert outcome.lease.name == "sync:42"
    run.release(finished=True)
    assert [name for name, _ in bus.sent] == ["acquired", "released"]
    copy = _run(client, spec, "a", bus, finish_job="a.0").take()
    assert copy == Finished("sync:42", ["a"])
    assert bus.sent[-1] == (
        "conflict",
        {
            "task_id": "a",
            "lock": "sync:42",
            "action": "drop",
            "holders": ["a"],
            "retry_after": None,
        },
    )


def test_skip_names_the_holder(
    client: redis.Redis, bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_redislock")
    spec = _spec(lock="sync:{customer_id}")
    first = _run(client, spec, "a", bus)
    assert isinstance(first.take(), Held)
    try:
        assert _run(client, spec, "b", bus).take() == Skip("skipped", "sync:42", ["a"])
    finally:
        first.release(finished=False)
    line = [r for r in caplog.records if r.name == "celery_redislock.core.outcomes"][-1]
    assert line.getMessage() == "task sync[b] skipped: lock 'sync:42' is held by a"
    assert (
        "conflict",
        {
            "task_id": "b",
            "lock": "sync:42",
            "action": "skip",
            "holders": ["a"],
            "retry_after": None,
        },
    ) in bus.sent


def test_retry_backs_off_then_gives_up_past_max_retries(client: redis.Redis, bus: Bus) -> None:
    spec = _spec(lock={"key": "sync:{customer_id}", "on_conflict": "retry", "countdown": 2})
    first = _run(client, spec, "a", bus)
    assert isinstance(first.take(), Held)
    try:
        again = _run(client, spec, "b", bus).take()
        assert isinstance(again, RetryAfter) and again.cause == "conflict"
        assert 1.0 <= again.delay <= 2.0 and again.conflicts == 0
        given_up = _run(client, spec, "b", bus, conflicts=2).take()
        assert isinstance(given_up, Fail) and isinstance(given_up.error, LockNotAcquired)
        assert "gave up after 2 conflict retries: lock 'sync:42' is held by a" in str(
            given_up.error
        )
    finally:
        first.release(finished=False)


def test_wait_fails_after_its_timeout(client: redis.Redis, bus: Bus) -> None:
    spec = _spec(lock={"key": "sync:{customer_id}", "on_conflict": "wait", "timeout": 0.2})
    first = _run(client, spec, "a", bus)
    assert isinstance(first.take(), Held)
    try:
        outcome = _run(client, spec, "b", bus).take()
    finally:
        first.release(finished=False)
    assert isinstance(outcome, Fail)
    assert str(outcome.error).endswith("is held by a after waiting 0.2s")


def test_a_second_delivery_of_the_same_task_awaits_the_first(client: redis.Redis, bus: Bus) -> None:
    spec = _spec(lock="sync:{customer_id}")
    first = _run(client, spec, "a", bus, finish_job="a.0")
    assert isinstance(first.take(), Held)
    try:
        outcome = _run(client, spec, "a", bus, finish_job="a.0", waits=1).take()
    finally:
        first.release(finished=False)
    assert isinstance(outcome, AwaitFirst) and outcome.waits == 1 and outcome.delay > 0


def test_queue_parks_then_a_full_line_fails(client: redis.Redis, bus: Bus) -> None:
    spec = _spec(lock={"key": "sync:{customer_id}", "on_conflict": "queue", "max_waiting": 1})
    first = _run(client, spec, "a", bus)
    assert isinstance(first.take(), Held)
    try:
        payload = lambda lock, token: f"entry {token}"  # noqa: E731
        parked = _run(client, spec, "b", bus, payload=payload).take()
        assert isinstance(parked, Parked) and parked.holders == ["a"]
        assert parked.place.parked == 1
        full = _run(client, spec, "c", bus, payload=payload).take()
        assert isinstance(full, Fail) and isinstance(full.error, LineFull)
        assert full.mark == "full"
    finally:
        first.release(finished=False)


def test_a_wait_in_line_that_ended_fails_without_running(client: redis.Redis, bus: Bus) -> None:
    spec = _spec(lock={"key": "sync:{customer_id}", "on_conflict": "queue", "max_wait": 1})
    outcome = _run(client, spec, "a", bus, line_token=None, line_ended=True).take()
    assert isinstance(outcome, Fail) and outcome.mark == "expired"
    assert "longer than max_wait (1s)" in str(outcome.error)


@pytest.mark.parametrize("policy", ["fail", "retry", "run"])
def test_redis_down_follows_the_policy(policy: str, bus: Bus) -> None:
    down = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    spec = _spec(lock="sync:{customer_id}")
    outcome = _run(down, spec, "a", bus, _Settings(on_backend_error=policy)).take()
    if policy == "fail":
        assert isinstance(outcome, Fail) and isinstance(outcome.error, LockBackendError)
    elif policy == "retry":
        assert isinstance(outcome, RetryAfter) and outcome.cause == "backend"
    else:
        assert isinstance(outcome, RunUnlocked)
    assert [name for name, _ in bus.sent] == ["backend"]
    assert bus.sent[0][1]["policy"] == policy


def test_a_rate_slot_ahead_comes_back_for_it(client: redis.Redis, bus: Bus) -> None:
    spec = _spec(rate={"rate": "1/m", "key": "sync:{customer_id}"})
    assert _run(client, spec, "a", bus, rate_request="a.0").take() == Held(None)
    later = _run(client, spec, "b", bus, rate_request="b.0").take()
    assert isinstance(later, RetryAfter) and later.cause == "rate" and later.delay > 50


def test_a_rate_slot_ahead_is_signalled_with_its_retry_after(client: redis.Redis, bus: Bus) -> None:
    spec = _spec(rate={"rate": "1/m", "key": "sync:{customer_id}", "max_delay": 5})
    assert _run(client, spec, "a", bus, rate_request="a.0").take() == Held(None)
    refused = _run(client, spec, "b", bus, rate_request="b.0").take()
    assert isinstance(refused, Fail) and isinstance(refused.error, LockNotAcquired)
    assert refused.error.retry_after is not None and 55 < refused.error.retry_after <= 63
    (conflict,) = [kw for name, kw in bus.sent if name == "conflict"]
    assert conflict["action"] == "rate" and conflict["retry_after"] == refused.error.retry_after


def test_the_running_task_sees_its_rate_slot_until_it_is_released(
    client: redis.Redis, bus: Bus
) -> None:
    # (10 per 1,000 s: no unit comes back between two calls on a loaded machine)
    spec = _spec(rate={"rate": "10/1000s", "key": "sync:{customer_id}", "burst": 5, "cost": 4})
    run = _run(client, spec, "a", bus, rate_request="a.0")
    assert current_rate() is None
    assert run.take() == Held(None)
    slot = current_rate()
    assert slot is not None and slot.name == "sync:42" and slot.reservation.cost == 4.0
    assert slot.reservation.burst == 5 and slot.waited >= 0
    slot.settle(1)  # 3 units back: the bucket holds 5 - 1 units again
    limit = RateLimit(client, "sync:42", "10/1000s", burst=5)
    assert limit.usage().available == pytest.approx(4, abs=0.01)
    run.release(finished=True)
    assert current_rate() is None


def test_a_cost_function_that_fails_fails_the_run_naming_the_task(
    client: redis.Redis, bus: Bus
) -> None:
    spec = _spec(rate={"rate": "10/s", "cost": lambda customer_id: 1 / 0})
    failed = _run(client, spec, "a", bus, rate_request="a.0").take()
    assert isinstance(failed, Fail) and isinstance(failed.error, LockConfigError)
    assert "task 'sync': rate option 'cost': the cost function failed" in str(failed.error)
    spec = _spec(rate={"rate": "10/s", "cost": lambda customer_id: "many"})
    failed = _run(client, spec, "b", bus, rate_request="b.0").take()
    assert isinstance(failed, Fail) and "cost function's answer must be a number" in str(
        failed.error
    )
    assert client.keys("*") == []  # nothing reserved


def test_a_copy_replaced_under_its_unique_key_is_superseded(client: redis.Redis, bus: Bus) -> None:
    spec = _spec(unique="until_started")
    assert spec.unique is not None
    run = _run(client, spec, "old", bus)
    claim(
        client,
        "redislock",
        run.unique_name(),
        task_id="new",
        lifetime=60,
        kind=ClaimKind.NEW,
        running_counts=False,
    )
    outcome = run.take()
    assert isinstance(outcome, Skip) and outcome.kind == "superseded"
    assert outcome.holders == ["new"] and run.lease is None


def test_a_workflow_step_published_as_a_duplicate_fails_at_once_taking_nothing(
    client: redis.Redis, bus: Bus
) -> None:
    """A delivery marked as a duplicate (a chain's next link that the framework published
    although a copy holds its unique key) fails with DuplicateTask naming that copy, takes
    no lease, and leaves the holder's claim alone, also as the run ends."""
    spec = _spec(unique="until_finished")
    holder = _run(client, spec, "holder", bus)
    claim(
        client,
        "redislock",
        holder.unique_name(),
        task_id="holder",
        lifetime=60,
        kind=ClaimKind.NEW,
        running_counts=True,
    )
    mark = DuplicateMark("holder", holder.unique_name(), "queued")
    run = _run(client, spec, "step", bus, duplicate=mark)
    outcome = run.take()
    assert isinstance(outcome, Fail) and isinstance(outcome.error, DuplicateTask)
    assert outcome.error.task_id == "holder" and outcome.error.state == "queued"
    assert "task sync[step]: a copy (holder) is already queued" in str(outcome.error)
    assert run.lease is None and bus.sent == []
    run.end_claim()
    run.release(finished=True)
    assert client.get(LockKeys.of("redislock", holder.unique_name()).queued) == b"holder"


def test_a_duplicate_mark_is_read_from_what_a_message_carries() -> None:
    mark = DuplicateMark("h", "fin:x", "running")
    assert DuplicateMark.decode(mark.encode()) == mark
    assert DuplicateMark.decode(None) is None
    assert DuplicateMark.decode({"holder": "h", "name": 1, "state": "queued"}) is None


# -- lock= as a list: several locks, all or nothing ------------------------------------------


def test_a_lock_list_holds_every_lock_renewed_and_gives_each_back(
    client: redis.Redis, bus: Bus
) -> None:
    spec = _spec(lock=[{"key": "sync:{customer_id}", "ttl": 1}, {"key": "api", "ttl": 1}])
    run = _run(client, spec, "a", bus, finish_job="a.0")
    assert isinstance(run.take(), Held)
    assert [lease.name for lease in (run.lease, *run.more_leases)] == ["sync:42", "api"]  # type: ignore[union-attr]
    locks = [Lock(client, name, ttl=1) for name in ("sync:42", "api")]
    # Past three ttls, both leases are still held: the heartbeat renews each.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert all(lk.locked() for lk in locks)
        time.sleep(0.1)
    run.release(finished=True)
    assert not any(lk.locked() for lk in locks)
    assert [n for n, _ in bus.sent] == ["acquired", "acquired", "released", "released"]
    # A copy delivered again meets the finish record (kept by the first lock).
    assert _run(client, spec, "a", bus, finish_job="a.0").take() == Finished("sync:42", ["a"])


def test_a_lock_list_conflict_names_the_lock_with_no_room(client: redis.Redis, bus: Bus) -> None:
    spec = _spec(lock=["sync:{customer_id}", {"key": "api", "limit": 1}])
    other = _spec(lock="api")
    holder = _run(client, other, "h", bus)
    assert isinstance(holder.take(), Held)
    try:
        assert _run(client, spec, "b", bus).take() == Skip("skipped", "api", ["h"])
        assert client.keys("*sync:42*") == []
    finally:
        holder.release(finished=False)


def test_a_lock_list_copy_of_a_running_task_awaits_the_first(client: redis.Redis, bus: Bus) -> None:
    spec = _spec(lock=["sync:{customer_id}", "api"])
    first = _run(client, spec, "a", bus, finish_job="a.0")
    assert isinstance(first.take(), Held)
    try:
        outcome = _run(client, spec, "a", bus, finish_job="a.0", waits=1).take()
        assert isinstance(outcome, AwaitFirst)
    finally:
        first.release(finished=False)


def test_a_lock_list_whose_keys_make_one_name_fails(client: redis.Redis, bus: Bus) -> None:
    spec = _spec(lock=["sync:{customer_id}", "sync:42"])
    outcome = _run(client, spec, "a", bus).take()
    assert isinstance(outcome, Fail) and isinstance(outcome.error, LockConfigError)
    assert "make the name 'sync:42'" in str(outcome.error)
    assert client.keys("*") == []


# -- a paused lock, and the running task's lease -----------------------------------------------


def test_a_paused_lock_skips_saying_so_and_a_retry_waits_out_the_pause(
    client: redis.Redis, bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_redislock")
    Lock(client, "sync:42", ttl=5).pause(60)
    assert _run(client, _spec(lock="sync:{customer_id}"), "a", bus).take() == Skip(
        "skipped", "sync:42", []
    )
    line = [r for r in caplog.records if r.name == "celery_redislock.core.outcomes"][-1]
    assert line.getMessage().startswith("task sync[a] skipped: lock 'sync:42' is paused for ")
    conflict = bus.sent[-1][1]
    assert conflict["action"] == "skip" and 55 < conflict["retry_after"] <= 60
    spec = _spec(lock={"key": "sync:{customer_id}", "on_conflict": "retry", "countdown": 1})
    again = _run(client, spec, "b", bus).take()
    assert isinstance(again, RetryAfter) and 55 < again.delay <= 60  # not 1 s: the pause's end


def test_the_running_task_s_lease_is_current_and_pauses_its_lock(
    client: redis.Redis, bus: Bus
) -> None:
    assert current_lease() is None
    run = _run(client, _spec(lock="sync:{customer_id}"), "a", bus)
    assert isinstance(run.take(), Held)
    lease = current_lease()
    assert lease is run.lease and lease is not None
    assert 29 < lease.pause(30) <= 30
    assert 29 < Lock(client, "sync:42", ttl=5).paused_for() <= 30
    run.release(finished=False)
    assert current_lease() is None
    assert _run(client, _spec(lock="sync:{customer_id}"), "b", bus).take() == Skip(
        "skipped", "sync:42", []
    )
    with pytest.raises(LockConfigError, match="pause must be"):
        Lock(client, "sync:42", ttl=5).pause(0)


@pytest.mark.parametrize(
    ("on_conflict", "outcome"),
    [("skip", Skip), ("retry", RetryAfter), ("queue", Parked), ("raise", Fail)],
)
def test_a_task_on_a_paused_key_meets_it_as_held(
    client: redis.Redis, bus: Bus, on_conflict: str, outcome: type
) -> None:
    Lock(client, "sync:42", ttl=5).pause(30)
    spec = _spec(lock={"key": "sync:{customer_id}", "on_conflict": on_conflict})
    payload = lambda lock, token: f"entry {token}"  # noqa: E731
    assert isinstance(_run(client, spec, "a", bus, payload=payload).take(), outcome)
    assert not Lock(client, "sync:42", ttl=5).locked()


def test_each_call_gets_its_own_lock_made_from_one_per_settings(client: redis.Redis) -> None:
    """make_lock makes each call's lock from one made per client and settings (Lock.named):
    the name, keys, hand-over and re-entries are the call's; the settings are the ones asked
    for, and settings that differ make another lock."""
    options = _spec(lock={"key": "t:{customer_id}", "ttl": 20}).lock
    assert options is not None

    def handover(handed: Any) -> None: ...

    first = make_lock(_Settings(), client, options, "t:1")
    second = make_lock(_Settings(), client, options, "t:2", handover)
    assert (first.name, second.name) == ("t:1", "t:2")
    assert first.keys.leases != second.keys.leases and second.keys.leases.endswith("{t:2}:leases")
    assert (first.handover, second.handover) == (None, handover)
    assert (first.ttl, second.ttl, first.spec) == (20.0, 20.0, second.spec)
    # Each copy keeps its own stack of the leases entered with `with`: left out of order, each
    # gives back its own.
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not first.locked() and second.locked()
    second.__exit__(None, None, None)
    assert not second.locked()
    other = make_lock(_Settings(namespace="elsewhere"), client, options, "t:1")
    assert other.keys.leases.startswith("elsewhere:") and first.keys.leases.startswith("redislock:")
    with pytest.raises(LockConfigError, match="name"):
        make_lock(_Settings(), client, options, "")


def test_a_lapse_the_task_saw_first_is_logged_as_it_lets_go(
    client: redis.Redis, bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    """No renewal answered in time (its Redis frozen): the task's check() saw the lapse and it
    ended; the loss is reported as the run lets go of the lease, and the line says so rather
    than that the task goes on."""
    caplog.set_level(logging.INFO, logger="celery_redislock")
    run = _run(client, _spec(lock="sync:{customer_id}"), "a", bus)
    held = run.take()
    assert isinstance(held, Held) and held.lease is not None
    token = held.lease.token
    # (The heartbeat's lock, re-entrant, keeps its thread from reporting the lapse first.)
    with Heartbeat.current()._cond:
        held.lease.valid_until = time.monotonic()  # as if no renewal came back
        run.release(finished=False)
    [line] = [r for r in caplog.records if r.name == "celery_redislock.core.outcomes"]
    assert line.levelno == logging.ERROR and line.getMessage() == (
        f"task sync[a]: lease on lock 'sync:42' lost (lock 'sync:42': lease {token} lapsed "
        "before Redis answered its renewal); seen as the task let go of it"
    )
    assert [name for name, _ in bus.sent] == ["acquired", "lost", "released"]


@pytest.mark.parametrize("layout", ["shared", "lean"])
def test_a_unique_run_ends_its_claim_as_it_takes_its_lease(
    client: redis.Redis, bus: Bus, layout: str
) -> None:
    """Unique until finished, keyed as its lock: the lease is taken and the queued claim given
    up; in the lean layout in the acquire's one script call. A copy replaced meanwhile is
    superseded there too, and gives its lease back."""
    settings = _Settings(namespace=f"claims-{layout}")
    set_layout(client, settings.namespace, layout)
    lean = layout == "lean" or os.environ.get("REDISLOCK_TEST_LAYOUT") == "lean"
    spec = _spec(unique="until_finished")

    def claimed(task_id: str, kind: ClaimKind = ClaimKind.NEW) -> None:
        name = _run(client, spec, task_id, bus, settings).unique_name()
        claim(
            client,
            settings.namespace,
            name,
            task_id=task_id,
            lifetime=60,
            kind=kind,
            running_counts=True,
        )

    claimed("t-0")
    warm = _run(client, spec, "t-0", bus, settings)  # (scripts loaded, the layout read)
    assert isinstance(warm.take(), Held)
    warm.release(finished=True)
    claimed("t-1")
    run = _run(client, spec, "t-1", bus, settings)
    keys = LockKeys.of(settings.namespace, run.unique_name())
    client.config_resetstat()
    assert isinstance(run.take(), Held)
    calls = client.info("commandstats")["cmdstat_evalsha"]["calls"]
    assert calls == (1 if lean else 2)  # the acquire (and the claim's end, apart)
    assert client.exists(keys.queued) == 0
    run.release(finished=True)

    claimed("t-2")
    claimed("t-3", ClaimKind.REPLACE)
    old = _run(client, spec, "t-2", bus, settings)
    outcome = old.take()
    assert isinstance(outcome, Skip) and outcome.kind == "superseded"
    assert outcome.holders == ["t-3"] and old.lease is None
    assert not Lock(client, run.unique_name(), ttl=1, namespace=settings.namespace).locked()
    assert client.get(keys.queued) == b"t-3"
