"""``lock_acquired`` / ``lock_released`` with their timings, the lock task events that Flower
and ``celery events`` show, and the kill switch, in real prefork workers."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
from helpers import is_skipped, stop, wait_for, wait_started
from workers import Worker

from celery_redislock import LockConfigError, lock_for
from celery_redislock.core import admin
from celery_redislock.integrations.celery.settings import settings_for


@pytest.fixture
def cliapp(lockapp: ModuleType) -> ModuleType:
    import cliapp as module

    return module


def records(lockapp: ModuleType, signal: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in lockapp.r.lrange(f"signal:{signal}", 0, -1)]


def test_acquired_and_released_carry_the_seconds_waited_and_held(
    lockapp: ModuleType, cliapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    workers(app="cliapp", concurrency=2)
    holder = lockapp.hold.delay("sig", 60)
    wait_started(lockapp, "sig")
    lock = lock_for(lockapp.hold, ("sig",))
    waiting = cliapp.waits_long.delay("sig")
    wait_for(lambda: lock.client.zcard(lock.keys.all[2]) >= 1, "the copy waits in line", 30)
    in_line = time.monotonic()
    time.sleep(1.0)  # the copy waits at least this long: what `waited` must report
    # The holder took its lease before the copy queued, and still holds it now.
    held_at_least = time.monotonic() - in_line
    stop(lockapp, "sig")
    assert holder.get(timeout=30) == "return" and waiting.get(timeout=30) == "ran"

    wait_for(lambda: len(records(lockapp, "lock_released")) >= 2, "both released", 30)
    acquired = {r["task_id"]: r for r in records(lockapp, "lock_acquired")}
    released = {r["task_id"]: r for r in records(lockapp, "lock_released")}
    assert set(acquired) == set(released) == {holder.id, waiting.id}
    first, second = acquired[holder.id], acquired[waiting.id]
    assert first["sender"] == "lockapp.hold" and first["lock"] == "hold:sig"
    assert second["sender"] == "cliapp.waits_long" and second["lock"] == "hold:sig"
    assert 0 <= first["waited"] < 5
    assert 1.0 <= second["waited"] < 60
    # The holder held it from before the copy queued until told to stop.
    assert held_at_least <= released[holder.id]["held"] < 60
    assert 0 <= released[waiting.id]["held"] < 5
    assert second["fence"] > first["fence"]
    assert released[holder.id]["fence"] == first["fence"]
    # Sent in the pool child that ran the task.
    assert first["pid"] == int(lockapp.r.hget("pid", holder.id))


class Events:
    """Captures the app's events (Celery's event receiver, on its own thread)."""

    def __init__(self, app: Any) -> None:
        self.app, self.seen = app, []  # type: ignore[var-annotated]
        self.receiver: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.app.connection_for_read() as connection:
            self.receiver = self.app.events.Receiver(connection, handlers={"*": self.seen.append})
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def of(self, type_: str, task_id: str) -> list[dict[str, Any]]:
        return [e for e in self.seen if e["type"] == type_ and e.get("uuid") == task_id]

    def barrier(self, name: str) -> None:
        """Sends an event of our own until it arrives: from then on the receiver listens, and
        whatever was sent before it has arrived (one sent before it subscribed is gone)."""
        deadline = time.monotonic() + 30
        while not self.of("task-lock-probe", name):
            assert time.monotonic() < deadline, f"the {name} probe event never arrived"
            with self.app.events.default_dispatcher(hostname="test") as dispatcher:
                dispatcher.send("task-lock-probe", uuid=name)
            sent = time.monotonic()
            while not self.of("task-lock-probe", name) and time.monotonic() < sent + 0.5:
                time.sleep(0.01)

    def wait(self, type_: str, task_id: str, timeout: float = 30) -> dict[str, Any]:
        wait_for(lambda: self.of(type_, task_id), f"a {type_} event of {task_id}", timeout)
        return self.of(type_, task_id)[0]


@pytest.fixture
def events(lockapp: ModuleType) -> Iterator[Events]:
    capture = Events(lockapp.app)
    capture.thread.start()
    yield capture
    if capture.receiver is not None:
        capture.receiver.should_stop = True
    capture.thread.join(10)


@pytest.mark.slow
def test_task_events_when_the_worker_sends_them(
    lockapp: ModuleType,
    cliapp: ModuleType,
    workers: Callable[..., Worker],
    events: Events,
) -> None:
    events.barrier("before")  # events go to whoever listens at the time: listen first
    workers(app="cliapp", concurrency=2, env={"CLIAPP_EVENTS": "1"})

    holder = lockapp.watch_lease.delay("ev", 60)
    wait_started(lockapp, "ev")
    acquired = events.wait("task-lock-acquired", holder.id)
    assert acquired["lock"] == "hold:ev" and acquired["mode"] == "write"
    assert acquired["fence"] == lock_for(lockapp.hold, ("ev",)).holders()[0].fence
    assert 0 <= acquired["waited"] < 5 and acquired["hostname"].startswith("w1@")

    skipped = lockapp.hold.delay("ev")
    conflict = events.wait("task-lock-conflict", skipped.id)
    assert conflict["lock"] == "hold:ev" and conflict["action"] == "skip"
    assert conflict["holders"] == [holder.id]

    assert admin.force_release(lockapp.r, "hold:ev", task_id=holder.id).holders
    lost = events.wait("task-lock-lost", holder.id)
    assert lost["lock"] == "hold:ev" and lost["fence"] == acquired["fence"]
    assert holder.get(timeout=30) == "lost"

    quick = lockapp.hold.delay("ev2", 0)
    quick.get(timeout=30)
    released = events.wait("task-lock-released", quick.id)
    assert released["lock"] == "hold:ev2" and 0 <= released["held"] < 5


def test_no_lock_events_without_task_events(
    lockapp: ModuleType,
    cliapp: ModuleType,
    workers: Callable[..., Worker],
    events: Events,
) -> None:
    events.barrier("before")  # the receiver listens
    workers(app="cliapp", concurrency=1)
    done = lockapp.hold.delay("quiet", 0)
    done.get(timeout=30)
    # The signals fired (so events would have, were they on)...
    wait_for(lambda: records(lockapp, "lock_released"), "lock_released sent", 30)
    events.barrier("after")
    ours = [e["type"] for e in events.seen if e["type"].startswith("task-lock-")]
    assert set(ours) == {"task-lock-probe"}


@pytest.mark.slow
def test_task_events_switched_on_and_off_at_run_time(
    lockapp: ModuleType,
    cliapp: ModuleType,
    workers: Callable[..., Worker],
    events: Events,
) -> None:
    """A worker started without -E (its dispatcher enabled by its heartbeats, as in production):
    `celery control enable_events` turns the lock events on, `disable_events` off again, as it
    does Celery's own task events."""
    events.barrier("before")
    workers(app="cliapp", concurrency=2, heartbeat=True)
    holder = lockapp.hold.delay("rt", 60)
    wait_started(lockapp, "rt")

    def skipped_copy() -> str:
        copy = lockapp.hold.delay("rt")
        # Its conflict event, if any, was published before its skipped state was stored.
        wait_for(lambda: is_skipped(copy), "the copy skipped", 30)
        return str(copy.id)

    def control(command: str) -> None:
        replies = getattr(lockapp.app.control, command)(reply=True, limit=1, timeout=30)
        assert len(replies) == 1 and "ok" in next(iter(replies[0].values())), replies

    quiet = skipped_copy()
    events.barrier("off")  # everything the worker sent before the probe has arrived
    assert not events.of("task-lock-conflict", quiet)
    assert not events.of("task-started", quiet)  # Celery's own task events were off too

    control("enable_events")
    loud = skipped_copy()
    conflict = events.wait("task-lock-conflict", loud)
    assert conflict["lock"] == "hold:rt" and conflict["action"] == "skip"
    assert conflict["holders"] == [holder.id] and conflict["hostname"].startswith("w1@")
    events.wait("task-started", loud)

    control("disable_events")
    quiet_again = skipped_copy()
    events.barrier("off again")
    assert not events.of("task-lock-conflict", quiet_again)
    stop(lockapp, "rt")
    assert holder.get(timeout=30) == "return"


def test_kill_switch_turns_every_lock_and_claim_off(
    lockapp: ModuleType,
    cliapp: ModuleType,
    workers: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = workers(app="cliapp", concurrency=2, env={"REDISLOCK_DISABLED": "1"})
    assert "celery_redislock is DISABLED" in worker.log()
    first = lockapp.hold.delay("off", 60)
    second = lockapp.hold.delay("off", 60)
    # Both run at once: no lock was taken.
    assert sorted(wait_started(lockapp, "off", 2)) == sorted([first.id, second.id])
    assert admin.list_locks(lockapp.r) == [] and records(lockapp, "lock_acquired") == []
    stop(lockapp, "off")
    assert first.get(timeout=30) == second.get(timeout=30) == "return"

    # The producer's switch: a unique task is published twice, no claim is made.
    lockapp.app.conf.redislock_disabled = True
    try:
        one = lockapp.unique_strict.delay("x")
        two = lockapp.unique_strict.delay("x")
        assert one.id != two.id and admin.list_claims(lockapp.r) == []
        assert one.get(timeout=30) == two.get(timeout=30) == "x"
    finally:
        lockapp.app.conf.redislock_disabled = False
    # Switched back on: the duplicate is refused again.
    blocker = lockapp.unique_finished.delay("on", 60)
    assert admin.list_claims(lockapp.r, "fin:on")
    stop(lockapp, "on")
    blocker.get(timeout=30)


@pytest.mark.parametrize(
    ("setting", "env", "message"),
    [
        ("yes", None, "setting redislock_disabled must be True or False, got 'yes'"),
        (None, "maybe", "REDISLOCK_DISABLED must be 1/true/yes or 0/false/no, got 'maybe'"),
    ],
)
def test_a_bad_kill_switch_value_is_a_config_error(
    lockapp: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    setting: str | None,
    env: str | None,
    message: str,
) -> None:
    if env is not None:
        monkeypatch.setenv("REDISLOCK_DISABLED", env)
    conf = lockapp.app.conf
    previous = conf.get("redislock_disabled")
    conf.redislock_disabled = setting
    try:
        with pytest.raises(LockConfigError, match=re.escape(message)):
            settings_for(lockapp.app)
    finally:
        conf.redislock_disabled = previous
