"""RabbitMQ as the broker does not matter: locks live in Redis, releases work the same.

Needs Debian's ``rabbitmq-server`` (CI installs it and sets REDISLOCK_REQUIRE_RABBITMQ=1, which
turns a missing server into a failure instead of a skip).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
from conftest import wait_for
from rabbit import RabbitServer
from workers import Worker

from celery_redislock import SKIPPED, lock_for

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
    wait_for(lambda: late.state == SKIPPED, "the duplicate skipped", 30)
    child = int(lockapp.r.hget("pid", first.id))
    os.kill(child, 9)
    wait_for(lambda: not lock_for(lockapp.hold, ("m",)).locked(), "released by the parent", 5)
    assert child not in worker.children()
