"""pytest plugin for projects whose Celery tasks take celery-redislock locks.

Load it from the project's top ``conftest.py`` (or run
``pytest -p celery_redislock.contrib.pytest``)::

    pytest_plugins = ["celery_redislock.contrib.pytest"]

It gives a real Redis for the locks, points Celery apps at it, frees every lock between tests
when asked, runs an in-process worker, and asserts which lock a call takes and who holds it::

    def test_second_sync_is_skipped(redislock, redislock_app_config):
        redislock_app_config(app)                     # app.conf.redislock_url = the test Redis
        with redislock.hold(sync_customer, 42):       # as if another run held the lock
            assert sync_customer.apply(args=(42,)).state == "IGNORED"
        redislock.assert_unlocked(sync_customer, 42)

Fixtures
--------
``redislock_server`` (session)
    A real Redis for the whole run: ``REDIS_URL`` when set, else a throwaway ``redis-server``
    (the one on PATH, else the ``[embedded]`` extra's) started for the session and stopped after.
    A :class:`SessionRedis`: ``.url``, and ``.server`` (the :class:`RedisServer`, ``None`` with
    ``REDIS_URL``).
``redislock_url``, ``redislock_client``
    Its URL, and a ``redis.Redis`` on it. Nothing is flushed: with ``REDIS_URL`` the server may
    hold other data.
``redislock_namespace`` (session)
    The lock namespace: the ini option ``redislock_namespace`` (default ``"redislock"``).
    Override the fixture if the apps under test use another one.
``redislock_clean``
    Releases every lock of the namespace (deletes its keys) before and after the test. Set the
    ini option ``redislock_clean = true`` to apply it to every test.
``redislock_app_config``
    ``redislock_app_config(app)`` points ``app``'s locks at the test Redis and namespace.
``redislock_celery_config`` (session)
    The same settings as a dict, to merge into Celery's ``celery_config`` fixture.
``redislock_worker``
    ``redislock_worker(app, pool="threads", concurrency=2)`` starts a worker for ``app`` in a
    thread of the test process; it is stopped when the test ends.
``redislock``
    A :class:`LockAssertions` bound to the above: ``assert_lock_key``, ``assert_locked``,
    ``assert_unlocked``, ``hold``, ``locks``, ``release_all``, ``configure``.

The assertion helpers are also plain functions of :mod:`celery_redislock.contrib.testing`:
:func:`assert_lock_key`, :func:`assert_locked`, :func:`assert_unlocked`, :func:`hold_lock`,
:func:`release_all`, :func:`configure_app`. They find a task's lock with
:func:`celery_redislock.lock_for`, on the Redis the task's app uses for locks.

Celery's own pytest fixtures
----------------------------
This plugin neither needs nor loads them; it works alongside them:

* ``celery.contrib.pytest`` (shipped with Celery, loaded only when listed in ``pytest_plugins``
  or given with ``-p celery.contrib.pytest``) gives ``celery_app`` (a fresh test app per test,
  ``memory://`` broker, ``cache+memory://`` results), ``celery_worker`` (an in-process worker
  thread for ``celery_app``), ``celery_session_app``/``celery_session_worker`` and the
  ``celery_config``/``celery_parameters`` fixtures that configure them. To have locked tasks
  on ``celery_app``::

      @pytest.fixture(scope="session")
      def celery_config(redislock_celery_config):
          return {**redislock_celery_config}

      @pytest.fixture(scope="session")
      def celery_parameters():
          return {"task_cls": "celery_redislock:LockedTask"}

* pytest-celery 1.x, once installed, loads itself (entry point ``celery``). It keeps the fixtures
  above but replaces ``celery_worker`` with a worker in a Docker container (parametrized, so a
  test using it runs once per worker kind), and adds ``celery_setup``, ``celery_broker`` and
  ``celery_backend`` (Redis and RabbitMQ containers). Without a Docker engine every test that
  uses those errors at setup (``DockerException``); ``celery_app``, ``celery_session_app`` and
  ``celery_session_worker`` still work in-process. Listing ``celery.contrib.pytest`` in
  ``pytest_plugins`` brings the in-process ``celery_worker`` back (the later plugin wins); so
  does ``-p no:celery`` together with it.

``redislock_worker`` starts the same in-process worker as ``celery_worker`` (Celery's
``celery.contrib.testing.worker.start_worker``) but for any app, the project's own included,
whichever of those plugins is installed, and with no Docker.
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
    try:
        server = RedisServer()
    except RedisLockError as exc:
        pytest.fail(f"redislock_server: {exc}", pytrace=False)
    try:
        server.start()
    except RedisLockError as exc:
        server.close()
        pytest.fail(f"redislock_server: {exc}", pytrace=False)
    try:
        yield SessionRedis(url=server.url, server=server)
    finally:
        server.close()


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
