"""Fixtures of the conformance suite: one adapter per framework (its real workers) shared by a
whole module, and adapters of a test's own for the rows that need a worker configured apart."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import STARTED_WORKERS

from celery_redislock.contrib.redis_server import RedisServer

from .adapters import Adapter, CeleryAdapter, RQAdapter


def _start(
    name: str, celery_url: str, rq_url: str, log_dir: Path, env: dict[str, str] | None = None
) -> Adapter:
    # A test's own workers (env given) take a queue apart from the shared workers'.
    queue = "conformance-own" if env else "conformance"
    if name == "celery":
        return CeleryAdapter(celery_url, log_dir, env, queue)
    return RQAdapter(rq_url, log_dir, env, queue)


@pytest.fixture(scope="module")
def shared(
    request: pytest.FixtureRequest,
    celery_server: RedisServer,
    rq_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Adapter]:
    """The adapter named by the test's parameter, its workers started once for the module
    (parametrized indirectly: set up before the per-test checks for processes left behind)."""
    adapter = _start(
        request.param, celery_server.url, rq_server.url, tmp_path_factory.mktemp(request.param)
    )
    yield adapter
    adapter.finish()
    gc.collect()  # results still listening for replies let go while their Redis is up


@pytest.fixture(autouse=True)
def _worker_logs_on_failure(request: pytest.FixtureRequest) -> None:
    """A failing test's report shows the logs of the workers it used (tests/conftest.py)."""
    if "shared" in request.fixturenames:
        request.node.stash[STARTED_WORKERS] = request.getfixturevalue("shared").workers


@pytest.fixture
def own_adapter(
    request: pytest.FixtureRequest,
    celery_server: RedisServer,
    rq_server: RedisServer,
    tmp_path: Path,
) -> Iterator[Callable[..., Adapter]]:
    """Starts an adapter of the test's own (``own_adapter("rq", env={...})``); its workers are
    killed at the end of the test."""
    started: list[Adapter] = []

    def start(name: str, env: dict[str, str] | None = None) -> Adapter:
        adapter = _start(name, celery_server.url, rq_server.url, tmp_path, env)
        started.append(adapter)
        request.node.stash[STARTED_WORKERS] = adapter.workers
        return adapter

    yield start
    for adapter in started:
        adapter.finish()
