"""A live demonstration of the lock core: four worker processes contend for real Redis locks.

``python -m celery_redislock.demo`` (about half a minute) or ``--quick`` (under 15 s) runs five
scenarios, one after another, on the Redis of :func:`celery_redislock.server.redis_url`
(``REDIS_URL``, else a redis-server started for the run and stopped at its end):

1. mutex       4 processes do a non-atomic GET, sleep, SET of one counter under a mutex: the
               final counter shows no update was lost; fences grow with every acquisition.
2. cap         a write lock with ``limit=3``: never more than 3 holders at once.
3. read/write  3 reader processes share the lock while 1 writer runs alone, and the writer gets
               in although readers keep coming.
4. fair        ``fair=True``: acquisitions are spread evenly over the processes (a run with
               ``fair=False`` is shown beside it for comparison).
5. crash       a holder of a renewed 1 s lease is SIGKILLed; a process blocked on the lock gets
               it about a ttl later, with a larger fence.

Every worker logs its leases as intervals (pid, mode, fence, and ``time.monotonic_ns()`` when
it asked, got and gave back the lease) and pushes them to a Redis list; the parent checks each
scenario's invariants on them, prints a report and exits 1 if one failed. ``--json PATH`` writes
the verdicts. Ctrl-C stops the workers, then the Redis server if the demo started it.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, astuple, dataclass, field
from itertools import pairwise
from multiprocessing.context import ForkContext, SpawnContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Literal

import redis

from .lock import Lock, Mode
from .renewal import Renewer
from .server import redis_url

__all__ = ["FULL", "QUICK", "Settings", "main"]

PROCESSES = 4
NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
# A worker that waits this long for a lock gives up: the scenario then fails instead of hanging.
ACQUIRE_TIMEOUT_S = 30.0
SCENARIO_TIMEOUT_S = 120.0
# Leases in the load scenarios are held for milliseconds: this ttl needs no renewal.
WORK_TTL_S = 10.0
CRASH_TTL_S = 1.0
# A process blocked on a dead holder's lock should get it this soon after the lease lapses.
CRASH_SLACK_MS = 500.0
COUNTER_SLEEP_MS = 2.0  # between the GET and the SET: the window a lost update would need
CAP_LIMIT = 3
READER_HOLD_MS = 15.0
WRITER_HOLD_MS = 5.0
WRITER_PAUSE_MS = 25.0
WRITER_MAX_WAIT_MS = 500.0
FAIR_HOLD_MS = 2.0


@dataclass(frozen=True, slots=True)
class Settings:
    """How much work each scenario does."""

    mutex_rounds: int
    cap_rounds: int
    cap_hold_ms: float
    writes: int
    fair_seconds: float
    crash_hold_s: float


QUICK = Settings(
    mutex_rounds=25, cap_rounds=15, cap_hold_ms=20, writes=12, fair_seconds=1.5, crash_hold_s=1.5
)
FULL = Settings(
    mutex_rounds=300, cap_rounds=120, cap_hold_ms=20, writes=80, fair_seconds=5, crash_hold_s=2.5
)


# -- what workers log ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Interval:
    """One lease as its holder saw it. Times are ``time.monotonic_ns()``, one clock per host."""

    mode: str
    pid: int
    fence: int
    t_requested: int
    t_acquired: int
    t_released: int

    @property
    def held_ms(self) -> float:
        return (self.t_released - self.t_acquired) / NS_PER_MS

    @property
    def waited_ms(self) -> float:
        return (self.t_acquired - self.t_requested) / NS_PER_MS


def _dump(intervals: Iterable[Interval]) -> str:
    return json.dumps([astuple(i) for i in intervals])


def _load(blob: bytes | str) -> list[Interval]:
    return [Interval(*row) for row in json.loads(blob)]


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


# -- worker processes ---------------------------------------------------------------------------


def _work(url: str, job: Job) -> None:
    """A worker process: leases taken and given back in a loop, logged as intervals."""
    _worker_signals()
    client = redis.Redis.from_url(url)
    lock = job.lock(client)
    until_ns = _start_line(client, job.keys)
    _sleep_ms(job.delay_ms)
    intervals: list[Interval] = []
    while len(intervals) < job.rounds and not _time_up(client, job, until_ns):
        intervals.append(_round(client, lock, job))
    client.rpush(job.keys.results, _dump(intervals))


def _hold_until_killed(url: str, job: Job) -> None:
    """A worker process that takes the lock, has its renewer keep it, and waits to be killed."""
    _worker_signals()
    client = redis.Redis.from_url(url)
    t_requested = time.monotonic_ns()
    lease = job.lock(client).acquire(timeout=ACQUIRE_TIMEOUT_S)
    t_acquired = time.monotonic_ns()
    Renewer.current().register(lease)
    held = Interval("write", os.getpid(), lease.fence, t_requested, t_acquired, 0)
    client.rpush(job.keys.held, _dump([held]))
    while True:
        time.sleep(1)


def _worker_signals() -> None:
    """Ctrl-C is the parent's to handle (it stops the workers); SIGTERM just ends a worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker inherits the parent's


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


# -- the parent's side --------------------------------------------------------------------------


@dataclass
class Run:
    """What the scenarios share: the Redis, a client, a process context and the pids started."""

    url: str
    client: redis.Redis
    context: ForkContext | SpawnContext
    settings: Settings
    run_id: str = field(default_factory=lambda: f"{os.getpid()}-{os.urandom(3).hex()}")
    pids: list[int] = field(default_factory=list)

    def keys(self, scenario: str) -> Keys:
        return Keys(f"demo:{self.run_id}:{scenario}")

    def forget_all(self) -> None:
        """Deletes the run's keys (its locks' keys expire by themselves), if Redis is still up."""
        try:
            stale = list(self.client.scan_iter(match=f"demo:{self.run_id}:*", count=500))
            if stale:
                self.client.delete(*stale)
        except redis.RedisError:
            pass  # interrupted, and the server is gone already


class Fleet:
    """The worker processes of one scenario; any still running when it closes are stopped."""

    def __init__(self, run: Run, keys: Keys) -> None:
        self.run = run
        self.keys = keys
        self.processes: list[BaseProcess] = []
        self.killed: set[int | None] = set()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(
        self, target: Callable[[str, Job], None], job: Job, count: int = 1
    ) -> list[BaseProcess]:
        started: list[BaseProcess] = []
        for _ in range(count):
            process = self.run.context.Process(target=target, args=(self.run.url, job), daemon=True)
            process.start()
            self.processes.append(process)
            self.run.pids.append(process.pid or 0)
            started.append(process)
        return started

    def go(self, count: int, seconds: float | None = None) -> None:
        """Waits until ``count`` workers are at the start line, then starts them together."""
        for _ in range(count):
            self.pop(self.keys.ready)
        until_ns = 0 if seconds is None else time.monotonic_ns() + int(seconds * NS_PER_S)
        self.run.client.rpush(self.keys.go, *[until_ns] * count)

    def pop(self, key: str) -> bytes | str:
        """The next item a worker pushes to ``key``; raises if a worker died first."""
        deadline = time.monotonic() + SCENARIO_TIMEOUT_S
        while time.monotonic() < deadline:
            reply = self.run.client.blpop([key], timeout=0.5)
            if reply:
                item: bytes | str = reply[1]
                return item
            crashed = self.crashed()
            if crashed:
                raise RuntimeError(f"worker {crashed[0]} before reporting on {key}")
        raise RuntimeError(f"no worker reported on {key} in {SCENARIO_TIMEOUT_S:g} s")

    def join(self, processes: Sequence[BaseProcess] | None = None) -> None:
        deadline = time.monotonic() + SCENARIO_TIMEOUT_S
        for process in self.processes if processes is None else processes:
            process.join(max(0.0, deadline - time.monotonic()))

    def kill(self, process: BaseProcess) -> int:
        """SIGKILLs ``process``; returns when, in ``time.monotonic_ns()``."""
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        when = time.monotonic_ns()
        self.killed.add(process.pid)
        process.join(5)
        return when

    def failures(self) -> list[str]:
        """Workers that did not finish cleanly (those killed on purpose excepted)."""
        return [
            f"pid {p.pid} " + ("did not finish" if p.exitcode is None else f"exit {p.exitcode}")
            for p in self.processes
            if p.pid not in self.killed and p.exitcode != 0
        ]

    def crashed(self) -> list[str]:
        """Workers that exited with an error so far."""
        return [
            f"pid {p.pid} exit {p.exitcode}"
            for p in self.processes
            if p.pid not in self.killed and p.exitcode not in (None, 0)
        ]

    def close(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join(3)
            if process.is_alive():
                process.kill()
                process.join()


def _collect(client: redis.Redis, key: str) -> list[Interval]:
    return [i for blob in client.lrange(key, 0, -1) for i in _load(blob)]


def _sleep_until(t_ns: int) -> None:
    time.sleep(max(0.0, (t_ns - time.monotonic_ns()) / NS_PER_S))


# -- analysis -----------------------------------------------------------------------------------


def max_concurrency(intervals: Iterable[Interval]) -> int:
    """The most intervals open at one instant (one that ends as another starts: no overlap)."""
    edges = sorted(e for i in intervals for e in ((i.t_acquired, 1), (i.t_released, -1)))
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def overlapping_pairs(a: Sequence[Interval], b: Sequence[Interval]) -> int:
    return sum(
        1 for x in a for y in b if x.t_acquired < y.t_released and y.t_acquired < x.t_released
    )


def handoffs_ms(intervals: Iterable[Interval]) -> list[float]:
    """Release of one holder to the acquisition by the next, for an exclusive lock."""
    ordered = sorted(intervals, key=lambda i: i.t_acquired)
    return [(b.t_acquired - a.t_released) / NS_PER_MS for a, b in pairwise(ordered)]


def fence_regressions(intervals: Iterable[Interval]) -> int:
    """Acquisitions (of an exclusive lock, in time order) whose fence is not above the last."""
    ordered = sorted(intervals, key=lambda i: i.t_acquired)
    return sum(1 for a, b in pairwise(ordered) if b.fence <= a.fence)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def time_at_level(intervals: Sequence[Interval]) -> dict[int, float]:
    """Share of the scenario's time spent with k holders, for each k."""
    edges = sorted(e for i in intervals for e in ((i.t_acquired, 1), (i.t_released, -1)))
    spent: Counter[int] = Counter()
    level = 0
    for (t0, step), (t1, _) in pairwise(edges):
        level += step
        spent[level] += t1 - t0
    total = sum(spent.values()) or 1
    return {k: spent[k] / total for k in sorted(spent)}


def _summary_ms(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"count": 0, "mean": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "count": len(values),
        "mean": round(statistics.fmean(values), 3),
        "p99": round(percentile(values, 99), 3),
        "max": round(max(values), 3),
    }


# -- verdicts -----------------------------------------------------------------------------------

Relation = Literal["==", "<=", ">="]


@dataclass(frozen=True, slots=True)
class Check:
    """One invariant: ``observed relation allowed`` must hold."""

    key: str
    invariant: str
    observed: float
    allowed: float
    relation: Relation
    unit: str = ""

    @property
    def passed(self) -> bool:
        if self.relation == "==":
            return self.observed == self.allowed
        if self.relation == "<=":
            return self.observed <= self.allowed
        return self.observed >= self.allowed

    def text(self) -> str:
        observed, allowed = _num(self.observed, self.unit), _num(self.allowed, self.unit)
        return f"{self.invariant}: {observed} {self.relation} {allowed}"

    def as_json(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "observed": _finite(self.observed),
            "allowed": _finite(self.allowed),
            "relation": self.relation,
            "unit": self.unit,
            "passed": self.passed,
        }


def _finite(value: float) -> float | None:
    """JSON has no infinity: an unmeasured value (no lease was ever taken) is null."""
    return value if math.isfinite(value) else None


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "none"
    text = str(value) if isinstance(value, int) else f"{value:.1f}"
    return f"{text} {unit}" if unit else text


@dataclass
class Outcome:
    """A scenario's verdicts and the numbers behind them."""

    name: str
    title: str
    checks: list[Check]
    stats: dict[str, Any]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "passed": self.passed,
            "checks": {c.key: c.as_json() for c in self.checks},
            "stats": self.stats,
        }


def _workers_check(fleet: Fleet) -> Check:
    failures = fleet.failures()
    for failure in failures:
        _say(f"  ! worker {failure}")
    return Check("workers", "workers that failed", len(failures), 0, "==")


# -- printing -----------------------------------------------------------------------------------


def _say(text: str = "") -> None:
    print(text, flush=True)


def _banner(number: int, name: str, text: str) -> None:
    _say()
    _say(f"[{number}/{len(SCENARIOS)}] {name}: {text}")


def _holder_table(intervals: Sequence[Interval]) -> None:
    """One line per holder process: leases taken, fences, time held."""
    _say(
        f"  {'pid':>7}  {'mode':<5}  {'leases':>6}  {'first fence':>16}  {'last fence':>16}"
        f"  {'held ms mean/max':>16}"
    )
    for pid in sorted({i.pid for i in intervals}):
        for mode in ("read", "write"):
            mine = sorted(
                (i for i in intervals if i.pid == pid and i.mode == mode),
                key=lambda i: i.t_acquired,
            )
            if mine:
                held = [i.held_ms for i in mine]
                _say(
                    f"  {pid:>7}  {mode:<5}  {len(mine):>6}  {mine[0].fence:>16}"
                    f"  {mine[-1].fence:>16}  {statistics.fmean(held):>7.1f} /{max(held):>7.1f}"
                )


def _print_checks(outcome: Outcome) -> None:
    for check in outcome.checks:
        _say(f"  {'PASS' if check.passed else 'FAIL'}  {check.text()}")


def _handoff_line(handoffs: Sequence[float]) -> str:
    s = _summary_ms(handoffs)
    return (
        f"handoff (release -> next holder acquires): mean {s['mean']:.2f} ms, "
        f"p99 {s['p99']:.2f} ms, max {s['max']:.2f} ms over {s['count']} handoffs"
    )


# -- scenarios ----------------------------------------------------------------------------------


def mutex(run: Run) -> Outcome:
    rounds = run.settings.mutex_rounds
    keys = run.keys("mutex")
    _banner(
        1,
        "mutex",
        f"{PROCESSES} processes x {rounds} rounds of GET, sleep "
        f"{COUNTER_SLEEP_MS:g} ms, SET of one counter under Lock(ttl={WORK_TTL_S:g})",
    )
    job = Job(keys, rounds=rounds, hold_ms=COUNTER_SLEEP_MS, count=True)
    with Fleet(run, keys) as fleet:
        fleet.start(_work, job, PROCESSES)
        fleet.go(PROCESSES)
        fleet.join()
    counter = int(run.client.get(keys.counter) or 0)
    return _judge_mutex(fleet, _collect(run.client, keys.results), counter, PROCESSES * rounds)


def _judge_mutex(fleet: Fleet, intervals: list[Interval], counter: int, planned: int) -> Outcome:
    handoffs = handoffs_ms(intervals)
    _holder_table(intervals)
    ordered = sorted(intervals, key=lambda i: i.t_acquired)
    changes = sum(1 for a, b in pairwise(ordered) if a.pid != b.pid)
    _say(f"  counter = {counter} after {len(intervals)} increments")
    _say(
        f"  fences: {len(intervals)} issued, {ordered[0].fence if ordered else '-'} .. "
        f"{ordered[-1].fence if ordered else '-'}"
    )
    _say(f"  {_handoff_line(handoffs)} ({changes} to another process)")
    for a, b in [(a, b) for a, b in pairwise(ordered) if a.pid != b.pid][:3]:
        _say(
            f"    e.g. pid {a.pid} released fence {a.fence}, pid {b.pid} got fence {b.fence} "
            f"{(b.t_acquired - a.t_released) / NS_PER_MS:.2f} ms later"
        )
    checks = [
        _workers_check(fleet),
        Check(
            "counter",
            "counter vs increments planned (no lost update)",
            counter,
            planned,
            "==",
        ),
        Check("max_concurrency", "max holders at once", max_concurrency(intervals), 1, "<="),
        Check(
            "fence_regressions",
            "fences not above the previous holder's",
            fence_regressions(intervals),
            0,
            "==",
        ),
    ]
    stats = {
        "acquisitions": len(intervals),
        "counter": counter,
        "holder_changes": changes,
        "handoff_ms": _summary_ms(handoffs),
    }
    return Outcome("mutex", "mutual exclusion", checks, stats)


def cap(run: Run) -> Outcome:
    s = run.settings
    keys = run.keys("cap")
    _banner(
        2,
        "cap",
        f"a fleet-wide cap of {CAP_LIMIT}: Lock(limit={CAP_LIMIT}); {PROCESSES} "
        f"processes x {s.cap_rounds} leases held {s.cap_hold_ms:g} ms each",
    )
    job = Job(keys, limit=CAP_LIMIT, rounds=s.cap_rounds, hold_ms=s.cap_hold_ms, pause_ms=1)
    with Fleet(run, keys) as fleet:
        fleet.start(_work, job, PROCESSES)
        fleet.go(PROCESSES)
        fleet.join()
    return _judge_cap(fleet, _collect(run.client, keys.results))


def _judge_cap(fleet: Fleet, intervals: list[Interval]) -> Outcome:
    peak = max_concurrency(intervals)
    shares = time_at_level(intervals)
    waits = [i.waited_ms for i in intervals]
    _holder_table(intervals)
    _say("  time with k holders: " + ", ".join(f"{k}: {v:.0%}" for k, v in shares.items()))
    _say(
        f"  wait for a lease: mean {statistics.fmean(waits) if waits else 0:.1f} ms, "
        f"max {max(waits, default=0):.1f} ms"
    )
    _say(f"  max concurrency: {peak} (allowed {CAP_LIMIT})")
    fences = [i.fence for i in intervals]
    checks = [
        _workers_check(fleet),
        Check("max_concurrency", "max holders at once", peak, CAP_LIMIT, "<="),
        Check("cap_reached", "the cap is used: max holders at once", peak, CAP_LIMIT, ">="),
        Check("fence_duplicates", "fences issued twice", len(fences) - len(set(fences)), 0, "=="),
    ]
    stats = {
        "acquisitions": len(intervals),
        "max_concurrency": peak,
        "time_at_level": {str(k): round(v, 4) for k, v in shares.items()},
        "wait_ms": _summary_ms(waits),
    }
    return Outcome("cap", f"fleet-wide cap of {CAP_LIMIT}", checks, stats)


def read_write(run: Run) -> Outcome:
    writes = run.settings.writes
    keys = run.keys("rw")
    _banner(
        3,
        "read/write",
        f"{PROCESSES - 1} processes read (hold {READER_HOLD_MS:g} ms, "
        f"again at once), 1 writes {writes} times (hold {WRITER_HOLD_MS:g} ms)",
    )
    readers = Job(keys, mode="read", hold_ms=READER_HOLD_MS, until_stopped=True)
    writer = Job(
        keys,
        mode="write",
        rounds=writes,
        delay_ms=50,
        hold_ms=WRITER_HOLD_MS,
        pause_ms=WRITER_PAUSE_MS,
    )
    with Fleet(run, keys) as fleet:
        fleet.start(_work, readers, PROCESSES - 1)
        writer_process = fleet.start(_work, writer)
        fleet.go(PROCESSES)
        fleet.join(writer_process)
        run.client.set(keys.stop, 1)
        fleet.join()
    intervals = _collect(run.client, keys.results)
    return _judge_read_write(fleet, intervals)


def _judge_read_write(fleet: Fleet, intervals: list[Interval]) -> Outcome:
    reads = [i for i in intervals if i.mode == "read"]
    writes = [i for i in intervals if i.mode == "write"]
    mixed = overlapping_pairs(reads, writes)
    waits = [w.waited_ms for w in writes]
    knocking = sum(
        1 for r in reads for w in writes if w.t_requested <= r.t_requested < w.t_acquired
    )
    _holder_table(intervals)
    _say(
        f"  max concurrent readers: {max_concurrency(reads)}; reader/writer overlaps: {mixed}; "
        f"max holders while a writer holds: {_max_beside_writers(reads, writes)}"
    )
    _say(
        f"  writer waits: mean {statistics.fmean(waits) if waits else 0:.1f} ms, max "
        f"{max(waits, default=0):.1f} ms; {knocking} reader requests came while it waited"
    )
    checks = [
        _workers_check(fleet),
        Check("reader_writer_overlaps", "reader leases overlapping a writer's", mixed, 0, "=="),
        Check(
            "writer_overlaps",
            "writer leases overlapping each other",
            max(0, max_concurrency(writes) - 1),
            0,
            "==",
        ),
        Check("readers_share", "max concurrent readers", max_concurrency(reads), 2, ">="),
        Check(
            "writer_max_wait",
            "writer's longest wait while readers keep coming",
            round(max(waits, default=math.inf), 1),
            WRITER_MAX_WAIT_MS,
            "<=",
            "ms",
        ),
    ]
    stats = {
        "reads": len(reads),
        "writes": len(writes),
        "max_readers": max_concurrency(reads),
        "writer_wait_ms": _summary_ms(waits),
        "reader_requests_while_writer_waited": knocking,
    }
    return Outcome(
        "read_write", "readers share, a writer runs alone and is not starved", checks, stats
    )


def _max_beside_writers(reads: Sequence[Interval], writes: Sequence[Interval]) -> int:
    """Holders (the writer included) at once during any write lease: 1 if writers run alone."""
    return max((1 + overlapping_pairs(reads, [w]) for w in writes), default=0)


def fair(run: Run) -> Outcome:
    seconds = run.settings.fair_seconds
    _banner(
        4,
        "fair",
        f"{PROCESSES} processes take Lock(fair=True) for {seconds:g} s "
        f"(hold {FAIR_HOLD_MS:g} ms), then the same with fair=False for comparison",
    )
    fair_counts, fair_fleet, fair_handoffs = _time_boxed(run, "fair", True, seconds)
    unfair_counts, _, unfair_handoffs = _time_boxed(run, "unfair", False, seconds)
    for label, counts, handoffs in (
        ("fair=True ", fair_counts, fair_handoffs),
        ("fair=False", unfair_counts, unfair_handoffs),
    ):
        per = ", ".join(f"{pid}: {n}" for pid, n in counts.items())
        _say(f"  {label}  acquisitions per pid: {per}  (spread {_spread(counts)})")
        _say(f"              {_handoff_line(handoffs)}")
    mean = statistics.fmean(fair_counts.values()) if fair_counts else 0
    allowed = max(2, math.ceil(0.05 * mean))
    checks = [
        _workers_check(fair_fleet),
        Check(
            "spread",
            "fair=True: max - min acquisitions per process",
            _spread(fair_counts),
            allowed,
            "<=",
        ),
    ]
    stats = {
        "fair_counts": list(fair_counts.values()),
        "unfair_counts": list(unfair_counts.values()),
        "fair_handoff_ms": _summary_ms(fair_handoffs),
        "unfair_handoff_ms": _summary_ms(unfair_handoffs),
    }
    return Outcome("fair", "fair mode spreads acquisitions evenly", checks, stats)


def _time_boxed(
    run: Run, name: str, is_fair: bool, seconds: float
) -> tuple[dict[int, int], Fleet, list[float]]:
    """All processes take the lock in a loop for ``seconds``; returns acquisitions per pid."""
    keys = run.keys(name)
    job = Job(keys, fair=is_fair, hold_ms=FAIR_HOLD_MS)
    with Fleet(run, keys) as fleet:
        processes = fleet.start(_work, job, PROCESSES)
        fleet.go(PROCESSES, seconds)
        fleet.join()
    intervals = _collect(run.client, keys.results)
    per_pid = Counter(i.pid for i in intervals)
    counts = {p.pid or 0: per_pid[p.pid or 0] for p in processes}
    return counts, fleet, handoffs_ms(intervals)


def _spread(counts: dict[int, int]) -> int:
    return max(counts.values(), default=0) - min(counts.values(), default=0)


def crash(run: Run) -> Outcome:
    hold_s = run.settings.crash_hold_s
    keys = run.keys("crash")
    _banner(
        5,
        "crash",
        f"a holder of Lock(ttl={CRASH_TTL_S:g}), kept by its Renewer, is "
        f"SIGKILLed after {hold_s:g} s; {PROCESSES - 1} processes wait for the lock",
    )
    job = Job(keys, ttl=CRASH_TTL_S, rounds=1, hold_ms=50)
    with Fleet(run, keys) as fleet:
        victim = fleet.start(_hold_until_killed, job)[0]
        held = _load(fleet.pop(keys.held))[0]
        waiters = fleet.start(_work, job, PROCESSES - 1)
        fleet.go(PROCESSES - 1)
        _sleep_until(held.t_acquired + int(hold_s * NS_PER_S))
        t_kill = fleet.kill(victim)
        _show_holders(job.lock(run.client), "right after the SIGKILL")
        fleet.join(waiters)
    dead = Interval(held.mode, held.pid, held.fence, held.t_requested, held.t_acquired, t_kill)
    return _judge_crash(fleet, dead, _collect(run.client, keys.results))


def _show_holders(lock: Lock, when: str) -> None:
    for h in lock.holders():
        _say(
            f"  holders() {when}: pid {h.info.get('pid')} fence {h.fence}, "
            f"expires in {h.expires_in:.2f} s (nobody renews it now)"
        )


def _judge_crash(fleet: Fleet, dead: Interval, intervals: list[Interval]) -> Outcome:
    ordered = sorted(intervals, key=lambda i: i.t_acquired)
    _say(
        f"  pid {dead.pid} took fence {dead.fence}, held {dead.held_ms / 1000:.2f} s on a "
        f"{CRASH_TTL_S:g} s ttl (renewed), then was killed"
    )
    for i in ordered:
        _say(
            f"  pid {i.pid} got fence {i.fence} {(i.t_acquired - dead.t_released) / NS_PER_MS:.0f}"
            f" ms after the kill (waited {i.waited_ms / 1000:.2f} s in all)"
        )
    recovery = (ordered[0].t_acquired - dead.t_released) / NS_PER_MS if ordered else math.inf
    checks = [
        _workers_check(fleet),
        Check(
            "acquired_while_alive",
            "waiters that got the lock while its holder lived",
            sum(1 for i in ordered if i.t_acquired < dead.t_released),
            0,
            "==",
        ),
        Check(
            "recovery",
            "lock taken over after the kill within",
            round(recovery, 1),
            CRASH_TTL_S * 1000 + CRASH_SLACK_MS,
            "<=",
            "ms",
        ),
        Check(
            "fence_regressions",
            "new fences not above the dead holder's",
            sum(1 for i in ordered if i.fence <= dead.fence),
            0,
            "==",
        ),
        Check(
            "max_concurrency",
            "max holders at once after the crash",
            max_concurrency(ordered),
            1,
            "<=",
        ),
    ]
    stats = {
        "killed_pid": dead.pid,
        "killed_fence": dead.fence,
        "recovery_ms": _finite(round(recovery, 1)),
        "next_fences": [i.fence for i in ordered],
        "ttl_ms": CRASH_TTL_S * 1000,
    }
    return Outcome("crash", "a killed holder's lease lapses after its ttl", checks, stats)


SCENARIOS: list[Callable[[Run], Outcome]] = [mutex, cap, read_write, fair, crash]


# -- main ---------------------------------------------------------------------------------------


def _context() -> ForkContext | SpawnContext:
    """fork where there is one (workers start in milliseconds), else spawn."""
    if "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _server_info(client: redis.Redis, url: str) -> dict[str, Any]:
    info = client.info("server")
    return {
        "url": url,
        "version": str(info.get("redis_version")),
        "pid": int(info.get("process_id", 0)),
        "started_here": not os.environ.get("REDIS_URL"),
    }


def run_all(url: str, settings: Settings) -> dict[str, Any]:
    """Runs every scenario on the Redis at ``url``; returns the summary."""
    client = redis.Redis.from_url(url)
    server = _server_info(client, url)
    where = "started for this run" if server["started_here"] else "from REDIS_URL"
    _say(
        f"celery_redislock demo: {PROCESSES} worker processes on Redis {server['version']} at "
        f"{url} (pid {server['pid']}, {where})"
    )
    run = Run(url, client, _context(), settings)
    outcomes = []
    try:
        for scenario in SCENARIOS:
            outcomes.append(_run_scenario(run, scenario))
    finally:
        run.forget_all()
        client.close()
    return {
        "passed": all(o.passed for o in outcomes),
        "redis": server,
        "workers": run.pids,
        "settings": asdict(settings),
        "scenarios": {o.name: o.as_json() for o in outcomes},
    }


def _run_scenario(run: Run, scenario: Callable[[Run], Outcome]) -> Outcome:
    """Runs one scenario and prints its verdicts; an error fails it and the demo goes on."""
    try:
        outcome = scenario(run)
    except Exception as exc:
        _say(f"  ! {type(exc).__name__}: {exc}")
        error = Check("error", f"errors ({type(exc).__name__}: {exc})", 1, 0, "==")
        outcome = Outcome(scenario.__name__, "did not complete", [error], {"error": repr(exc)})
    _print_checks(outcome)
    return outcome


def _print_summary(summary: dict[str, Any]) -> None:
    _say()
    _say("Summary")
    for name, scenario in summary["scenarios"].items():
        verdict = "PASS" if scenario["passed"] else "FAIL"
        details = ", ".join(
            f"{key} {_num(c['observed'], c['unit'])} {c['relation']} "
            f"{_num(c['allowed'], c['unit'])}"
            for key, c in scenario["checks"].items()
            if key != "workers" or not c["passed"]
        )
        _say(f"  {verdict}  {name:<10}  {details}")
    failed = [n for n, s in summary["scenarios"].items() if not s["passed"]]
    total = len(summary["scenarios"])
    result = f"all {total} scenarios passed"
    if failed:
        result = f"{len(failed)} of {total} scenarios FAILED: {', '.join(failed)}"
    _say(f"{result} in {summary['seconds']:.1f} s")


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m celery_redislock.demo",
        description="Worker processes contend for Redis locks; each lock kind's invariant is "
        "checked and reported.",
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds (under 15 s)")
    parser.add_argument("--json", metavar="PATH", type=Path, help="write the summary here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the demo; returns 0 if every invariant held, 1 if one failed, 130 if interrupted."""
    args = _parse(argv)
    settings = QUICK if args.quick else FULL
    signal.signal(signal.SIGTERM, _interrupted)
    started = time.monotonic()
    try:
        with redis_url() as url:
            summary = run_all(url, settings)
    except KeyboardInterrupt:
        print(
            "\ninterrupted: workers stopped, and the Redis server if started here", file=sys.stderr
        )
        return 130
    summary["seconds"] = round(time.monotonic() - started, 2)
    summary["quick"] = bool(args.quick)
    _print_summary(summary)
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
