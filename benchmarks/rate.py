"""Rate-limit benchmark: ``RateLimit.reserve`` against a plain INCR+EXPIRE fixed-window limiter.

Everything runs in one run on one Redis: a throwaway ``redis-server`` started here, unless
``--url`` (or ``REDIS_URL``) names one. What is measured, in calls per second:

1. One process, one key: ``reserve`` with a fresh request id per call, on a limit that is never
   reached (``100000/s``: every slot is now) and on one that is (``10/s``: the backlog grows,
   every slot is in the future); the fixed window is ``INCR`` and ``PEXPIRE`` in one pipelined
   round trip (a window key per period), the usual cheapest limiter, which neither remembers
   requests nor hands out slots.
2. One process, many keys: the same, the calls going round 1,000 names.
3. Four processes on one key, all at once: the total (the server's share shows here).

Each case runs ~1.5 s (``--quick``: 0.5 s) after a warm-up, over 3 rounds in rotating order;
the best round is kept. The ratio is ``reserve`` / fixed window, in the same run.

Run from the repository root::

    python benchmarks/rate.py [--json out.json] [--quick] [--url redis://...]

Against ``--url`` the keys it created (each contains the run id) are deleted at the end.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
import uuid
from collections.abc import Callable
from multiprocessing.queues import Queue
from typing import Any

import redis

from celery_redislock.core.rate import RateLimit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import base_parser, delete_keys, redis_target, section

KEYS = 1000
PROCESSES = 4
ROUNDS = 3

Call = Callable[[int], object]


def reserve_call(client: redis.Redis, run: str, rate: str, keys: int) -> Call:
    limits = [RateLimit(client, f"ratebench-{run}-{i}", rate) for i in range(keys)]
    tag = uuid.uuid4().hex[:8]  # request ids differ between processes
    return lambda i: limits[i % keys].reserve(f"{tag}-{i}")


def fixed_window_call(client: redis.Redis, run: str, keys: int, per_s: float = 1.0) -> Call:
    names = [f"ratebench-{run}-fixed-{i}" for i in range(keys)]
    per_ms = int(per_s * 1000)

    def call(i: int) -> object:
        window = int(time.time() / per_s)
        key = f"{names[i % keys]}:{window}"
        pipe = client.pipeline(transaction=False)
        pipe.incr(key)
        pipe.pexpire(key, per_ms)
        return pipe.execute()[0]

    return call


def loop(call: Call, seconds: float) -> float:
    """Calls per second over ``seconds``, after a short warm-up."""
    for i in range(50):
        call(-1 - i)
    n, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(100):
            call(n)
            n += 1
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - start)


def make(kind: str, client: redis.Redis, run: str) -> Call:
    name, keys = kind.rsplit("@", 1)
    count = int(keys)
    if name == "fixed":
        return fixed_window_call(client, run, count)
    return reserve_call(client, f"{run}-{name.replace('/', '_')}", name, count)


def _process(url: str, run: str, kind: str, seconds: float, go: Any, out: Queue[float]) -> None:
    client = redis.Redis.from_url(url)
    call = make(kind, client, run)
    go.wait(30)
    out.put(loop(call, seconds))
    client.close()


def parallel(url: str, run: str, kind: str, seconds: float) -> float:
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_process, args=(url, run, kind, seconds, go, out))
        for _ in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    go.set()
    total = sum(out.get(timeout=seconds + 60) for _ in procs)
    for p in procs:
        p.join(30)
    return total


def main() -> None:
    parser = base_parser(__doc__ or "", "0.5 s per case instead of 1.5 s")
    args = parser.parse_args()
    seconds = 0.5 if args.quick else 1.5
    run = uuid.uuid4().hex[:10]
    cases = {
        "one key": ["100000/s@1", "10/s@1", "fixed@1"],
        f"{KEYS} keys": [f"100000/s@{KEYS}", f"10/s@{KEYS}", f"fixed@{KEYS}"],
        f"{PROCESSES} processes, one key": ["100000/s@1", "fixed@1"],
    }
    results: dict[str, dict[str, float]] = {}
    began = time.perf_counter()
    with redis_target(args.url or os.environ.get("REDIS_URL")) as (url, origin):
        client = redis.Redis.from_url(url)
        print(
            f"Redis {client.info('server')['redis_version']} at {url} ({origin}); "
            f"{os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        for title, kinds in cases.items():
            best: dict[str, float] = dict.fromkeys(kinds, 0.0)
            for r in range(ROUNDS):
                for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                    if title.startswith(f"{PROCESSES} processes"):
                        rate = parallel(url, f"{run}-p{r}", kind, seconds)
                    else:
                        rate = loop(make(kind, client, f"{run}-{r}"), seconds)
                    best[kind] = max(best[kind], rate)
            results[title] = best
            section(title)
            fixed = best[kinds[-1]]
            for kind in kinds:
                name = kind.split("@")[0]
                label = "INCR+PEXPIRE fixed window" if name == "fixed" else f"reserve, rate {name}"
                ratio = best[kind] / fixed if fixed else float("nan")
                print(f"  {label:<32} {best[kind]:>10,.0f} /s   x{ratio:.2f} of the fixed window")
        if args.url:
            delete_keys(client, run)
        client.close()
    print(f"\ntotal runtime {time.perf_counter() - began:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
