"""Plain test helpers for projects whose tasks take celery-redislock locks: no pytest needed.

The pytest plugin :mod:`celery_redislock.contrib.pytest` binds them to its test Redis as the
``redislock`` fixture.

>>> with hold_lock(sync_customer, 42):                       # doctest: +SKIP
...     assert sync_customer.apply(args=(42,)).state == "IGNORED"
>>> assert_unlocked(sync_customer, 42)                        # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from ..core.admin import TEST_HOLDER, describe_holder, iter_locks, release_all
from ..core.keys import DEFAULT_NAMESPACE, check_namespace
from ..core.lease import Holder, Lease
from ..core.lock import Lock
from ..errors import LockNotAcquired
from .redis_server import RedisServer

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


def configure_app(app: Celery, url: str, *, namespace: str = DEFAULT_NAMESPACE) -> Celery:
    """Points ``app``'s locks at the Redis at ``url`` (``redislock_url``, dropping any
    ``redislock_client`` factory) in ``namespace``; returns ``app``.

    The app must still declare its tasks with ``task_cls="celery_redislock:LockedTask"`` (or
    :func:`celery_redislock.install`) for their ``lock=`` options to be honoured.

    >>> configure_app(app, "redis://127.0.0.1:6379/0").conf.redislock_url   # doctest: +SKIP
    'redis://127.0.0.1:6379/0'
    """
    from ..integrations.celery.settings import set_setting

    # (under a namespace, as the prefixed names, which the app's own may be)
    set_setting(app, "redislock_url", url)
    set_setting(app, "redislock_client", None)
    set_setting(app, "redislock_namespace", check_namespace(namespace))
    return app


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
    from ..integrations.celery.run import lock_for

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

    assert_lock_key = staticmethod(assert_lock_key)
    assert_locked = staticmethod(assert_locked)
    assert_unlocked = staticmethod(assert_unlocked)
    hold = staticmethod(hold_lock)

    def locks(self) -> list[str]:
        """Names of the locks of the namespace that have leases now, sorted."""
        return sorted(set(iter_locks(self.client, self.namespace)))

    def release_all(self) -> list[str]:
        """See :func:`release_all` (on the test Redis, in the test namespace)."""
        return release_all(self.client, self.namespace)

    def configure(self, app: Celery) -> Celery:
        """See :func:`configure_app` (the test Redis and namespace)."""
        return configure_app(app, self.url, namespace=self.namespace)
