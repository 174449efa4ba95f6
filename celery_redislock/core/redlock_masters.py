"""The masters of a RedLock: one client per independent Redis master, checked (at least 3, an
odd number, no server twice), and the daemon helper threads that call every master at once (an
acquire waits only until its outcome is decided, never for a master that hangs; a forked child
starts with none of its parent's helpers).

>>> masters = master_clients(["redis://a", "redis://b", "redis://c"])  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..errors import LockConfigError

__all__ = [
    "MASTER_SOCKET_TIMEOUT",
    "MIN_MASTERS",
    "check_masters",
    "gather",
    "master_clients",
    "on_each",
    "parse_master_urls",
    "quorum",
    "submit",
]

T = TypeVar("T")

MIN_MASTERS = 3
"""Fewer masters tolerate no failure at all (2 of 2 needed): refused."""
MASTER_SOCKET_TIMEOUT = 0.5
"""Seconds a master may take to connect or answer (clients made from URLs here): a master that
hangs is a failed vote quickly, and the requests in flight settle within this."""
# A helper idle this long ends: a burst of concurrent acquires leaves no threads behind.
_IDLE_S = 30.0


def quorum(masters: int) -> int:
    """How many of ``masters`` make a majority.

    >>> from celery_redislock.core.redlock_masters import quorum
    >>> quorum(3), quorum(5)
    (2, 3)
    """
    return masters // 2 + 1


def _check_count(count: int, what: str, name: str | None = None) -> None:
    if count < MIN_MASTERS or count % 2 == 0:
        raise LockConfigError(
            f"{what} must name an odd number of at least {MIN_MASTERS} independent Redis "
            f"masters (3 or 5 usually), got {count}: a majority of an even number tolerates "
            "no more failed masters than one fewer would",
            name=name,
        )


def parse_master_urls(value: object, what: str = "masters") -> tuple[str, ...]:
    """RedLock master URLs from ``"redis://a:6379,redis://b:6379,..."`` or a list of URL
    strings, checked (:class:`LockConfigError` naming ``what`` otherwise).

    >>> from celery_redislock.core.redlock_masters import parse_master_urls
    >>> parse_master_urls("redis://a:1, redis://b:1 ,redis://c:1")
    ('redis://a:1', 'redis://b:1', 'redis://c:1')
    """
    items: list[object]
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",") if part.strip()]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise LockConfigError(
            f"{what} must be Redis URLs (a list, or one string separated by commas), got {value!r}"
        )
    urls: list[str] = []
    addresses: list[str | None] = []
    for item in items:
        if not isinstance(item, str) or "://" not in item:
            raise LockConfigError(f"{what}: {item!r} is not a Redis URL (redis://host:port/db)")
        try:
            kwargs = redis.connection.parse_url(item)  # type: ignore[no-untyped-call]
        except ValueError as exc:
            raise LockConfigError(f"{what}: {item!r} is not a Redis URL: {exc}") from exc
        urls.append(item)
        addresses.append(_address({"host": "localhost", **kwargs}))
    _check_count(len(urls), what)
    _check_distinct(addresses, what)
    return tuple(urls)


def _address(kwargs: Mapping[str, Any]) -> str | None:
    """The server a client's connection arguments name (``host:port`` or ``unix:path``;
    ``None``: not known, e.g. a Sentinel-managed client)."""
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    if "host" in kwargs:
        return f"{kwargs['host']}:{kwargs.get('port', 6379)}"
    return None


def _check_distinct(addresses: Sequence[str | None], what: str, name: str | None = None) -> None:
    known = [a for a in addresses if a is not None]
    twice = sorted({a for a in known if known.count(a) > 1})
    if twice:
        raise LockConfigError(
            f"{what} name the same Redis server more than once ({', '.join(twice)}): RedLock "
            "needs independent masters (two databases of one server are one master)",
            name=name,
        )


def check_masters(clients: object, *, name: str | None = None) -> tuple[redis.Redis, ...]:
    """``clients`` as a tuple of independent masters' clients, checked: plain ``redis.Redis``
    clients (not a Cluster), an odd number of at least 3, no server twice."""
    if not isinstance(clients, list | tuple):
        raise LockConfigError(
            f"masters must be a list or tuple of redis.Redis clients, got {type(clients).__name__}",
            name=name,
        )
    for client in clients:
        if not isinstance(client, redis.Redis):
            raise LockConfigError(
                "masters must be redis.Redis clients, one per independent master (a Redis "
                f"Cluster is one lock service, not a master), got {type(client).__name__}",
                name=name,
            )
    if len({id(c) for c in clients}) != len(clients):
        raise LockConfigError("masters name the same client more than once", name=name)
    _check_count(len(clients), "masters", name)
    _check_distinct(
        [_address(c.connection_pool.connection_kwargs) for c in clients], "masters", name
    )
    return tuple(clients)


def master_clients(
    urls: object, *, socket_timeout: float = MASTER_SOCKET_TIMEOUT, what: str = "masters"
) -> tuple[redis.Redis, ...]:
    """One client per master URL, made for RedLock: short socket timeouts and no retry after a
    timeout (a master that fails is a lost vote, not a reason to wait), one immediate retry
    after a broken connection only (a pooled connection to a master that restarted fails once;
    every script gives the same answer when run twice). The same URLs give the same clients
    again in one process (a lock made per task shares them); making them does not connect."""
    parsed = parse_master_urls(urls, what)
    key = (parsed, float(socket_timeout))  # (redis-py's pools reconnect after a fork)
    with _here.lock:
        found = _here.made.get(key)
        if found is None:
            found = _here.made[key] = tuple(
                redis.Redis.from_url(
                    url,
                    socket_timeout=socket_timeout,
                    socket_connect_timeout=socket_timeout,
                    retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
                )
                for url in parsed
            )
        return found


class _Helper:
    """A daemon thread running the calls handed to it, one at a time; it ends after a while
    with nothing to do. Not a ThreadPoolExecutor: its threads are joined at interpreter exit,
    and one stuck on a frozen master would hold up the process's exit."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        threading.Thread(target=self._work, name="redislock-redlock-call", daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                job = self.jobs.get(timeout=_IDLE_S)
            except queue.Empty:
                with _here.lock:
                    if self in _here.idle:
                        _here.idle.remove(self)
                        return
                continue  # handed a call as it timed out: the call is on its way
            job()
            with _here.lock:
                _here.idle.append(self)


class _Process:
    """What RedLock keeps per process: the master clients made from URLs (the locks a framework
    makes per task share them), the idle helper threads, and the lock guarding both. A forked
    child starts with a new lock and no helper (the parent's threads do not exist there, and
    one of them may have held the lock at the fork); redis-py's pools reconnect by themselves."""

    def __init__(self) -> None:
        self.made: dict[tuple[tuple[str, ...], float], tuple[redis.Redis, ...]] = {}
        self.after_fork()

    def after_fork(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[_Helper] = []


_here = _Process()
os.register_at_fork(after_in_child=_here.after_fork)


def submit(fn: Callable[[], T]) -> Future[T]:
    """Runs ``fn`` on a helper thread (the heartbeat's renewal calls run on them too)."""
    future: Future[T] = Future()

    def job() -> None:
        try:
            result = fn()
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(result)

    with _here.lock:
        helper = _here.idle.pop() if _here.idle else None
    (helper or _Helper()).jobs.put(job)
    return future


def on_each(masters: Sequence[redis.Redis], call: Callable[[redis.Redis], T]) -> list[Future[T]]:
    """Starts ``call(master)`` for every master at once; one future each, in order."""
    return [submit(functools.partial(call, master)) for master in masters]


def gather(
    futures: Sequence[Future[Any]], decided: Callable[[], bool], deadline: float | None
) -> None:
    """Waits until ``decided()`` says the outcome is known, every future is done, or the
    monotonic ``deadline`` passed (futures still out are left running)."""
    pending = {f for f in futures if not f.done()}
    while pending and not decided():
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return
        _, pending = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
