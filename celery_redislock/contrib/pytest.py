"""pytest plugin for projects whose Celery tasks take celery-redislock locks: load it from the
project's top ``conftest.py`` (``pytest_plugins = ["celery_redislock.contrib.pytest"]``) or with
``pytest -p celery_redislock.contrib.pytest``.

It gives a real Redis for the locks (``REDIS_URL``, else a throwaway ``redis-server``), points
Celery apps at it, frees every lock between tests when asked, runs an in-process worker without
Docker, and asserts which lock a call takes and who holds it (the ``redislock`` fixture, a
:class:`~celery_redislock.contrib.testing.LockAssertions`). Each fixture, and how the plugin sits
beside ``celery.contrib.pytest`` and pytest-celery: docs/testing.md::

    def test_second_sync_is_skipped(redislock, redislock_app_config):
        redislock_app_config(app)                     # app.conf.redislock_url = the test Redis
        with redislock.hold(sync_customer, 42):       # as if another run held the lock
            assert sync_customer.apply(args=(42,)).state == "IGNORED"
        redislock.assert_unlocked(sync_customer, 42)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import pytest
import redis

from ..core.keys import DEFAULT_NAMESPACE, check_namespace
from ..errors import RedisLockError
from .redis_server import RedisServer
from .testing import LockAssertions, SessionRedis, configure_app, release_all

if TYPE_CHECKING:
    from celery import Celery

__all__: list[str] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "redislock_namespace",
        "celery-redislock: the lock namespace the tests use (default: redislock)",
        default=DEFAULT_NAMESPACE,
    )
    parser.addini(
        "redislock_clean",
        "celery-redislock: release every lock of the namespace before and after each test",
        type="bool",
        default=False,
    )


@pytest.fixture(scope="session")
def redislock_server() -> Iterator[SessionRedis]:
    """A real Redis for the session: ``REDIS_URL``, else a throwaway ``redis-server``."""
    url = os.environ.get("REDIS_URL")
    if url:
        client = redis.Redis.from_url(url, socket_connect_timeout=5)
        try:
            client.ping()
        except redis.RedisError as exc:
            pytest.fail(f"redislock_server: REDIS_URL={url} does not answer: {exc}", pytrace=False)
        finally:
            client.close()
        yield SessionRedis(url=url, server=None)
        return
    with ExitStack() as stack:
        try:
            server = RedisServer()
            stack.callback(server.close)
            server.start()
        except RedisLockError as exc:
            pytest.fail(f"redislock_server: {exc}", pytrace=False)
        yield SessionRedis(url=server.url, server=server)


@pytest.fixture(scope="session")
def redislock_namespace(pytestconfig: pytest.Config) -> str:
    """The lock namespace of the tests (ini option ``redislock_namespace``)."""
    return check_namespace(pytestconfig.getini("redislock_namespace"))


@pytest.fixture
def redislock_url(redislock_server: SessionRedis) -> str:
    """The URL of the session's Redis."""
    return redislock_server.url


@pytest.fixture
def redislock_client(redislock_url: str) -> Iterator[redis.Redis]:
    """A ``redis.Redis`` on the session's Redis; nothing is flushed."""
    client = redis.Redis.from_url(redislock_url)
    yield client
    client.close()


@pytest.fixture
def redislock_clean(redislock_client: redis.Redis, redislock_namespace: str) -> Iterator[None]:
    """Every lock of the namespace released before and after the test."""
    release_all(redislock_client, redislock_namespace)
    yield
    release_all(redislock_client, redislock_namespace)


@pytest.fixture(autouse=True)
def _redislock_autoclean(request: pytest.FixtureRequest) -> None:
    if request.config.getini("redislock_clean"):
        request.getfixturevalue("redislock_clean")


@pytest.fixture(scope="session")
def redislock_celery_config(
    redislock_server: SessionRedis, redislock_namespace: str
) -> dict[str, Any]:
    """``{"redislock_url": ..., "redislock_namespace": ...}`` for Celery's ``celery_config``."""
    return {"redislock_url": redislock_server.url, "redislock_namespace": redislock_namespace}


@pytest.fixture
def redislock_app_config(
    redislock_url: str, redislock_namespace: str
) -> Callable[[Celery], Celery]:
    """``redislock_app_config(app)``: :func:`configure_app` with the test Redis and namespace."""

    def configure(app: Celery) -> Celery:
        return configure_app(app, redislock_url, namespace=redislock_namespace)

    return configure


@pytest.fixture
def redislock_worker() -> Iterator[Callable[..., Any]]:
    """``redislock_worker(app, pool="solo", concurrency=1, **kwargs)`` starts an in-process worker
    for ``app`` (Celery's ``start_worker``; ``kwargs`` go to it) and returns it; every worker
    started is stopped at the end of the test. The app's broker must be reachable from here
    (``memory://`` is). The root logger is left to pytest (``worker_hijack_root_logger=False``).
    Stopping a worker takes up to 4 s: Celery's loop waits on the broker 2 s at a time. With
    ``memory://`` set ``broker_transport_options={"polling_interval": 0.05}``, or each message
    waits up to a second.

    >>> def test_skip(redislock_worker):                       # doctest: +SKIP
    ...     redislock_worker(app, pool="threads", concurrency=2)
    """
    with ExitStack() as stack:

        def start(app: Celery, *, pool: str = "solo", concurrency: int = 1, **kwargs: Any) -> Any:
            from celery.contrib.testing.worker import start_worker

            kwargs.setdefault("perform_ping_check", False)
            if kwargs["perform_ping_check"]:
                import celery.contrib.testing.tasks  # noqa: F401  (registers celery.ping)
            app.conf.worker_hijack_root_logger = False
            return stack.enter_context(
                start_worker(app, pool=pool, concurrency=concurrency, **kwargs)
            )

        yield start


@pytest.fixture
def redislock(
    redislock_url: str, redislock_client: redis.Redis, redislock_namespace: str
) -> LockAssertions:
    """The assertion helpers bound to the test Redis (see :class:`LockAssertions`)."""
    return LockAssertions(url=redislock_url, client=redislock_client, namespace=redislock_namespace)
