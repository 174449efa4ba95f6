"""The RQ part's workers: real ``rq worker`` subprocesses with parent-side release
(``LockWorker``), each in a process group of its own (see :mod:`demos._common.processes`).

A work horse calls ``setpgrp()``: stopping a worker's group does not reach a horse still
running (a copy blocked in the lock's line, say). :func:`stop_workers` therefore also kills
every process left whose command line names one of these workers (a horse is a fork of its
worker, command line included).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import redis

from .._common.processes import Children, demos_importable
from .jobs import QUEUE

WORKER_CLASS = "celery_redislock.integrations.rq.LockWorker"


def worker_name(index: int) -> str:
    """Unique per demo run: RQ refuses a name that an unclean exit left registered."""
    return f"rqdemo{index}-{os.getpid()}"


def worker_command(url: str, name: str) -> list[str]:
    """The command a demo worker runs (``rq worker``, as a user would type it)."""
    return [
        sys.executable, "-m", "rq.cli", "worker", "-u", url, "-w", WORKER_CLASS, "-n", name,
        "--logging_level", "INFO", QUEUE,
    ]  # fmt: skip


def start_workers(
    url: str,
    log_dir: Path,
    names: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
) -> Children:
    """Starts the named workers on the Redis at ``url`` and waits until each has registered;
    the caller stops them (:func:`stop_workers`). If one does not start, all are stopped."""
    children = Children(log_dir, env=demos_importable({**os.environ, **(env or {})}))
    client = redis.Redis.from_url(url)
    try:
        for name in names:
            children.start(name, worker_command(url, name))
        deadline = time.monotonic() + timeout
        for name in names:
            while not client.exists(f"rq:worker:{name}"):
                if children.procs[name].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start:\n{children.log(name)[-3000:]}")
                time.sleep(0.05)
    except BaseException:
        stop_workers(children, names)
        raise
    finally:
        client.close()
    return children


def stop_workers(children: Children, names: Sequence[str], grace: float = 10) -> None:
    """Stops every worker: SIGTERM (a warm shutdown: an idle worker leaves at once, a busy one
    waits for its job), then, for a worker still busy, a second SIGTERM (a cold shutdown: RQ
    kills the horse, and the worker releases its lease), then SIGKILL for what is left, horses
    included."""
    try:
        procs = list(children.procs.values())
        for proc in procs:
            _signal_group(proc.pid, signal.SIGTERM)
        # RQ ignores a second signal that comes within a second of the first.
        deadline = time.monotonic() + 1.5
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        for proc in procs:
            if proc.poll() is None:
                _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        children.stop(grace=1)
    finally:
        markers = {name.encode() for name in names}
        left = [pid for pid in _pids() if markers & set(_cmdline(pid).split(b"\0"))]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(_cmdline(pid) for pid in left) and time.monotonic() < deadline:
            time.sleep(0.02)


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)  # a worker leads its own process group


def _pids() -> list[int]:
    """Every live pid, from ``/proc`` (none where there is no ``/proc``: the cold shutdown
    above has then killed any horse still running)."""
    proc = Path("/proc")
    return [int(p.name) for p in proc.iterdir() if p.name.isdigit()] if proc.is_dir() else []


def _cmdline(pid: int) -> bytes:
    """The command line of a live process (empty once it is gone, or a zombie)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
