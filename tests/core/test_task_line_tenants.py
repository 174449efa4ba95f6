"""Tenants in the task line: tasks parked with a ``tenant`` are handed the lock tenant by tenant
in turn (one task each, whatever each has waiting; within a tenant by priority, then arrival),
with every guarantee of the line kept: nothing parked is lost, a lapsed hand-over goes back at
its tenant's old turn, max_wait and max_waiting hold, and the keys go once the line is empty."""

from __future__ import annotations

import inspect
from typing import Any

import hypothesis.strategies as st
import pytest
import redis
from helpers import wait_for
from hypothesis import HealthCheck, given, settings

from celery_redislock import LineFull, Lock, LockConfigError
from celery_redislock.core import admin
from celery_redislock.core.line import Parked, drop_hand_over, park, sweep, tenant_key
from celery_redislock.core.naming import tenant_of
from celery_redislock.core.options import parse_lock_option


class Publisher:
    """Records what a lock hands over, in order (the integrations publish a message here)."""

    def __init__(self, fail: bool = False) -> None:
        self.tokens: dict[str, str] = {}
        self.payloads: list[str] = []
        self.fail = fail

    def __call__(self, handed: object) -> None:
        if self.fail:
            raise ConnectionError("broker down")
        payload, token = handed.payload, handed.token  # type: ignore[attr-defined]
        self.payloads.append(payload)
        self.tokens[payload] = token


def _lock(client: redis.Redis, publisher: Publisher, **kw: object) -> Lock:
    return Lock(client, "tenant-line", ttl=30, handover=publisher, **kw)  # type: ignore[arg-type]


def _park(lock: Lock, task: str, tenant: str | None, priority: int = 0) -> Parked:
    got = park(lock, task, owner=task, tenant=tenant, priority=priority)
    assert isinstance(got, Parked), f"{task} was not parked"
    return got


def _run_line(lock: Lock, publisher: Publisher, limit: int = 10_000) -> list[str]:
    """Runs every task the line hands over, one after the other, as workers would (each claims
    its hand-over with its token and releases); returns them in the order they ran."""
    ran: list[str] = []
    while len(ran) < len(publisher.payloads) and len(ran) < limit:
        task = publisher.payloads[len(ran)]
        got = park(lock, task, token=publisher.tokens[task], owner=task)
        assert not isinstance(got, Parked), f"{task}'s hand-over was not its own"
        ran.append(task)
        got.release()
    return ran


def _left(client: redis.Redis, lock: Lock) -> list[str]:
    """The lock's keys that still exist (the meta key, for its fence mark, may stay)."""
    return [k for k in lock.keys.all if k != lock.keys.meta and client.exists(k)]


def test_tenants_take_turns_whatever_each_has_waiting(client: redis.Redis) -> None:
    """A floods the line with 50 tasks; B sends 3 after they parked: B's start within the first
    six, one in every two, and nothing is lost."""
    publisher = Publisher()
    lock = _lock(client, publisher)
    held = lock.acquire(owner="x")
    flood = [f"a{i}" for i in range(50)]
    for task in flood:
        _park(lock, task, "A")
    for task in ("b0", "b1", "b2"):
        _park(lock, task, "B")
    held.release()
    ran = _run_line(lock, publisher)
    assert ran[:7] == ["a0", "b0", "a1", "b1", "a2", "b2", "a3"]
    assert ran == ["a0", "b0", "a1", "b1", "a2", "b2", *flood[3:]]
    assert _left(client, lock) == []
    meta = {k.decode() for k in client.hkeys(lock.keys.meta)}
    assert not any(k[:2] in ("q:", "p:", "t:", "c:") for k in meta), meta


def test_a_tenant_new_to_the_line_takes_its_turn_from_its_arrival(client: redis.Redis) -> None:
    """Three tenants and tasks without a tenant: each tenant holds one place, served in turn
    and sent to the end of the line; a task without a tenant is a place of its own."""
    publisher = Publisher()
    lock = _lock(client, publisher)
    held = lock.acquire(owner="x")
    for task, tenant in [
        ("a0", "A"),
        ("a1", "A"),
        ("a2", "A"),
        ("b0", "B"),
        ("p0", None),
        ("b1", "B"),
        ("c0", "C"),
        ("p1", None),
    ]:
        _park(lock, task, tenant)
    held.release()
    # Places by arrival: A, B, p0, C, p1; A and B come back at the end once served.
    assert _run_line(lock, publisher) == ["a0", "b0", "p0", "c0", "p1", "a1", "b1", "a2"]
    assert _left(client, lock) == []


def test_priority_orders_the_tasks_of_one_tenant(client: redis.Redis) -> None:
    publisher = Publisher()
    lock = _lock(client, publisher)
    held = lock.acquire(owner="x")
    _park(lock, "a0", "A")
    _park(lock, "a-low", "A", priority=-5)
    _park(lock, "b0", "B")
    _park(lock, "a-high", "A", priority=10)
    _park(lock, "a-high2", "A", priority=10)
    held.release()
    # A's by priority, then arrival, taking turns with B: a priority never takes B's turn.
    assert _run_line(lock, publisher) == ["a-high", "b0", "a-high2", "a0", "a-low"]


def test_a_lapsed_hand_over_goes_back_at_its_tenants_turn(client: redis.Redis) -> None:
    """a0's hand-over is never published (the broker is down): its lease lapses and a0 is back
    at the head of the line, its tenant's place at the turn it was served at; the turns go on
    as if nothing had happened."""
    failing = Publisher(fail=True)
    lock = _lock(client, failing)
    held = lock.acquire(owner="x")
    for task, tenant in [("a0", "A"), ("a1", "A"), ("b0", "B"), ("b1", "B")]:
        _park(lock, task, tenant)
    held.release()  # handed to a0; its publish fails
    [a0] = [t.decode() for t in client.zrange(lock.keys.leases, 0, -1)]
    assert client.hget(lock.keys.meta, f"t:{a0}") is not None  # the turn it was served at
    client.zadd(lock.keys.leases, {a0: 1})  # its publish window passed
    publisher = Publisher()
    working = _lock(client, publisher)
    sweep(working)
    assert publisher.payloads == ["a0"]
    assert _run_line(working, publisher) == ["a0", "b0", "a1", "b1"]
    assert _left(client, lock) == []


def test_a_lapsed_hand_over_under_a_cap_goes_back_alone(client: redis.Redis) -> None:
    """Under a cap of 2, two tenants are handed the lock at once; one hand-over lapses: that
    task alone goes back in line, ahead of its tenant's other tasks, and runs once."""
    failing = Publisher(fail=True)
    lock = _lock(client, failing, limit=2)
    h1, h2 = lock.acquire(owner="x"), lock.acquire(owner="y")
    for task, tenant in [("a0", "A"), ("a1", "A"), ("b0", "B")]:
        _park(lock, task, tenant)
    h1.release()
    h2.release()  # handed to a0 and b0, both publishes fail
    tokens = [t.decode() for t in client.zrange(lock.keys.leases, 0, -1)]
    assert len(tokens) == 2
    client.zadd(lock.keys.leases, dict.fromkeys(tokens, 1))
    publisher = Publisher()
    sweep(_lock(client, publisher, limit=2))
    assert sorted(publisher.payloads) == ["a0", "b0"]
    ran = _run_line(_lock(client, publisher, limit=2), publisher)
    assert sorted(ran) == ["a0", "a1", "b0"] and ran.index("a0") < ran.index("a1")
    assert _left(client, lock) == []


def test_tasks_leave_their_tenant_when_dropped_or_expired(client: redis.Redis) -> None:
    """A revoked task (line_drop) and a task past max_wait leave the line from among their
    tenant's; the tenant's place goes with its last task."""
    publisher = Publisher()
    lock = _lock(client, publisher)
    held = lock.acquire(owner="x")
    _park(lock, "a0", "A")
    b0 = _park(lock, "b0", "B")
    late = park(lock, "b-late", owner="b-late", tenant="B", max_wait=1)
    assert isinstance(late, Parked)
    _park(lock, "c0", "C")
    assert drop_hand_over(lock, b0.token)  # revoked while in line
    wait_for(lambda: sweep(lock).parked == 2, "b-late past its wait", timeout=30)
    assert publisher.payloads == ["b-late"]  # published as expired, not handed the lock
    assert client.zscore(lock.keys.all[2], "#" + tenant_key("B")[:16]) is None
    assert client.zcard(lock.keys.tenants) == 2
    publisher.payloads.clear()
    held.release()
    assert _run_line(lock, publisher) == ["a0", "c0"]
    assert _left(client, lock) == []


def test_max_waiting_counts_every_tenants_tasks(client: redis.Redis) -> None:
    lock = _lock(client, Publisher())
    held = lock.acquire(owner="x")
    park(lock, "a0", owner="a0", tenant="A", max_waiting=2)
    park(lock, "b0", owner="b0", tenant="B", max_waiting=2)
    with pytest.raises(LineFull):
        park(lock, "c0", owner="c0", tenant="C", max_waiting=2)
    with pytest.raises(LineFull):
        park(lock, "p0", owner="p0", max_waiting=2)
    held.release()


def test_a_park_run_twice_or_abandoned_leaves_one_entry_or_none(client: redis.Redis) -> None:
    """The same park sent again (its reply was lost) finds its place among its tenant's; a
    park given up after an error leaves nothing behind."""
    lock = _lock(client, Publisher())
    held = lock.acquire(owner="x")
    first = _park(lock, "a0", "A")
    again = park(lock, "a0", token=first.token, owner="a0", tenant="A")
    assert isinstance(again, Parked) and again.parked == 1
    assert client.zcard(lock.keys.tenants) == 1
    lock._abandon(first.token)  # what park() does after a LockBackendError
    assert client.zcard(lock.keys.tenants) == 0
    assert client.zcard(lock.keys.all[2]) == 0
    held.release()
    assert _left(client, lock) == []


def test_a_tenants_task_records_its_tenant(client: redis.Redis) -> None:
    publisher = Publisher()
    lock = _lock(client, publisher)
    held = lock.acquire(owner="x")
    _park(lock, "a0", "acme", priority=3)
    held.release()
    [holder] = lock.holders()
    assert holder.info["tenant"] == "acme" and holder.info["priority"] == "3"


@pytest.mark.parametrize("priority", [2**31, -(2**31) - 1, True, 1.5, "1"])
def test_a_priority_outside_the_range_is_refused(client: redis.Redis, priority: object) -> None:
    lock = _lock(client, Publisher())
    with pytest.raises(LockConfigError, match="priority must be an int"):
        park(lock, "a", owner="a", tenant="A", priority=priority)  # type: ignore[arg-type]


def test_tenant_keys_sort_by_priority_then_equal_texts_are_one_tenant() -> None:
    assert tenant_key("A", 5) < tenant_key("A", 0) < tenant_key("A", -5)
    assert tenant_key("A", 2**31 - 1)[16:] == "00000000"
    assert tenant_key("A", -(2**31))[16:] == "ffffffff"
    assert tenant_key("A")[:16] == tenant_key("A", 7)[:16] != tenant_key("B")[:16]


class Turns:
    """The rotation in plain Python: a place per task without a tenant and per tenant with
    tasks waiting, served by turn; a tenant served goes to the end while it has tasks left."""

    def __init__(self) -> None:
        self.seq = 0
        self.places: dict[str, int] = {}
        self.tasks: dict[str, list[tuple[int, int, str]]] = {}

    def park(self, task: str, tenant: str | None, priority: int) -> None:
        self.seq += 1
        if tenant is None:
            self.places[task] = self.seq
        else:
            self.tasks.setdefault(tenant, []).append((-priority, self.seq, task))
            self.places.setdefault("#" + tenant, self.seq)

    def serve(self) -> str | None:
        if not self.places:
            return None
        place = min(self.places, key=self.places.__getitem__)
        if not place.startswith("#"):
            del self.places[place]
            return place
        waiting = sorted(self.tasks[place[1:]])
        task = waiting.pop(0)[2]
        self.tasks[place[1:]] = waiting
        if waiting:
            self.seq += 1
            self.places[place] = self.seq
        else:
            del self.places[place]
        return task


STEPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from([None, "A", "B", "C"]), st.integers(-2, 2)),
        st.just("serve"),
    ),
    max_size=40,
)


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=STEPS)
def test_the_line_serves_as_the_rotation_model_says(
    client: redis.Redis, steps: list[tuple[str | None, int] | str]
) -> None:
    """Tasks with and without tenants and priorities park while the lock is held, the holder
    releases at any point: each hand-over goes to the task the plain-Python rotation names."""
    client.flushall()
    publisher = Publisher()
    lock = _lock(client, publisher)
    model = Turns()
    holder = lock.acquire(owner="outside")
    for n, step in enumerate([*steps, *["serve"] * 45]):
        if step == "serve":
            if holder is None:
                continue
            before = len(publisher.payloads)
            holder.release()
            holder = None
            expected = model.serve()
            handed = publisher.payloads[before:]
            assert handed == ([] if expected is None else [expected])
            if expected is not None:
                got = park(lock, expected, token=publisher.tokens[expected], owner=expected)
                assert not isinstance(got, Parked)
                holder = got
            continue
        tenant, priority = step
        task = f"t{n}"
        got = park(lock, task, owner=task, tenant=tenant, priority=priority)
        if isinstance(got, Parked):
            model.park(task, tenant, priority)
        else:
            assert holder is None and not model.places  # a free lock, nobody in line
            holder = got
    assert holder is None and not model.places
    assert _left(client, lock) == []


# -- the option: parsed at declaration, made from the call as the key is ---------------------------


def _sync(account: str, order: int, rush: bool = False) -> None: ...


def _tenant(lock: dict[str, Any], *args: Any, **kwargs: Any) -> tuple[str, int] | None:
    options = parse_lock_option("sync", inspect.signature(_sync), lock)  # type: ignore[arg-type]
    assert options is not None
    return tenant_of("sync", options, inspect.signature(_sync), args, kwargs)


def test_the_tenant_is_made_from_the_call_as_the_key_is() -> None:
    lock = {"key": "sync", "on_conflict": "queue", "tenant": "acct:{account}"}
    assert _tenant(lock, "acme", 1) == _tenant(lock, account="acme", order=2) == ("acct:acme", 0)
    assert _tenant(lock, "}x{", 1) == ("acct:%7Dx%7B", 0)  # the key's canonical text
    assert _tenant({"key": "sync", "on_conflict": "queue"}, "acme", 1) is None
    by_function = {
        "key": "sync",
        "on_conflict": "queue",
        "tenant": lambda account, order, rush=False: account.upper(),
        "priority": lambda account, order, rush=False: 10 if rush else 0,
    }
    assert _tenant(by_function, "acme", 1, rush=True) == ("ACME", 10)
    assert _tenant(by_function, "acme", order=1) == ("ACME", 0)
    fixed = {**lock, "priority": -3}
    assert _tenant(fixed, "acme", 1) == ("acct:acme", -3)


@pytest.mark.parametrize(
    ("lock", "message"),
    [
        (
            {"tenant": lambda account, order, rush=False: None},
            r"task 'sync': tenant function .* returned None; return the tenant",
        ),
        (
            {"tenant": "{account}", "priority": lambda account, order, rush=False: "high"},
            r"task 'sync': priority function .* returned 'high'; return an int from -2147483648",
        ),
        (
            {"tenant": "{account}", "priority": lambda account, order, rush=False: 2**40},
            r"task 'sync': priority function .* returned 1099511627776, outside -2147483648",
        ),
        (
            {"tenant": "{account}", "priority": lambda account, order, rush=False: {}["x"]},
            r"task 'sync': priority function .* raised: KeyError",
        ),
        (
            {"tenant": "{account.missing}"},
            r"task 'sync': tenant template '\{account.missing\}': cannot fill it from the call",
        ),
    ],
)
def test_a_call_that_cannot_make_its_tenant_is_refused(lock: dict[str, Any], message: str) -> None:
    with pytest.raises(LockConfigError, match=message):
        _tenant({"key": "sync", "on_conflict": "queue", **lock}, "acme", 1)


def test_an_operator_sees_each_tenants_tasks_at_its_turn(client: redis.Redis) -> None:
    lock = _lock(client, Publisher())
    held = lock.acquire(owner="x")
    _park(lock, "a0", "A")
    _park(lock, "p0", None)
    _park(lock, "b0", "B")
    _park(lock, "a1", "A", priority=1)
    state = admin.describe_lock(client, "tenant-line")
    assert [w.owner for w in state.waiters] == ["a1", "a0", "p0", "b0"]
    assert [w.info.get("tenant") for w in state.waiters] == ["A", "A", None, "B"]
    assert [w.position for w in state.waiters] == [1, 2, 3, 4]
    held.release()


def test_a_line_without_tenants_never_looks_for_them(client: redis.Redis) -> None:
    """A line without tenants pays nothing for them: no tenant command runs, no key is made
    (the cost measured per parked task, 86 commands from park to release, is in docs/line.md)."""
    publisher = Publisher()
    lock = _lock(client, publisher)
    held = lock.acquire(owner="x")
    for n in range(5):
        _park(lock, f"p{n}", None)
    client.config_resetstat()
    held.release()
    assert _run_line(lock, publisher) == [f"p{n}" for n in range(5)]
    assert "cmdstat_zrangebylex" not in client.info("commandstats")
    assert not client.exists(lock.keys.tenants)
