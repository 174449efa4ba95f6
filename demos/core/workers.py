"""The worker processes: each takes a lock, holds it and gives it back, and logs its leases."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import redis

from celery_redislock import Heartbeat, Lock, Mode

from .._common.processes import unblock_stop_signals
from .intervals import Interval, dump
from .settings import ACQUIRE_TIMEOUT_S, SCENARIO_TIMEOUT_S, WORK_TTL_S


@dataclass(frozen=True, slots=True)
class Keys:
    """The Redis keys of one scenario (its lock's own keys live under the lock's name)."""

    prefix: str

    @property
    def lock(self) -> str:
        return f"{self.prefix}:lock"

    @property
    def ready(self) -> str:
        return f"{self.prefix}:ready"

    @property
    def go(self) -> str:
        return f"{self.prefix}:go"

    @property
    def results(self) -> str:
        return f"{self.prefix}:results"

    @property
    def held(self) -> str:
        return f"{self.prefix}:held"

    @property
    def stop(self) -> str:
        return f"{self.prefix}:stop"

    @property
    def counter(self) -> str:
        return f"{self.prefix}:counter"


@dataclass(frozen=True, slots=True)
class Job:
    """What one worker process does: take the lock, hold it, give it back, ``rounds`` times."""

    keys: Keys
    mode: Mode = "write"
    limit: int | None = None
    fair: bool = False
    ttl: float = WORK_TTL_S
    rounds: int = 1_000_000
    delay_ms: float = 0.0
    hold_ms: float = 0.0
    pause_ms: float = 0.0
    count: bool = False
    """Hold the lock by GET, sleep ``hold_ms``, SET of the counter (else by sleeping)."""
    until_stopped: bool = False
    """Stop once the parent sets the stop key."""

    def lock(self, client: redis.Redis) -> Lock:
        return Lock(
            client, self.keys.lock, ttl=self.ttl, mode=self.mode, limit=self.limit, fair=self.fair
        )


def work(url: str, job: Job) -> None:
    """A worker process: leases taken and given back in a loop, logged as intervals."""
    _worker_signals()
    client = redis.Redis.from_url(url)
    lock = job.lock(client)
    until_ns = _start_line(client, job.keys)
    _sleep_ms(job.delay_ms)
    intervals: list[Interval] = []
    while len(intervals) < job.rounds and not _time_up(client, job, until_ns):
        intervals.append(_round(client, lock, job))
    client.rpush(job.keys.results, dump(intervals))


def hold_until_killed(url: str, job: Job) -> None:
    """A worker process that takes the lock, has its heartbeat keep it, and waits to be killed."""
    _worker_signals()
    client = redis.Redis.from_url(url)
    t_requested = time.monotonic_ns()
    lease = job.lock(client).acquire(timeout=ACQUIRE_TIMEOUT_S)
    t_acquired = time.monotonic_ns()
    Heartbeat.current().register(lease)
    held = Interval("write", os.getpid(), lease.fence, t_requested, t_acquired, 0)
    client.rpush(job.keys.held, dump([held]))
    while True:
        time.sleep(1)


def _worker_signals() -> None:
    """Ctrl-C is the parent's to handle (it stops the workers); SIGTERM just ends a worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker inherits the parent's
    unblock_stop_signals()  # blocked while it was forked


def _start_line(client: redis.Redis, keys: Keys) -> int:
    """Reports ready and waits for the parent's start; returns the end time it sent (0: none)."""
    client.rpush(keys.ready, os.getpid())
    reply = client.blpop([keys.go], timeout=SCENARIO_TIMEOUT_S)
    if not reply:
        raise RuntimeError("the parent never gave the start signal")
    return int(reply[1])


def _time_up(client: redis.Redis, job: Job, until_ns: int) -> bool:
    if until_ns and time.monotonic_ns() >= until_ns:
        return True
    return job.until_stopped and bool(client.exists(job.keys.stop))


def _round(client: redis.Redis, lock: Lock, job: Job) -> Interval:
    t_requested = time.monotonic_ns()
    lease = lock.acquire(timeout=ACQUIRE_TIMEOUT_S)
    t_acquired = time.monotonic_ns()
    if job.count:
        _increment(client, job.keys.counter, job.hold_ms)
    else:
        _sleep_ms(job.hold_ms)
    t_released = time.monotonic_ns()
    lease.release()
    _sleep_ms(job.pause_ms)
    return Interval(lock.mode, os.getpid(), lease.fence, t_requested, t_acquired, t_released)


def _increment(client: redis.Redis, key: str, sleep_ms: float) -> None:
    """counter += 1 the unsafe way: only the lock keeps two of these from interleaving."""
    value = int(client.get(key) or 0)
    _sleep_ms(sleep_ms)
    client.set(key, value + 1)


def _sleep_ms(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1000)
