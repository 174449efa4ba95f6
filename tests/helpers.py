"""Small helpers the tests share: waiting on a condition, free ports, processes read from /proc,
and what the test app's tasks note in Redis (``started:<name>`` lists, ``stop:<name>`` flags).

Test modules import these from here, never from ``conftest``: each test folder may have a
``conftest.py`` of its own, and the module named ``conftest`` at a given moment is whichever
pytest loaded last."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

if TYPE_CHECKING:
    import redis

    from celery_redislock import Lock

HAS_PROC = Path("/proc/self/stat").exists()

# The workers a test started (Celery's or RQ's): a failing test's report shows their logs.
STARTED_WORKERS = pytest.StashKey[list[Any]]()


def load_factor() -> float:
    """How many times longer than on an idle machine a wait may take here and now: the 1-minute
    load average per CPU, at least 1 (a load of 4 on 2 cores: 2)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


# A wait's timeout stretches with the load at most this many times.
MAX_STRETCH = 5.0


def wait_for(condition: Callable[[], object], what: str, timeout: float = 10) -> None:
    """Polls ``condition`` until it holds; fails naming ``what`` after ``timeout`` seconds on an
    idle machine, stretched by the load as the wait goes on (:func:`load_factor`, at most
    :data:`MAX_STRETCH` times): a wait is a liveness bound, and a busy machine takes longer."""
    began = time.monotonic()
    while not condition():
        waited = time.monotonic() - began
        if waited >= timeout:
            factor = min(load_factor(), MAX_STRETCH)
            assert waited < timeout * factor, (
                f"timed out after {waited:.0f}s (load factor {factor:.1f}) waiting until {what}"
            )
        time.sleep(0.005)


def wait_until_queued(client: redis.Redis | redis.RedisCluster, lock: Lock, count: int = 1) -> None:
    """Blocks until ``count`` waiters stand in ``lock``'s line: a release after this is sure to
    find them blocked (no sleeping and hoping). In the lean layout (REDISLOCK_TEST_LAYOUT=lean,
    tests/sitecustomize.py) a plain mutex's waiter has no place in line: it leaves its deadline
    and blocks on the wake list, where a release's wake-up waits for it; so one waiter is seen by
    its deadline, and more by the clients Redis counts as blocked."""
    if os.environ.get("REDISLOCK_TEST_LAYOUT") == "lean" and lock.lean:
        if count == 1:
            wait_for(lambda: client.hget(lock.keys.meta, "Q"), "1 waiter refused")
        else:
            blocked = lambda: int(client.info("clients")["blocked_clients"])  # noqa: E731
            wait_for(lambda: blocked() >= count, f"{count} waiters blocked")
        return
    wait_for(lambda: client.zcard(lock.keys.all[2]) >= count, f"{count} waiter(s) queued")


def lapse_at(*locks: Lock, default: float | None = None) -> float:
    """When the earliest live lease of ``locks`` would lapse unrenewed (time.monotonic()): a
    give-back or hand-over seen before then was not that lapse, however slow the machine.
    ``default``: seconds from now when none is held (else a lock must be held)."""
    left = [h.expires_in for lk in locks for h in lk.holders()]
    if not left and default is not None:
        left = [default]
    return time.monotonic() + min(left)


def redis_time_ms(client: redis.Redis) -> float:
    """Redis's clock (TIME), in milliseconds: the one its scripts' due times are on."""
    seconds, micros = client.time()
    return seconds * 1000 + micros / 1000


def wait_redis_time(client: redis.Redis, at_ms: float, timeout: float = 30) -> None:
    """Blocks until Redis's clock reads ``at_ms`` or later (a due time a script gave): what is
    due then is surely due, however long this machine took to get there."""
    wait_for(lambda: redis_time_ms(client) >= at_ms, f"Redis's clock at {at_ms:.0f} ms", timeout)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Process(NamedTuple):
    pid: int
    ppid: int
    state: str
    """``R``, ``S``, ... ``Z`` a zombie, ``X`` dead."""
    name: str
    cmdline: bytes


def _read(pid: int) -> Process | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    name, rest = stat.split("(", 1)[1].rsplit(")", 1)
    fields = rest.split()
    return Process(pid, int(fields[1]), fields[0], name, cmdline)


def processes() -> Iterator[Process]:
    """Every process /proc shows (Linux)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (process := _read(int(entry.name))) is not None:
            yield process


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    if HAS_PROC:
        process = _read(pid)
        return process is not None and process.state not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def children_of(pid: int) -> list[int]:
    """Live child processes of ``pid`` (the pool's children of a worker's main process)."""
    return [p.pid for p in processes() if p.ppid == pid and p.state not in ("Z", "X")]


def is_skipped(result: Any) -> bool:
    """Whether a Celery result is a skipped run: ``FAILURE`` with ``TaskSkipped``."""
    from celery_redislock import TaskSkipped

    return bool(result.state == "FAILURE" and isinstance(result.result, TaskSkipped))


def started(lockapp: ModuleType, name: str) -> list[str]:
    """Ids of the test app's tasks that noted a start under ``name``, in order."""
    return [t.decode() for t in lockapp.r.lrange(f"started:{name}", 0, -1)]


def wait_started(lockapp: ModuleType, name: str, count: int = 1, timeout: float = 30) -> list[str]:
    wait_for(lambda: len(started(lockapp, name)) >= count, f"{name} started", timeout)
    return started(lockapp, name)


def stop(lockapp: ModuleType, name: str) -> None:
    """Tells the test app's tasks running under ``name`` to end now."""
    lockapp.r.set(f"stop:{name}", 1)


def most_in_window(starts: list[float], per: float) -> int:
    """The most of the sorted times ``starts`` that any window of ``per`` seconds holds."""
    most, first = 0, 0
    for last, at in enumerate(starts):
        while at - starts[first] >= per:
            first += 1
        most = max(most, last - first + 1)
    return most
