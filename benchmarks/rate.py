"""Rate-limit benchmark: ``RateLimit.reserve`` (the GCRA bucket) against today's sliding window
and a plain INCR+EXPIRE fixed window, side by side.

Everything runs in one run on one Redis: a throwaway ``redis-server`` started here, unless
``--url`` (or ``REDIS_URL``) names one. Four limiters take turns on the same cases:

* ``fixed window``: ``INCR`` and ``PEXPIRE`` in one pipelined round trip (a window key per
  period), the usual cheapest limiter, which neither remembers requests nor hands out slots:
  the floor;
* ``reserve``: ``RateLimit(client, name, rate).reserve(request_id)``, cost 1, burst 1;
* ``reserve, cost 7, burst 50``: ``RateLimit(..., burst=50).reserve(request_id, cost=7)``;
* ``today's window``: the sliding window of reserved slots that ``RateLimit`` ran before the
  bucket (a sorted set of request id -> slot per name), ``benchmarks/window_rate.lua``, run
  with redis-py's ``register_script`` behind the client path the old ``reserve`` had (the same
  argument checks and reply parsing).

A fresh request id per call. The cases:

1. One process, one key: on a limit never reached (``100000/s``: every slot is now) and on one
   always reached (``10/s``: the backlog grows, every slot is in the future).
2. One process, 1,000 keys: the same, the calls going round 1,000 names.
3. Four processes on one key, all at once: the total (the server's share shows here).

Each limiter runs ~1.5 s per case (``--quick``: 0.5 s) after a warm-up, over 3 rounds in
rotating order; shown: the best round's calls/s, and the median over the rounds of Redis's CPU
per call (``INFO cpu``, user + sys of redis-server, over the timed part), of its time inside the
commands sent (``INFO commandstats``: ``EVALSHA`` for the scripts, ``INCR`` + ``PEXPIRE`` for the
fixed window) and of the client's CPU per call (``time.process_time``). Ratios: new / today's
window and new / the fixed window, in the same run.

Then memory: one name at 100/s after 1 and after 1,000 reservations (ids of Celery's form
``<task id>.<retries>``), ``MEMORY USAGE`` (all samples) summed over the keys the name holds
(today's window: its sorted set; the bucket: its hash and one record per request) and the growth
of ``used_memory``.

Run from the repository root::

    python benchmarks/rate.py [--json out.json] [--quick] [--url redis://...]

Against ``--url`` it resets the server's statistics (``CONFIG RESETSTAT``) and deletes the keys
it created (each contains the run id) at the end.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from celery_redislock.core._validate import non_empty_string
from celery_redislock.core.durations import seconds_or_none
from celery_redislock.core.keys import LockKeys
from celery_redislock.core.protocol import text
from celery_redislock.core.rate import MAX_DELAY, MAX_LATE, RateLimit, Reservation, parse_rate
from celery_redislock.core.store import backend_errors

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    base_parser,
    default_parser,
    delete_keys,
    redis_cpu_s,
    redis_target,
    section,
)

KEYS = 1000
PROCESSES = 4
ROUNDS = 3
NEVER_FULL, FULL = "100000/s", "10/s"
COST, BURST = 7, 50
WINDOW_LUA = Path(__file__).resolve().parent / "window_rate.lua"

LIMITERS = {
    "fixed": "INCR+PEXPIRE fixed window",
    "window": "today's window (zset)",
    "reserve": "reserve (bucket)",
    "cost": f"reserve, cost {COST}, burst {BURST}",
}
# What Redis ran for a call that the call itself sent (a script's own commands are inside).
SENT = {
    "fixed": ("cmdstat_incr", "cmdstat_pexpire"),
    "window": ("cmdstat_evalsha",),
    "reserve": ("cmdstat_evalsha",),
    "cost": ("cmdstat_evalsha",),
}

Call = Callable[[int], object]


# -- the limiters ---------------------------------------------------------------------------------


def reserve_call(client: redis.Redis, names: list[str], rate: str, cost: bool) -> Call:
    burst = BURST if cost else 1
    limits = [RateLimit(client, name, rate, burst=burst) for name in names]
    tag = uuid.uuid4().hex[:8]  # request ids differ between processes
    keys = len(limits)
    if cost:
        return lambda i: limits[i % keys].reserve(f"{tag}-{i}", cost=COST)
    return lambda i: limits[i % keys].reserve(f"{tag}-{i}")


def _ms(value: float | None) -> str:
    return "" if value is None else str(int(value * 1000))


def window_reserve(client: redis.Redis, name: str, rate: str) -> Callable[[str], Reservation]:
    """Today's window for ``name``, behind the old ``RateLimit.reserve``'s client path (its
    argument checks and reply parsing; no max delay, no max late)."""
    script = client.register_script(WINDOW_LUA.read_text())
    parsed = parse_rate(rate)
    limit, per_ms = str(parsed.limit), str(parsed.per_ms)
    key = f"{LockKeys.of('redislock', name).prefix}:rate"  # the old key: the name's tag, ":rate"

    def reserve(
        request_id: str, max_delay: float | None = None, max_late: float | None = None
    ) -> Reservation:
        request_id = non_empty_string(request_id, "request_id", name=name)
        delay_s = seconds_or_none(max_delay, MAX_DELAY, "max_delay", name=name)
        late_s = seconds_or_none(max_late, MAX_LATE, "max_late", name=name)
        args = ("r", request_id, limit, per_ms, _ms(delay_s), _ms(late_s))
        with backend_errors(name, "rate limit"):
            reply = script(keys=[key], args=args, client=client)
        granted, slot, delay = text(reply).split()
        return Reservation(granted=granted == "1", delay=int(delay) / 1000, slot_ms=int(slot))

    return reserve


def window_call(client: redis.Redis, names: list[str], rate: str) -> Call:
    limits = [window_reserve(client, name, rate) for name in names]
    tag = uuid.uuid4().hex[:8]
    keys = len(limits)
    return lambda i: limits[i % keys](f"{tag}-{i}")


def fixed_window_call(client: redis.Redis, names: list[str], per_s: float = 1.0) -> Call:
    per_ms = int(per_s * 1000)
    keys = len(names)

    def call(i: int) -> object:
        window = int(time.time() / per_s)
        key = f"{names[i % keys]}:fixed:{window}"
        pipe = client.pipeline(transaction=False)
        pipe.incr(key)
        pipe.pexpire(key, per_ms)
        return pipe.execute()[0]

    return call


def make(limiter: str, client: redis.Redis, prefix: str, rate: str, keys: int) -> Call:
    names = [f"{prefix}-{limiter}-{i}" for i in range(keys)]
    if limiter == "fixed":
        return fixed_window_call(client, names)
    if limiter == "window":
        return window_call(client, names, rate)
    return reserve_call(client, names, rate, cost=limiter == "cost")


# -- measuring ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    calls_per_s: float
    redis_cpu_us: float  # per call: redis-server's user + sys (INFO cpu)
    inside_us: float  # per call: Redis's time inside the commands sent (INFO commandstats)
    commands: float  # per call: the commands Redis ran, a script's own included
    client_cpu_us: float  # per call, in the calling process(es)


def warm(call: Call) -> None:
    for i in range(50):
        call(-1 - i)


def timed(call: Call, seconds: float) -> tuple[int, float, float]:
    """(calls, wall s, client CPU s) of calling for ``seconds``."""
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    deadline = start + seconds
    while True:
        for _ in range(100):
            call(n)
            n += 1
        now = time.perf_counter()
        if now >= deadline:
            return n, now - start, time.process_time() - cpu


def _stats(client: redis.Redis, limiter: str) -> tuple[int, int]:
    """(commands, usec inside the commands sent) since the last reset, but INFO and CONFIG."""
    stats = {
        k: v
        for k, v in client.info("commandstats").items()
        if not k.startswith(("cmdstat_info", "cmdstat_config"))
    }
    calls = sum(int(v["calls"]) for v in stats.values())
    return calls, sum(int(stats[k]["usec"]) for k in SENT[limiter] if k in stats)


def _round(
    client: redis.Redis, limiter: str, n: int, wall: float, cpu_client: float, cpu_redis: float
) -> Round:
    commands, usec = _stats(client, limiter)
    return Round(n / wall, cpu_redis / n * 1e6, usec / n, commands / n, cpu_client / n * 1e6)


def one(client: redis.Redis, call: Call, limiter: str, seconds: float) -> Round:
    warm(call)
    client.config_resetstat()
    before = redis_cpu_s(client)
    n, wall, cpu = timed(call, seconds)
    return _round(client, limiter, n, wall, cpu, redis_cpu_s(client) - before)


def _process(
    url: str, prefix: str, limiter: str, rate: str, seconds: float, ready: Any, go: Any, out: Any
) -> None:
    client = redis.Redis.from_url(url)
    call = make(limiter, client, prefix, rate, 1)
    warm(call)
    ready.put(True)
    go.wait(60)
    out.put(timed(call, seconds))
    client.close()


def parallel(
    url: str, client: redis.Redis, prefix: str, limiter: str, rate: str, seconds: float
) -> Round:
    """``PROCESSES`` processes on one key at once: their total."""
    ctx = mp.get_context("fork")
    ready, go, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_process, args=(url, prefix, limiter, rate, seconds, ready, go, out))
        for _ in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    client.config_resetstat()
    before = redis_cpu_s(client)
    go.set()
    got = [out.get(timeout=seconds + 60) for _ in procs]
    cpu_redis = redis_cpu_s(client) - before
    for p in procs:
        p.join(30)
    n = sum(g[0] for g in got)
    wall = max(g[1] for g in got)
    return _round(client, limiter, n, wall, sum(g[2] for g in got), cpu_redis)


@dataclass(frozen=True)
class Case:
    title: str
    rate: str
    keys: int
    processes: int


CASES = (
    Case(f"one key, never full ({NEVER_FULL})", NEVER_FULL, 1, 1),
    Case(f"one key, always full ({FULL}: a growing backlog)", FULL, 1, 1),
    Case(f"{KEYS:,} keys, never full ({NEVER_FULL})", NEVER_FULL, KEYS, 1),
    Case(f"{KEYS:,} keys, always full ({FULL})", FULL, KEYS, 1),
    Case(f"{PROCESSES} processes, one key, never full ({NEVER_FULL})", NEVER_FULL, 1, PROCESSES),
    Case(f"{PROCESSES} processes, one key, always full ({FULL})", FULL, 1, PROCESSES),
)


def run_case(url: str, client: redis.Redis, run: str, case: Case, seconds: float) -> dict[str, Any]:
    rounds: dict[str, list[Round]] = {limiter: [] for limiter in LIMITERS}
    order = list(LIMITERS)
    for r in range(ROUNDS):
        for limiter in order[r % len(order) :] + order[: r % len(order)]:
            prefix = f"ratebench-{run}-c{CASES.index(case)}r{r}"
            if case.processes > 1:
                got = parallel(url, client, prefix, limiter, case.rate, seconds)
            else:
                call = make(limiter, client, prefix, case.rate, case.keys)
                got = one(client, call, limiter, seconds)
            rounds[limiter].append(got)
    summary = {
        limiter: {
            "calls_per_s": max(r.calls_per_s for r in got),
            "redis_cpu_us": statistics.median(r.redis_cpu_us for r in got),
            "redis_cpu_us_range": [
                min(r.redis_cpu_us for r in got),
                max(r.redis_cpu_us for r in got),
            ],
            "inside_us": statistics.median(r.inside_us for r in got),
            "commands": statistics.median(r.commands for r in got),
            "client_cpu_us": statistics.median(r.client_cpu_us for r in got),
            "rounds": [asdict(r) for r in got],
        }
        for limiter, got in rounds.items()
    }
    _print_case(case, summary)
    return summary


def _ratio(value: float, base: float) -> str:
    return f"x{value / base:.2f}" if base else "-"


def _print_case(case: Case, s: dict[str, dict[str, Any]]) -> None:
    section(case.title)
    head = ("limiter", "calls/s", "Redis CPU", "inside", "cmds", "client", "/window", "/fixed")
    print(f"  {head[0]:<30}{head[1]:>9}{head[2]:>10}{head[3]:>8}{head[4]:>6}{head[5]:>8}", end="")
    print(f"{head[6] + ': calls/s':>18}{'CPU':>7}{head[7] + ': calls/s':>18}{'CPU':>7}")
    print(f"  {'':<30}{'':>9}{'us/call':>10}{'us':>8}{'':>6}{'us':>8}")
    old, floor = s["window"], s["fixed"]
    for limiter, label in LIMITERS.items():
        r = s[limiter]
        line = f"  {label:<30}{r['calls_per_s']:>9,.0f}{r['redis_cpu_us']:>10.1f}"
        line += f"{r['inside_us']:>8.1f}{r['commands']:>6.1f}{r['client_cpu_us']:>8.1f}"
        for base in (old, floor):
            line += f"{_ratio(r['calls_per_s'], base['calls_per_s']):>18}"
            line += f"{_ratio(r['redis_cpu_us'], base['redis_cpu_us']):>7}"
        print(line)


# -- memory ---------------------------------------------------------------------------------------


def _usage(client: redis.Redis, keys: list[str]) -> int:
    return sum(int(client.memory_usage(k, samples=0) or 0) for k in keys)


def memory(client: redis.Redis, run: str, requests: int) -> dict[str, dict[str, float]]:
    """What one name at 100/s holds after ``requests`` reservations."""
    found: dict[str, dict[str, float]] = {}
    ids = [f"{uuid.uuid4()}.0" for _ in range(requests)]  # Celery's: <task id>.<retries>
    for limiter in ("window", "reserve"):
        name = f"ratemem-{run}-{limiter}-{requests}"
        if limiter == "reserve":
            reserve: Callable[[str], object] = RateLimit(client, name, "100/s").reserve
        else:
            reserve = window_reserve(client, name, "100/s")
        reserve("warm-up")  # the script loaded: not part of the name's memory
        client.delete(*[k for k in client.scan_iter(match=f"*{{{name}}}*")])
        used = int(client.info("memory")["used_memory"])
        for request in ids:
            reserve(request)
        grown = int(client.info("memory")["used_memory"]) - used
        keys = [k.decode() for k in client.scan_iter(match=f"*{{{name}}}*", count=1000)]
        found[limiter] = {
            "keys": len(keys),
            "memory_usage": _usage(client, keys),
            "used_memory": grown,
        }
    return found


def _print_memory(mem: dict[int, dict[str, dict[str, float]]]) -> None:
    section("Memory: one name at 100/s")
    print(f"  {'reservations':>12}  {'limiter':<26}{'keys':>6}{'MEMORY USAGE':>14}", end="")
    print(f"{'per request':>13}{'used_memory':>13}")
    for n, got in mem.items():
        for limiter, m in got.items():
            line = f"  {n:>12,}  {LIMITERS[limiter]:<26}{m['keys']:>6,.0f}"
            line += f"{m['memory_usage']:>12,.0f} B{m['memory_usage'] / n:>11,.0f} B"
            print(line + f"{m['used_memory']:>11,.0f} B")
        ratio = got["reserve"]["memory_usage"] / got["window"]["memory_usage"]
        print(f"  {'':>12}  bucket / window: x{ratio:.2f}")
    print(
        "  MEMORY USAGE (SAMPLES 0) summed over the name's keys; used_memory: its growth over the "
        "reservations (the key table and expiry table too)"
    )


def main() -> None:
    parser = base_parser(__doc__ or "", "0.5 s per limiter and case instead of 1.5 s")
    args = parser.parse_args()
    seconds = 0.5 if args.quick else 1.5
    run = uuid.uuid4().hex[:10]
    results: dict[str, Any] = {"cases": {}, "memory": {}, "load_average_start": os.getloadavg()[0]}
    began = time.perf_counter()
    with redis_target(args.url or os.environ.get("REDIS_URL")) as (url, origin):
        client = redis.Redis.from_url(url)
        print(
            f"Redis {client.info('server')['redis_version']} at {url} ({origin}); "
            f"{os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.2f}; redis-py "
            f"{redis.__version__} ({default_parser()} parser)"
            + ("; --quick" if args.quick else ""),
            flush=True,
        )
        print(
            "calls/s: best of 3 rounds; Redis CPU, inside (the commands sent, INFO commandstats), "
            "cmds (commands Redis ran) and client CPU: per call, median of the rounds",
            flush=True,
        )
        try:
            for case in CASES:
                results["cases"][case.title] = run_case(url, client, run, case, seconds)
            mem = {n: memory(client, run, n) for n in (1, 1000)}
            results["memory"] = mem
            _print_memory(mem)
        finally:
            if args.url or os.environ.get("REDIS_URL"):
                delete_keys(client, run)
            client.close()
    results["load_average_end"] = os.getloadavg()[0]
    took = time.perf_counter() - began
    print(f"\nload average {os.getloadavg()[0]:.2f}; total runtime {took:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
