"""A stateful property test of the task line against a real Redis: tasks park, hold, finish,
and are handed over through a "broker" that may fail to publish, deliver twice or deliver late,
while hand-overs lapse and sweeps run. Whatever the interleaving: never more holders than the
limit, no task runs twice, and once the faults stop every task has run exactly once. With
tenants, the same, and each tenant's tasks are handed the lock in their order of arrival."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import hypothesis.strategies as st
import pytest
import redis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from celery_redislock import JobFinished, Lease, Lock, LockNotAcquired
from celery_redislock.core.line import Handed, Parked, is_line_token, park, sweep


@dataclass
class Message:
    task: str
    token: str


@dataclass
class World:
    broker: list[Message] = field(default_factory=list)
    failing: bool = False
    handed: list[str] = field(default_factory=list)
    """Tasks in the order they were first handed the lock (publish attempts)."""

    def publish(self, handed: Handed) -> None:
        if handed.payload not in self.handed:
            self.handed.append(handed.payload)
        if self.failing:
            raise ConnectionError("broker down")
        self.broker.append(Message(task=handed.payload, token=handed.token))


def _job(task: str, token: str) -> str:
    return f"{task}.{token}"


class LineModel(RuleBasedStateMachine):
    client: redis.Redis
    limit = 1
    tenants: tuple[str, ...] = ()  # the tenants tasks are parked under (none: no tenant)

    def __init__(self) -> None:
        super().__init__()
        self.client.flushall()
        self.world = World()
        self.lock = Lock(
            self.client, "model-line", ttl=30, limit=self.limit, handover=self.world.publish
        )
        self.count = 0
        self.running: dict[str, tuple[Lease, str | None]] = {}
        self.ran: list[str] = []
        self.created: list[str] = []
        self.parked: list[str] = []
        self.tenant: dict[str, str | None] = {}

    def _start(self, task: str, got: Lease, token: str | None) -> None:
        assert task not in self.running, f"{task} runs twice at once"
        assert task not in self.ran, f"{task} runs a second time"
        self.running[task] = (got, token)

    @rule(data=st.data())
    def new_task(self, data: st.DataObject) -> None:
        task = f"t{self.count}"
        self.count += 1
        self.created.append(task)
        tenant = data.draw(st.sampled_from(self.tenants)) if self.tenants else None
        self.tenant[task] = tenant
        got = park(self.lock, task, owner=task, tenant=tenant)
        if isinstance(got, Parked):
            self.parked.append(task)
        else:
            self._start(task, got, None)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        task = data.draw(st.sampled_from(sorted(self.running)))
        lease, token = self.running.pop(task)
        self.ran.append(task)
        if token is None:
            lease.release()
        else:
            lease.release(finish_job=_job(task, token), keep=600)

    def _deliver(self, message: Message) -> bool:
        """One delivery of ``message``; False if another delivery of it holds the lease (this
        copy comes back later)."""
        try:
            got = park(
                self.lock,
                message.task,
                token=message.token,
                owner=message.task,
                job=_job(message.task, message.token),
                tenant=self.tenant[message.task],
            )
        except JobFinished:
            return True  # its job ran already: the copy is dropped
        except LockNotAcquired as exc:
            assert exc.owner_expires_in is not None
            return False
        if not isinstance(got, Parked):
            self._start(message.task, got, message.token)
        return True

    @precondition(lambda self: self.world.broker)
    @rule(data=st.data(), twice=st.booleans())
    def deliver(self, data: st.DataObject, twice: bool) -> None:
        index = data.draw(st.integers(0, len(self.world.broker) - 1))
        message = self.world.broker[index] if twice else self.world.broker.pop(index)
        if not self._deliver(message) and not twice:
            self.world.broker.append(message)

    @rule(failing=st.booleans())
    def broker_fails(self, failing: bool) -> None:
        self.world.failing = failing

    @rule()
    def hand_overs_lapse(self) -> None:
        """The publish windows and hand-over windows of unclaimed hand-overs pass."""
        meta = self.lock.keys.meta
        for raw in self.client.zrange(self.lock.keys.leases, 0, -1):
            token = raw.decode()
            if is_line_token(token) and self.client.hget(meta, f"c:{token}") == b"":
                self.client.zadd(self.lock.keys.leases, {token: 1})

    @rule()
    def sweeps(self) -> None:
        sweep(self.lock)

    @invariant()
    def handed_in_line_order(self) -> None:
        # First come, first handed the lock: nobody in line is overtaken (with tenants: nobody
        # by a task of their own tenant; tenants take turns).
        for tenant in self.tenants or (None,):
            handed = [t for t in self.world.handed if self.tenant[t] == tenant]
            parked = [t for t in self.parked if self.tenant[t] == tenant]
            assert handed == parked[: len(handed)]

    @invariant()
    def no_tenant_place_without_tasks(self) -> None:
        # A tenant's place in the queue stands for its tasks: never one without them.
        places = [m for m in self.client.zrange(self.lock.keys.all[2], 0, -1) if m[:1] == b"#"]
        tasks = {m[:16] for m in self.client.zrange(self.lock.keys.tenants, 0, -1)}
        assert {p[1:] for p in places} == tasks

    @invariant()
    def holders_within_limit(self) -> None:
        live = self.client.zcard(self.lock.keys.leases)
        assert len(self.running) <= self.limit
        assert live <= self.limit

    def teardown(self) -> None:
        # The faults stop: the broker works, every hand-over either is delivered or lapses.
        self.world.failing = False
        for _ in range(200):
            if len(self.ran) == len(self.created) and not self.running:
                break
            for task in sorted(self.running):
                lease, token = self.running.pop(task)
                self.ran.append(task)
                lease.release(**({"finish_job": _job(task, token), "keep": 600} if token else {}))
            while self.world.broker:
                self._deliver(self.world.broker.pop(0))
            self.hand_overs_lapse()
            sweep(self.lock)
        assert sorted(self.ran) == sorted(self.created), "a task was lost"
        assert len(self.ran) == len(set(self.ran)), "a task ran twice"


SETTINGS = settings(
    max_examples=int(os.environ.get("LINE_MODEL_EXAMPLES", "100")),
    stateful_step_count=30,
    deadline=None,
    database=None,  # no example database in the working tree; failures print their steps
    phases=[Phase.explicit, Phase.generate],  # no shrinking: minutes on a failure
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("tenants", [(), ("a", "b", "c")], ids=["plain", "tenants"])
@pytest.mark.parametrize("limit", [1, 2])
def test_the_task_line_loses_nothing_and_runs_nothing_twice(
    client: redis.Redis, limit: int, tenants: tuple[str, ...]
) -> None:
    class Model(LineModel):
        pass

    Model.client = client
    Model.limit = limit
    Model.tenants = tenants
    run_state_machine_as_test(Model, settings=SETTINGS)
