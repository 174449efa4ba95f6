"""pytest plugin for projects whose Celery tasks take celery-redislock locks.

Load it from the project's top ``conftest.py`` (or run ``pytest -p celery_redislock.testing``)::

    pytest_plugins = ["celery_redislock.testing"]

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

The assertion helpers are also plain functions of this module: :func:`assert_lock_key`,
:func:`assert_locked`, :func:`assert_unlocked`, :func:`hold_lock`, :func:`release_all`,
:func:`configure_app`. They find a task's lock with :func:`celery_redislock.lock_for`, on the
Redis the task's app uses for locks.

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
import redis

from .errors import LockNotAcquired, RedisLockError
from .inspection import _glob_escape, iter_locks
from .keys import DEFAULT_NAMESPACE, check_namespace
from .lock import Holder, Lease, Lock, RedisClient, backend_errors
from .server import RedisServer

if TYPE_CHECKING:
    from celery import Celery, Task

__all__ = [
    "LockAssertions",
    "SessionRedis",
    "assert_lock_key",
    "assert_locked",
    "assert_unlocked",
    "configure_app",
    "describe_holder",
    "hold_lock",
    "release_all",
]

# Who a lease taken by :func:`hold_lock` says it is (``holder.info["task_id"]``).
TEST_HOLDER = "pytest"

_DELETE_BATCH = 500


# -- plain functions -----------------------------------------------------------------------------


def release_all(client: RedisClient, namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    """Frees every lock of ``namespace``: deletes all its keys (leases, metadata, waiting lines),
    found with SCAN. Returns the names of the locks that had leases.

    Fencing tokens start over afterwards; holders still running find their leases lost. Keys of
    other namespaces and other data are left alone.

    >>> release_all(redis.Redis.from_url(url))   # doctest: +SKIP
    ['sync:42']
    """
    check_namespace(namespace)
    names = sorted(set(iter_locks(client, namespace)))
    batch: list[bytes | str] = []
    with backend_errors(None):
        for key in client.scan_iter(match=f"{_glob_escape(namespace)}:*", count=_DELETE_BATCH):
            batch.append(key)
            if len(batch) >= _DELETE_BATCH:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
    return names


def configure_app(app: Celery, url: str, *, namespace: str = DEFAULT_NAMESPACE) -> Celery:
    """Points ``app``'s locks at the Redis at ``url`` (``redislock_url``, dropping any
    ``redislock_client`` factory) in ``namespace``; returns ``app``.

    The app must still declare its tasks with ``task_cls="celery_redislock:LockedTask"`` (or
    :func:`celery_redislock.install`) for their ``lock=`` options to be honoured.

    >>> configure_app(app, "redis://127.0.0.1:6379/0").conf.redislock_url   # doctest: +SKIP
    'redis://127.0.0.1:6379/0'
    """
    app.conf.redislock_url = url
    app.conf.redislock_client = None
    app.conf.redislock_namespace = check_namespace(namespace)
    return app


def describe_holder(holder: Holder) -> str:
    """One line about a lease for failure messages: who holds it, how, where, for how long.

    >>> describe_holder(lock.holders()[0])   # doctest: +SKIP
    'task 9b1c… (tasks.sync_customer): write lease, pid 4242 on web-1, expires in 14.2s'
    """
    info = holder.info
    if info.get("task_id") == TEST_HOLDER:
        who = "the test itself (hold_lock)"
    else:
        who = f"task {info['task_id']}" if "task_id" in info else f"lease {holder.token}"
        if "task" in info:
            who += f" ({info['task']})"
    how = [f"{holder.mode} lease"]
    if holder.count > 1:
        how.append(f"entered {holder.count} times")
    if "pid" in info:
        how.append(f"pid {info['pid']}" + (f" on {info['host']}" if "host" in info else ""))
    how.append(f"expires in {holder.expires_in:.1f}s")
    return f"{who}: {', '.join(how)}"


def _call(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{getattr(task, 'name', task)}({', '.join(shown)})"


def _subject(lock: Lock, task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``lock 'sync:42' of proj.sync_customer(42)``, or ``lock 'x'`` when given a Lock."""
    if isinstance(task, Lock):
        return f"lock {lock.name!r}"
    return f"lock {lock.name!r} of {_call(task, args, kwargs)}"


def _lock_of(task: Task | Lock, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Lock:
    __tracebackhide__ = True
    if isinstance(task, Lock):
        if args or kwargs:
            raise TypeError("call arguments given with a Lock: pass a task to derive its lock")
        return task
    from . import lock_for

    return lock_for(task, args, kwargs)


def _where(lock: Lock) -> str:
    place = f"namespace {lock.namespace!r}"
    pool = getattr(lock.client, "connection_pool", None)
    kw: dict[str, Any] = getattr(pool, "connection_kwargs", None) or {}
    if "path" in kw:
        return f"{place} on {kw['path']} db {kw.get('db', 0)}"
    if "host" in kw:
        return f"{place} on {kw['host']}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
    return place


def _held_by(lock: Lock, holders: list[Holder]) -> str:
    lines = "".join(f"\n  - {describe_holder(h)}" for h in holders)
    count = len(holders)
    return f"held by {count} holder{'s' if count != 1 else ''} ({_where(lock)}):{lines}"


def assert_lock_key(task: Task, expected_name: str, /, *args: Any, **kwargs: Any) -> Lock:
    """Asserts that calling ``task(*args, **kwargs)`` takes the lock named ``expected_name``
    (the name inside the namespace, as the ``key=`` template renders it); returns that lock.

    >>> assert_lock_key(sync_customer, "sync:42", customer_id=42)   # doctest: +SKIP
    """
    __tracebackhide__ = True
    lock = _lock_of(task, args, kwargs)
    if lock.name != expected_name:
        raise AssertionError(
            f"{_call(task, args, kwargs)} takes lock {lock.name!r}, expected {expected_name!r}"
        )
    return lock


def assert_locked(task: Task | Lock, /, *args: Any, **kwargs: Any) -> list[Holder]:
    """Asserts that the lock a call of ``task(*args, **kwargs)`` would take is held now (by
    anyone); returns its holders. A :class:`Lock` may be given instead of a task.

    >>> [h.info["task_id"] for h in assert_locked(sync_customer, 42)]   # doctest: +SKIP
    ['9b1c…']
    """
    __tracebackhide__ = True
    lock = _lock_of(task, args, kwargs)
    holders = lock.holders()
    if not holders:
        raise AssertionError(
            f"{_subject(lock, task, args, kwargs)} is not held (no live lease in {_where(lock)})"
        )
    return holders


def assert_unlocked(task: Task | Lock, /, *args: Any, **kwargs: Any) -> None:
    """Asserts that the lock a call of ``task(*args, **kwargs)`` would take is free now; the
    failure names every holder with its task id. A :class:`Lock` may be given instead.

    >>> assert_unlocked(sync_customer, 42)   # doctest: +SKIP
    """
    __tracebackhide__ = True
    lock = _lock_of(task, args, kwargs)
    holders = lock.holders()
    if holders:
        raise AssertionError(f"{_subject(lock, task, args, kwargs)} is {_held_by(lock, holders)}")


def hold_lock(task: Task | Lock, /, *args: Any, **kwargs: Any) -> Lease:
    """Takes the lock a call of ``task(*args, **kwargs)`` would take, as a run of that call would
    (``holder.info["task_id"] == "pytest"``), so a test can see what the task does on conflict.
    Fails if the lock is held already. The lease has the lock's mode (a read lock's lease
    excludes writers only). Release the lease, or use it as a context manager.

    The lease is not renewed: it lapses after the lock's ttl unless ``lease.renew()`` is called.

    >>> with hold_lock(sync_customer, 42):                     # doctest: +SKIP
    ...     assert sync_customer.apply(args=(42,)).state == "IGNORED"
    """
    __tracebackhide__ = True
    lock = _lock_of(task, args, kwargs)
    info = {"task_id": TEST_HOLDER}
    if not isinstance(task, Lock):
        info["task"] = str(getattr(task, "name", task))
    try:
        return lock.acquire(blocking=False, info=info)
    except LockNotAcquired:
        raise AssertionError(
            f"cannot hold {_subject(lock, task, args, kwargs)}: it is "
            f"{_held_by(lock, lock.holders())}"
        ) from None


# -- fixtures ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionRedis:
    """The Redis of a test session: ``REDIS_URL``'s, or a server started for the session."""

    url: str
    server: RedisServer | None
    """The server started for the session; ``None`` when ``REDIS_URL`` named one."""

    def client(self) -> redis.Redis:
        """A new client on this Redis (close it when done)."""
        return redis.Redis.from_url(self.url)


@dataclass(frozen=True, slots=True)
class LockAssertions:
    """The ``redislock`` fixture: the helpers of this module bound to the test Redis.

    >>> def test_sync(redislock):                           # doctest: +SKIP
    ...     redislock.assert_lock_key(sync_customer, "sync:42", 42)
    ...     redislock.assert_unlocked(sync_customer, 42)
    """

    url: str
    client: redis.Redis = field(repr=False)
    namespace: str = DEFAULT_NAMESPACE

    def assert_lock_key(self, task: Task, expected_name: str, /, *args: Any, **kwargs: Any) -> Lock:
        """See :func:`assert_lock_key`."""
        __tracebackhide__ = True
        return assert_lock_key(task, expected_name, *args, **kwargs)

    def assert_locked(self, task: Task | Lock, /, *args: Any, **kwargs: Any) -> list[Holder]:
        """See :func:`assert_locked`."""
        __tracebackhide__ = True
        return assert_locked(task, *args, **kwargs)

    def assert_unlocked(self, task: Task | Lock, /, *args: Any, **kwargs: Any) -> None:
        """See :func:`assert_unlocked`."""
        __tracebackhide__ = True
        assert_unlocked(task, *args, **kwargs)

    def hold(self, task: Task | Lock, /, *args: Any, **kwargs: Any) -> Lease:
        """See :func:`hold_lock`."""
        __tracebackhide__ = True
        return hold_lock(task, *args, **kwargs)

    def locks(self) -> list[str]:
        """Names of the locks of the namespace that have leases now, sorted."""
        return sorted(set(iter_locks(self.client, self.namespace)))

    def release_all(self) -> list[str]:
        """See :func:`release_all` (on the test Redis, in the test namespace)."""
        return release_all(self.client, self.namespace)

    def configure(self, app: Celery) -> Celery:
        """See :func:`configure_app` (the test Redis and namespace)."""
        return configure_app(app, self.url, namespace=self.namespace)


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
