"""Lock-core benchmark: celery_redislock vs redis-py, python-redis-lock, pottery and a raw floor.

Everything runs in one run on one Redis: a throwaway ``redis-server`` started here, unless
``--url`` (or ``REDIS_URL``) names one. What is measured:

1. Uncontended acquire+release pairs per second. One process, one lock name per lock, each lock
   looped for ~2 s after a warm-up; the locks take turns (round-robin, order rotated every
   round) over 3 rounds and the best round is kept. The raw floor is ``SET key token NX PX``
   plus a compare-and-delete Lua script registered once. Client CPU (``time.process_time``) and
   server CPU (``INFO cpu``) per pair show where the time goes.
2. Handoff latency. This process holds the lock and tells a waiter in another (forked) process to
   start a blocking acquire; it sleeps at least 5 ms so the waiter is surely blocked, stamps
   ``time.monotonic_ns()`` (CLOCK_MONOTONIC, system-wide on Linux) just before releasing, and
   the waiter stamps it just after its acquire returns. Polling locks (redis-py sleeps 0.1 s
   between tries, pottery a random 0-0.2 s) get a hold jitter of one poll period, so that the
   release lands at a random point of the poll cycle, and fewer handoffs.
3. Contention. 4 processes each loop blocking acquire -> hold 10 ms -> release for ``--duration``
   seconds. Reports acquisitions per process, fairness (min/max), and commands per acquisition
   both server-side (INFO commandstats after CONFIG RESETSTAT: every cmdstat_* call except
   INFO/CONFIG; Redis also counts there the commands that a Lua script runs) and client-side
   (commands the workers sent, i.e. round trips). ``--json`` writes the client-side figure as
   ``commands_per_acquisition`` and the server-side one as ``commands_per_acquisition_in_redis``.
   Redis's CPU per acquisition (``INFO cpu``, ``server_cpu_us_per_acquisition``) says what those
   commands cost it: a command inside a script costs far less than one a client sends.
4. Renewal. 10,000 leases on 10,000 names (not timed), then one timed ``renew_leases`` call.
   Round trips are the commands the client sent for it, checked against the server's EVALSHA
   count.

The pairs table has a physical floor row, ``ping_x2``: two loopback PING round trips from Python
per "pair" (a pair costs at least two round trips), and prints one PING's round trip under it;
and a design floor, ``fenced_floor``: the least a lock that hands out fencing tokens must run,
``SET NX PX`` and an ``INCR`` of a fence counter in one script, then the raw floor's release.
Handoff and contention have a design floor too, ``waiting_floor``: the fenced floor's take, a
``BLPOP`` on a signal list while the lock is held, and a release script that deletes the lease
and pushes one signal (python-redis-lock's shape, with a fence): like ours, three script calls
and a ``BLPOP`` per contended acquisition, each script as small as it can be.
``--load N`` runs N CPU-burning processes during every measurement (a loaded machine).

``--parser python|hiredis|both`` sets redis-py's reply parser (and command packer) for every
client: its pure-Python one, or hiredis (``pip install 'celery-redislock[hiredis]'``); by default
redis-py picks (hiredis when installed). With ``both``, the pairs of every lock run under each
parser, interleaved in the same rounds; sections 2-4 run under hiredis.

Run from the repository root::

    python benchmarks/lock_core.py [--json out.json] [--quick] [--url redis://...] [--duration 10]
        [--load N] [--parser python|hiredis|both]

A full run takes about 90 s on 2 cores and ``--quick`` about 20 s. Against ``--url`` the
benchmark resets the server's statistics (CONFIG RESETSTAT) and, at the end, deletes the keys it
created (every one contains ``lockbench-<run id>``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing as mp
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import redis
import redis_lock  # type: ignore[import-untyped]
from pottery import Redlock

import celery_redislock
from celery_redislock import Lock, renew_leases
from celery_redislock.core.layout import set_layout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    PARSERS,
    Load,
    Target,
    add_load_option,
    base_parser,
    default_parser,
    parser_kwargs,
    parsers_of,
    print_targets,
    redis_client,
    redis_target,
    section,
    version_of,
)
from floors import COMPARE_AND_DELETE, SET_AND_FENCE

TTL_S = 30
RENEW_TTL_S = 60
RENEW_LEASES = 10_000
CONTENDERS = 4
HOLD_S = 0.010  # contention: how long each acquisition holds the lock
SIGNAL_MS = 2000  # waiting floor: how long a release's signal lives (as our wake-ups)
SETTLE_S = 0.005  # handoff: the least the holder waits before releasing (the waiter is blocked)
PUSH_JITTER_S = 0.005  # handoff: extra random hold for push-woken locks
POLL_INTERVAL_S = {"redis_py": 0.1, "pottery": 0.2}  # polling locks: jitter of one poll period
HANDOFF_WARMUP = 3
OURS = "celery_redislock"
OURS_LEAN = "celery_redislock_lean"

Release = Callable[[], None]
Acquire = Callable[[], Release]  # a blocking acquire; returns the matching release
Factory = Callable[[redis.Redis, str], Acquire]


# -- the locks under test ------------------------------------------------------------------------


def _celery_redislock(fair: bool, layout: str = "shared") -> Factory:
    """Ours; ``layout`` ``"lean"``: in a namespace whose layout key turns on the fast path
    (``core/layout.py``), else the default namespace's general path."""

    def make(client: redis.Redis, name: str) -> Acquire:
        namespace = "redislock"
        if layout == "lean":
            namespace = "redislock-lean"
            set_layout(client, namespace, "lean")
        lock = Lock(client, name, ttl=TTL_S, fair=fair, namespace=namespace)

        def acquire() -> Release:
            return lock.acquire().release

        return acquire

    return make


def _redis_py(client: redis.Redis, name: str) -> Acquire:
    lock = client.lock(name, timeout=TTL_S)  # blocking acquire polls every 0.1 s (its default)

    def acquire() -> Release:
        if not lock.acquire():
            raise RuntimeError(f"redis-py did not acquire {name!r}")
        release: Release = lock.release
        return release

    return acquire


def _python_redis_lock(client: redis.Redis, name: str) -> Acquire:
    lock = redis_lock.Lock(client, name, expire=TTL_S)  # blocks on BLPOP of a signal list

    def acquire() -> Release:
        if not lock.acquire():
            raise RuntimeError(f"python-redis-lock did not acquire {name!r}")
        release: Release = lock.release
        return release

    return acquire


def _pottery(client: redis.Redis, name: str) -> Acquire:
    lock = Redlock(key=name, masters={client}, auto_release_time=TTL_S)

    def acquire() -> Release:
        if not lock.acquire():
            raise RuntimeError(f"pottery did not acquire {name!r}")
        return lock.release

    return acquire


def _raw_floor(client: redis.Redis, name: str) -> Acquire:
    delete = client.register_script(COMPARE_AND_DELETE)
    px = TTL_S * 1000

    def acquire() -> Release:
        token = os.urandom(16).hex()
        if not client.set(name, token, nx=True, px=px):
            raise RuntimeError(f"raw floor: {name!r} is held")  # only ever run uncontended

        def release() -> None:
            if delete(keys=[name], args=[token]) != 1:
                raise RuntimeError(f"raw floor: {name!r} was not held")

        return release

    return acquire


def _fenced_floor(client: redis.Redis, name: str) -> Acquire:
    """Not a full lock: the least a lock that hands out fencing tokens must do, ``SET NX PX``
    and an ``INCR`` of a fence counter in one script (no server-time fence floor, owners,
    modes, caps, waiters or re-entry), then the raw floor's release."""
    take = client.register_script(SET_AND_FENCE)
    delete = client.register_script(COMPARE_AND_DELETE)
    keys = [f"{{{name}}}:lease", f"{{{name}}}:fence"]
    px = TTL_S * 1000

    def acquire() -> Release:
        token = os.urandom(16).hex()
        if not take(keys=keys, args=[token, px]):
            raise RuntimeError(f"fenced floor: {name!r} is held")  # only ever run uncontended

        def release() -> None:
            if delete(keys=keys[:1], args=[token]) != 1:
                raise RuntimeError(f"fenced floor: {name!r} was not held")

        return release

    return acquire


_GIVE_AND_SIGNAL = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('LPUSH', KEYS[2], 1)
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"""


def _waiting_floor(client: redis.Redis, name: str) -> Acquire:
    """Not a full lock: the least a fenced lock whose waiters block (rather than poll) runs
    under contention. The fenced floor's take script; when the lock is held, a ``BLPOP`` on a
    signal list, then the take again; a release script that deletes the lease and pushes one
    signal (python-redis-lock's shape, with a fence). Three scripts and a ``BLPOP`` per
    contended acquisition, as ours: what those cost Redis is the floor for ours."""
    take = client.register_script(SET_AND_FENCE)
    give = client.register_script(_GIVE_AND_SIGNAL)
    keys = [f"{{{name}}}:lease", f"{{{name}}}:fence", f"{{{name}}}:signal"]
    px = TTL_S * 1000

    def acquire() -> Release:
        token = os.urandom(16).hex()
        while not take(keys=keys[:2], args=[token, px]):
            client.blpop([keys[2]], timeout=TTL_S)

        def release() -> None:
            if give(keys=[keys[0], keys[2]], args=[token, SIGNAL_MS]) != 1:
                raise RuntimeError(f"waiting floor: {name!r} was not held")

        return release

    return acquire


def _ping_floor(client: redis.Redis, name: str) -> Acquire:
    """Not a lock: the physical floor, one PING round trip for the acquire and one for the
    release."""

    def release() -> None:
        client.ping()

    def acquire() -> Release:
        client.ping()
        return release

    return acquire


LOCKS: dict[str, Factory] = {
    OURS: _celery_redislock(fair=False),
    "celery_redislock_fair": _celery_redislock(fair=True),
    OURS_LEAN: _celery_redislock(fair=False, layout="lean"),
    "redis_py": _redis_py,
    "python_redis_lock": _python_redis_lock,
    "pottery": _pottery,
    "raw_floor": _raw_floor,
    "fenced_floor": _fenced_floor,
    "waiting_floor": _waiting_floor,
    "ping_x2": _ping_floor,
}
PAIRS_LOCKS = (
    OURS,
    OURS_LEAN,
    "redis_py",
    "python_redis_lock",
    "pottery",
    "raw_floor",
    "fenced_floor",
    "ping_x2",
)
HANDOFF_LOCKS = (
    OURS,
    "celery_redislock_fair",
    "redis_py",
    "python_redis_lock",
    "pottery",
    "waiting_floor",
)
CONTENTION_LOCKS = (
    OURS,
    OURS_LEAN,
    "celery_redislock_fair",
    "redis_py",
    "python_redis_lock",
    "waiting_floor",
)


# -- Redis helpers -------------------------------------------------------------------------------


class CountingConnection(redis.Connection):
    """A connection that counts the writes this process sends through it: a command, or a
    pipeline's commands sent together (one round trip; a command goes through here too)."""

    sent = 0

    def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(*args, **kwargs)  # type: ignore[no-untyped-call]


def counting_client(url: str, parser: str) -> redis.Redis:
    return redis.Redis.from_url(url, connection_class=CountingConnection, **parser_kwargs(parser))


def server_cpu_s(admin: redis.Redis) -> float:
    info = admin.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def command_calls(admin: redis.Redis) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT, leaving out INFO and CONFIG."""
    stats = admin.info("commandstats")
    return {
        key.removeprefix("cmdstat_"): int(value["calls"])
        for key, value in stats.items()
        if not key.startswith(("cmdstat_info", "cmdstat_config"))
    }


def delete_keys(admin: redis.Redis, prefix: str) -> int:
    """Deletes every key whose name contains ``prefix``; returns how many."""
    batch: list[bytes] = []
    deleted = 0
    for key in admin.scan_iter(match=f"*{prefix}*", count=1000):
        batch.append(key)
        if len(batch) == 1000:
            deleted += int(admin.unlink(*batch))
            batch.clear()
    if batch:
        deleted += int(admin.unlink(*batch))
    return deleted


def stop_process(process: BaseProcess) -> None:
    process.join(5)
    if process.is_alive():
        process.terminate()
        process.join(5)
    if process.is_alive():
        process.kill()
        process.join()


# -- 1. uncontended pairs ------------------------------------------------------------------------


@dataclass(frozen=True)
class PairsResult:
    pairs_per_s: float
    client_cpu_us: float  # per pair, this process (all its threads)
    server_cpu_us: float  # per pair, redis-server (user + sys)
    server_commands: float  # per pair, as commandstats counts them (script internals included)

    @property
    def wall_us(self) -> float:
        return 1e6 / self.pairs_per_s


def measure_pairs(acquire: Acquire, admin: redis.Redis, seconds: float) -> PairsResult:
    for _ in range(200):
        acquire()()
    admin.config_resetstat()
    cpu_before, proc_before = server_cpu_s(admin), time.process_time()
    start = time.perf_counter()
    end = start + seconds
    pairs = 0
    while time.perf_counter() < end:
        acquire()()
        pairs += 1
    elapsed = time.perf_counter() - start
    client_cpu = time.process_time() - proc_before
    server_cpu = server_cpu_s(admin) - cpu_before
    commands = sum(command_calls(admin).values())
    return PairsResult(
        pairs / elapsed, client_cpu / pairs * 1e6, server_cpu / pairs * 1e6, commands / pairs
    )


Pairs = dict[str, dict[str, PairsResult]]  # parser -> lock -> best round


def run_pairs(
    url: str, admin: redis.Redis, prefix: str, rounds: int, seconds: float, parsers: list[str]
) -> Pairs:
    """Every (parser, lock) takes its turn in every round, order rotated each round."""
    runs = [(parser, lib) for parser in parsers for lib in PAIRS_LOCKS]
    clients = {run: redis_client(url, run[0]) for run in runs}
    try:
        acquires = {
            (parser, lib): LOCKS[lib](clients[parser, lib], f"{prefix}:pairs:{parser}:{lib}")
            for parser, lib in runs
        }
        best: dict[tuple[str, str], PairsResult] = {}
        for r in range(rounds):
            shift = r % len(runs)
            for run in runs[shift:] + runs[:shift]:
                result = measure_pairs(acquires[run], admin, seconds)
                if run not in best or result.pairs_per_s > best[run].pairs_per_s:
                    best[run] = result
        return {parser: {lib: best[parser, lib] for lib in PAIRS_LOCKS} for parser in parsers}
    finally:
        for each in clients.values():
            each.close()


# -- 2. handoff latency --------------------------------------------------------------------------


@dataclass(frozen=True)
class HandoffResult:
    latencies_ms: list[float]
    not_blocked: int  # handoffs in which the waiter had not started acquiring before the release

    @property
    def mean(self) -> float:
        return statistics.fmean(self.latencies_ms)

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]  # nearest rank

    @property
    def p99(self) -> float:
        return self.quantile(0.99)


def _handoff_waiter(lib: str, url: str, parser: str, name: str, conn: Connection) -> None:
    waiter = redis_client(url, parser)
    try:
        acquire = LOCKS[lib](waiter, name)
        while conn.recv():
            started = time.monotonic_ns()
            release = acquire()
            acquired = time.monotonic_ns()
            release()
            conn.send((started, acquired))
    finally:
        waiter.close()


def measure_handoffs(lib: str, url: str, parser: str, name: str, count: int) -> HandoffResult:
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe()
    waiter = ctx.Process(target=_handoff_waiter, args=(lib, url, parser, name, there), daemon=True)
    holder = redis_client(url, parser)
    acquire = LOCKS[lib](holder, name)
    jitter = POLL_INTERVAL_S.get(lib, PUSH_JITTER_S)
    latencies: list[float] = []
    not_blocked = 0
    waiter.start()
    try:
        for i in range(HANDOFF_WARMUP + count):
            release = acquire()
            here.send(True)
            time.sleep(SETTLE_S + random.uniform(0, jitter))
            released = time.monotonic_ns()
            release()
            if not here.poll(60):
                raise RuntimeError(f"{lib}: the waiter did not get the lock within 60 s")
            started, acquired = here.recv()
            if i >= HANDOFF_WARMUP:
                latencies.append((acquired - released) / 1e6)
                not_blocked += started >= released
    finally:
        with suppress(OSError):
            here.send(False)  # tells the waiter to exit
        stop_process(waiter)
        holder.close()
    return HandoffResult(latencies, not_blocked)


def run_handoffs(
    url: str, parser: str, prefix: str, count: int, polling_count: int
) -> dict[str, HandoffResult]:
    return {
        lib: measure_handoffs(
            lib,
            url,
            parser,
            f"{prefix}:handoff:{lib}",
            polling_count if lib in POLL_INTERVAL_S else count,
        )
        for lib in HANDOFF_LOCKS
    }


# -- 3. contention -------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerReport:
    index: int
    acquisitions: int
    commands_sent: int
    error: str | None = None


@dataclass(frozen=True)
class ContentionResult:
    per_process: list[int]
    commands_sent: int  # by all workers, while measured
    server_calls: dict[str, int]  # commandstats, script internals included
    server_cpu_s: float  # redis-server user+sys while measured

    @property
    def acquisitions(self) -> int:
        return sum(self.per_process)

    @property
    def server_cpu_us_per_acquisition(self) -> float:
        return self.server_cpu_s * 1e6 / self.acquisitions

    @property
    def fairness(self) -> float:
        return min(self.per_process) / max(self.per_process)

    @property
    def server_per_acquisition(self) -> float:
        return sum(self.server_calls.values()) / self.acquisitions

    @property
    def client_per_acquisition(self) -> float:
        return self.commands_sent / self.acquisitions


def _contention_worker(
    lib: str,
    url: str,
    parser: str,
    name: str,
    duration: float,
    index: int,
    ready: Queue[str | None],
    go: Event,
    results: Queue[WorkerReport],
) -> None:
    announced = False
    try:
        contender = counting_client(url, parser)
        acquire = LOCKS[lib](contender, name)
        acquire()()  # connect and load the scripts before the clock starts
        ready.put(None)
        announced = True
        go.wait()
        CountingConnection.sent = 0
        deadline = time.monotonic() + duration
        count = 0
        while time.monotonic() < deadline:
            release = acquire()
            count += 1
            time.sleep(HOLD_S)
            release()
        results.put(WorkerReport(index, count, CountingConnection.sent))
        contender.close()
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
        if announced:
            results.put(WorkerReport(index, 0, 0, message))
        else:
            ready.put(message)


def measure_contention(
    lib: str, url: str, parser: str, name: str, duration: float
) -> ContentionResult:
    ctx = mp.get_context("fork")
    ready: Queue[str | None] = ctx.Queue()
    results: Queue[WorkerReport] = ctx.Queue()
    go = ctx.Event()
    workers = [
        ctx.Process(
            target=_contention_worker,
            args=(lib, url, parser, name, duration, i, ready, go, results),
            daemon=True,
        )
        for i in range(CONTENDERS)
    ]
    admin = redis.Redis.from_url(url)
    try:
        for worker in workers:
            worker.start()
        for _ in workers:
            error = ready.get(timeout=60)
            if error:
                raise RuntimeError(f"{lib}: a worker failed to start: {error}")
        admin.config_resetstat()
        cpu_before = server_cpu_s(admin)
        go.set()
        reports = sorted(
            (results.get(timeout=duration + 60) for _ in workers), key=lambda r: r.index
        )
        cpu = server_cpu_s(admin) - cpu_before
        calls = command_calls(admin)
    finally:
        go.set()
        for worker in workers:
            stop_process(worker)
        admin.close()
    errors = [r.error for r in reports if r.error]
    if errors:
        raise RuntimeError(f"{lib}: workers failed: {errors}")
    return ContentionResult(
        [r.acquisitions for r in reports], sum(r.commands_sent for r in reports), calls, cpu
    )


def run_contention(
    url: str, parser: str, prefix: str, duration: float
) -> dict[str, ContentionResult]:
    return {
        lib: measure_contention(lib, url, parser, f"{prefix}:contention:{lib}", duration)
        for lib in CONTENTION_LOCKS
    }


# -- 4. renewal ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RenewResult:
    leases: int
    renewed: int
    seconds: float
    round_trips: int  # commands the client sent for the renew_leases call
    server_calls: dict[str, int]  # commandstats for it, script internals included


def measure_renew(
    url: str, parser: str, admin: redis.Redis, prefix: str, count: int
) -> RenewResult:
    renewer = counting_client(url, parser)
    try:
        leases = [
            Lock(renewer, f"{prefix}:renew:{i}", ttl=RENEW_TTL_S).acquire(blocking=False)
            for i in range(count)
        ]
        renew_leases(leases[:1])  # the script is then cached, as for a heartbeat in steady state
        admin.config_resetstat()
        sent_before = CountingConnection.sent
        start = time.perf_counter()
        report = renew_leases(leases)
        seconds = time.perf_counter() - start
        round_trips = CountingConnection.sent - sent_before
        calls = command_calls(admin)
    finally:
        renewer.close()
    return RenewResult(count, len(report.renewed), seconds, round_trips, calls)


# -- reporting -----------------------------------------------------------------------------------


def shown(parser: str) -> str:
    """A parser's name as printed: ``auto`` is the one redis-py picked."""
    return f"{default_parser()} (redis-py's pick)" if parser == "auto" else parser


def print_pairs(pairs: Pairs, rounds: int, seconds: float) -> None:
    parsers = list(pairs)
    both = "python" in pairs and "hiredis" in pairs
    section(
        f"1. Uncontended acquire+release pairs (one process, one name; best of {rounds} "
        f"interleaved round(s) of {seconds:g} s; parser: {', '.join(map(shown, parsers))})"
    )
    print(
        f"  {'lock':<22}{'parser':<9}{'pairs/s':>9}{'ours/peer':>11}"
        + (f"{'hiredis/py':>12}" if both else "")
        + f"{'us/pair':>10}{'client CPU':>12}{'server CPU':>12}{'server cmds':>13}"
    )
    for lib in PAIRS_LOCKS:
        for parser in parsers:
            r = pairs[parser][lib]
            ours = pairs[parser][OURS].pairs_per_s
            gain = ""
            if both:
                speedup = r.pairs_per_s / pairs["python"][lib].pairs_per_s
                gain = f"{'':>12}" if parser == "python" else f"{speedup:>11.2f}x"
            name = default_parser() if parser == "auto" else parser
            print(
                f"  {lib:<22}{name:<9}{r.pairs_per_s:>9,.0f}{ours / r.pairs_per_s:>10.2f}x{gain}"
                f"{r.wall_us:>10.1f}{r.client_cpu_us:>10.1f}us{r.server_cpu_us:>10.1f}us"
                f"{r.server_commands:>13.1f}"
            )
    for parser in parsers:
        print(
            f"  ping_x2 ({shown(parser)}): two loopback PINGs per pair, the physical floor; one "
            f"PING round trip {pairs[parser]['ping_x2'].wall_us / 2:.1f} us"
        )
    print(
        "  ours/peer: within the same parser; client/server CPU: per pair (this process incl. "
        "threads / redis-server user+sys); server cmds: per pair, incl. commands run inside Lua "
        "scripts"
    )


HANDOFF_NOTES = {
    OURS: "woken by a push (BLPOP), then one acquire script call",
    "celery_redislock_fair": "granted by the release, woken by a push (BLPOP)",
    "redis_py": "polls: redis-py default sleep=0.1 s",
    "python_redis_lock": "BLPOP on a signal list, then GET + SET NX",
    "pottery": "polls: random sleep of 0-0.2 s",
    "waiting_floor": "BLPOP on a signal list, then the fenced floor's take script",
}


def print_handoffs(handoffs: dict[str, HandoffResult]) -> None:
    section("2. Handoff: release -> a waiter blocked in another process holds the lock")
    ours = handoffs[OURS].mean
    print(
        f"  {'lock':<22}{'n':>5}{'mean ms':>10}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'ours/peer':>11}  note"
    )
    for lib, h in handoffs.items():
        note = HANDOFF_NOTES[lib]
        if h.not_blocked:
            note += f"; {h.not_blocked} waiter(s) not yet acquiring at release"
        print(
            f"  {lib:<22}{len(h.latencies_ms):>5}{h.mean:>10.3f}{h.quantile(0.5):>9.3f}"
            f"{h.p99:>9.3f}{max(h.latencies_ms):>9.3f}{ours / h.mean:>10.3f}x  {note}"
        )
    print("  p99 is the nearest-rank 99th percentile (the max for fewer than 100 handoffs)")


def print_contention(contention: dict[str, ContentionResult], duration: float) -> None:
    section(
        f"3. Contention: {CONTENDERS} processes x (blocking acquire -> hold {HOLD_S * 1000:g} ms"
        f" -> release) for {duration:g} s"
    )
    print(
        f"  {'lock':<22}{'acquired':>9}  {'per process':<26}{'min/max':>8}"
        f"{'server cmds/acq':>17}{'server CPU/acq':>16}{'client cmds/acq':>17}"
    )
    for lib, c in contention.items():
        per = " ".join(str(n) for n in c.per_process)
        print(
            f"  {lib:<22}{c.acquisitions:>9}  {per:<26}{c.fairness:>8.3f}"
            f"{c.server_per_acquisition:>17.2f}{c.server_cpu_us_per_acquisition:>14.1f}us"
            f"{c.client_per_acquisition:>17.2f}"
        )
    print(
        "  server cmds: INFO commandstats (incl. commands run inside Lua scripts); server CPU: "
        "redis-server user+sys (INFO cpu) per acquisition; client cmds: commands the workers sent "
        "(round trips)"
    )
    for lib, c in contention.items():
        top = sorted(c.server_calls.items(), key=lambda kv: -kv[1])[:8]
        acq = c.acquisitions
        print(f"  {lib}: " + ", ".join(f"{cmd} {n / acq:.2f}" for cmd, n in top))


def print_renew(renew: RenewResult) -> None:
    section(f"4. Renewal: one renew_leases() call over {renew.leases:,} leases on as many names")
    evalsha = renew.server_calls.get("evalsha", 0)
    inside = sum(renew.server_calls.values()) - evalsha
    print(
        f"  {renew.seconds * 1000:.1f} ms, {renew.round_trips} round trip(s); "
        f"renewed {renew.renewed:,}/{renew.leases:,}; server saw {evalsha} EVALSHA "
        f"(+{inside:,} commands run inside the script)"
    )


def targets(
    pairs: dict[str, PairsResult],  # of one parser
    handoffs: dict[str, HandoffResult],
    contention: dict[str, ContentionResult],
    renew: RenewResult,
) -> list[Target]:
    ours = pairs[OURS].pairs_per_s
    return [
        Target(
            "pairs/s, celery_redislock / redis_py",
            ours / pairs["redis_py"].pairs_per_s,
            1.0,
            True,
            "x",
        ),
        Target(
            "pairs/s, celery_redislock / raw_floor",
            ours / pairs["raw_floor"].pairs_per_s,
            0.9,
            True,
            "x",
        ),
        Target(
            "commands Redis ran per contended acquisition, celery_redislock",
            contention[OURS].server_per_acquisition,
            15,
            False,
        ),
        Target(
            "commands Redis ran per contended acquisition, celery_redislock_fair",
            contention["celery_redislock_fair"].server_per_acquisition,
            20,
            False,
        ),
        Target(
            "Redis CPU per contended acquisition, celery_redislock / python_redis_lock",
            contention[OURS].server_cpu_us_per_acquisition
            / contention["python_redis_lock"].server_cpu_us_per_acquisition,
            1.3,
            False,
            "x",
        ),
        Target("handoff mean, celery_redislock", handoffs[OURS].mean, 1.5, False, " ms"),
        Target(
            "handoff mean, celery_redislock / python_redis_lock",
            handoffs[OURS].mean / handoffs["python_redis_lock"].mean,
            1.0,
            False,
            "x",
        ),
        Target("handoff p99, celery_redislock", handoffs[OURS].p99, 5.0, False, " ms"),
        Target(
            "fairness min/max, celery_redislock_fair",
            contention["celery_redislock_fair"].fairness,
            0.9,
            True,
        ),
        # Round trips: INFO commandstats also counts every command a Lua script runs inside,
        # which says nothing about network cost; both figures are printed and written.
        *(
            Target(
                f"commands/acquisition sent by clients, {lib}",
                contention[lib].client_per_acquisition,
                5.0,
                False,
            )
            for lib in (OURS, "celery_redislock_fair")
        ),
        Target("renew 10k: round trips (one node)", renew.round_trips, 1, False),
        Target("renew 10k: seconds", renew.seconds * 1000, 100, False, " ms"),
        Target("renew 10k: leases renewed", renew.renewed, renew.leases, True),
    ]


def to_json(
    pairs: Pairs,
    handoffs: dict[str, HandoffResult],
    contention: dict[str, ContentionResult],
    renew: RenewResult,
) -> dict[str, Any]:
    main = list(pairs)[-1]
    return {
        "parser": default_parser() if main == "auto" else main,
        "pairs_per_s": {lib: round(r.pairs_per_s, 1) for lib, r in pairs[main].items()},
        "pairs_per_s_by_parser": {
            default_parser() if parser == "auto" else parser: {
                lib: round(r.pairs_per_s, 1) for lib, r in results.items()
            }
            for parser, results in pairs.items()
        },
        "client_cpu_us_per_pair_by_parser": {
            default_parser() if parser == "auto" else parser: {
                lib: round(r.client_cpu_us, 2) for lib, r in results.items()
            }
            for parser, results in pairs.items()
        },
        "handoff_ms": {
            lib: {"mean": round(h.mean, 4), "p99": round(h.p99, 4)} for lib, h in handoffs.items()
        },
        "fairness_min_over_max": {lib: round(c.fairness, 4) for lib, c in contention.items()},
        "commands_per_acquisition": {
            lib: round(c.client_per_acquisition, 3) for lib, c in contention.items()
        },
        "commands_per_acquisition_in_redis": {
            lib: round(c.server_per_acquisition, 3) for lib, c in contention.items()
        },
        "server_cpu_us_per_acquisition": {
            lib: round(c.server_cpu_us_per_acquisition, 2) for lib, c in contention.items()
        },
        "renew_10k": {"seconds": round(renew.seconds, 5), "round_trips": renew.round_trips},
    }


# -- command line --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    pair_seconds: float
    rounds: int
    handoffs: int
    polling_handoffs: int
    duration: float


FULL = Settings(pair_seconds=2.0, rounds=3, handoffs=200, polling_handoffs=30, duration=10.0)
QUICK = Settings(pair_seconds=0.5, rounds=2, handoffs=40, polling_handoffs=8, duration=2.0)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__ or "", "short smoke-test durations")
    parser.add_argument(
        "--duration", type=float, help="seconds of each contention run (default 10, quick 2)"
    )
    add_load_option(parser, "during the measurements")
    parser.add_argument(
        "--parser",
        choices=PARSERS,
        default="auto",
        help="redis-py's parser: python, hiredis, or both side by side in the pairs (default: "
        "redis-py's pick, hiredis when installed)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = QUICK if args.quick else FULL
    if args.duration is not None:
        settings = dataclasses.replace(settings, duration=args.duration)
    parsers = parsers_of(args.parser)
    main_parser = parsers[-1]  # sections 2-4, and the targets
    began = time.perf_counter()
    prefix = f"lockbench-{os.getpid()}-{os.urandom(3).hex()}"
    with redis_target(args.url or os.environ.get("REDIS_URL")) as (url, origin):
        admin = redis.Redis.from_url(url)
        try:
            version = admin.info("server")["redis_version"]
            print(
                f"lock-core benchmark: Redis {version} at {url} ({origin}); Python "
                f"{platform.python_version()}, {os.cpu_count()} CPU(s), load average "
                f"{os.getloadavg()[0]:.2f}" + ("; --quick" if args.quick else ""),
                flush=True,
            )
            package = Path(celery_redislock.__file__).parent
            print(f"celery_redislock {celery_redislock.__version__} from {package}", flush=True)
            print(
                f"redis-py {redis.__version__}, hiredis {version_of('hiredis')}; parser: "
                f"{', '.join(map(shown, parsers))}"
                + (f" (sections 2-4: {main_parser})" if len(parsers) > 1 else ""),
                flush=True,
            )
            if args.load:
                print(f"under load: {args.load} CPU-burning process(es) run throughout", flush=True)
            with Load(args.load):
                pairs = run_pairs(
                    url, admin, prefix, settings.rounds, settings.pair_seconds, parsers
                )
                print_pairs(pairs, settings.rounds, settings.pair_seconds)
                handoffs = run_handoffs(
                    url, main_parser, prefix, settings.handoffs, settings.polling_handoffs
                )
                print_handoffs(handoffs)
                contention = run_contention(url, main_parser, prefix, settings.duration)
                print_contention(contention, settings.duration)
                renew = measure_renew(url, main_parser, admin, prefix, RENEW_LEASES)
                print_renew(renew)
        finally:
            delete_keys(admin, prefix)
            admin.close()
    checks = targets(pairs[main_parser], handoffs, contention, renew)
    print_targets(checks, began)
    if args.json:
        out = to_json(pairs, handoffs, contention, renew)
        out["load_processes"] = args.load
        args.json.write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
