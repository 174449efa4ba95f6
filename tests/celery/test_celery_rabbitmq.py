"""RabbitMQ as the broker does not matter: locks live in Redis, releases work the same.

Needs Debian's ``rabbitmq-server`` (CI installs it and sets REDISLOCK_REQUIRE_RABBITMQ=1, which
turns a missing server into a failure instead of a skip).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
from helpers import is_skipped, wait_for
from rabbit import RabbitServer
from workers import Worker

from celery_redislock import lock_for

pytestmark = [pytest.mark.faults, pytest.mark.slow]  # both kill a child or a whole worker

if not os.path.exists(RabbitServer.binary):
    if os.environ.get("REDISLOCK_REQUIRE_RABBITMQ") == "1":
        raise RuntimeError("rabbitmq-server is required (REDISLOCK_REQUIRE_RABBITMQ=1)")
    pytest.skip("rabbitmq-server is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def rabbit() -> Iterator[RabbitServer]:
    with RabbitServer() as server:
        yield server


def test_rabbitmq_broker_skip_and_child_kill_release(
    lockapp: ModuleType, workers: Callable[..., Worker], rabbit: RabbitServer
) -> None:
    worker = workers(env={"LOCKAPP_BROKER_URL": rabbit.url})
    with lockapp.app.connection_for_write(rabbit.url) as amqp:  # publish through RabbitMQ
        first = lockapp.hold.apply_async(("m", 60), connection=amqp)
        wait_for(lambda: lockapp.r.llen("started:m") == 1, "holder running", 30)
        late = lockapp.hold.apply_async(("m", 0), connection=amqp)
    wait_for(lambda: is_skipped(late), "the duplicate skipped", 30)
    child = int(lockapp.r.hget("pid", first.id))
    os.kill(child, 9)
    wait_for(lambda: not lock_for(lockapp.hold, ("m",)).locked(), "released by the parent", 5)
    assert child not in worker.children()


def test_rabbitmq_a_message_an_old_worker_discards_gives_its_unique_claim_up(
    lockapp: ModuleType, workers: Callable[..., Worker], rabbit: RabbitServer
) -> None:
    """The claim rides in an AMQP header as it does over Redis (tests/celery/test_celery_unique.py
    has the rolling deploy in full)."""
    old = workers(name="old", app="olddeploy", env={"LOCKAPP_BROKER_URL": rabbit.url})
    with lockapp.app.connection_for_write(rabbit.url) as amqp:
        dead = lockapp.unique_finished.apply_async(("amqp",), connection=amqp)
        given_up = "discarded unrun (unregistered here): its unique key 'fin:amqp' is given up"
        wait_for(lambda: given_up in old.log(), "the old worker gives its claim up", 60)
        fresh = lockapp.unique_finished.apply_async(("amqp",), connection=amqp)
    assert fresh.id != dead.id


def test_rabbitmq_whole_worker_killed_redelivery_runs_once_the_lease_lapsed(
    lockapp: ModuleType, workers: Callable[..., Worker], rabbit: RabbitServer
) -> None:
    """acks_late over RabbitMQ, the whole worker SIGKILLed mid-run: RabbitMQ redelivers the
    message at once (the connection dropped) while the dead run's lease still lives. The copy
    is neither run beside that lease nor dropped: it runs once the lease lapsed, and the task
    ends SUCCESS. (On 2dbb8d2 it was acknowledged and dropped: PENDING for ever.)"""
    env = {"LOCKAPP_BROKER_URL": rabbit.url, "LOCKAPP_ACKS_LATE": "1", "LOCKAPP_TTL": "6"}
    first_worker = workers(name="w1", env=env)
    with lockapp.app.connection_for_write(rabbit.url) as amqp:
        result = lockapp.hold.apply_async(("rk", 60.0), connection=amqp)
    wait_for(lambda: lockapp.r.llen("started:rk") == 1, "first delivery running", 30)
    lock = lock_for(lockapp.hold, ("rk",))
    token = lock.holders()[0].token
    workers(name="w2", env=env)  # where RabbitMQ delivers the message again
    first_worker.kill()
    lockapp.r.set("stop:rk", 1)
    wait_for(
        lambda: f"{result.id}:await".encode() in lockapp.r.lrange("signal:lock_conflict", 0, -1),
        "RabbitMQ redelivered at once and the copy waited",
        30,
    )
    wait_for(lambda: token not in [h.token for h in lock.holders()], "the dead lease lapsed", 30)
    gone_at = time.time()
    assert result.get(timeout=30) == "return"
    starts = [float(t) for t in lockapp.r.lrange("started-at:rk", 0, -1)]
    assert len(starts) == 2
    assert starts[1] >= gone_at - 0.05, "the copy ran while the dead run's lease was live"
