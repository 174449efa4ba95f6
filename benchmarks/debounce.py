"""Debounce benchmark: bursts of calls on a few keys, and what runs.

One run on one Redis (broker and locks; a throwaway ``redis-server`` unless ``--url`` or
``REDIS_URL`` names one), one real Celery worker (``-P solo``, started here; this module is its
app). Three ways to call ``task(run, k, seq)`` side by side, each in the same bursts:

* ``plain``: ``delay`` with no uniqueness: every call runs;
* ``replace``: ``unique={"lifecycle": "until_started", "on_duplicate": "replace"}`` called with
  ``countdown=PERIOD``: each call revokes the queued copy and publishes itself; the last copy of a
  burst runs PERIOD after it (what users did before debounce);
* ``debounce``: ``unique={"lifecycle": "debounce", "period": PERIOD}``: each call is kept in
  Redis as the key's pending call (latest wins), published by the worker's sweeper once the key
  is quiet.

The workload: BURSTS bursts; in each, CALLS calls per key on KEYS keys, interleaved, as fast as
this process sends them; 3 x PERIOD of quiet between bursts. Shown per way: calls, runs, runs
per key per burst; ``unrun``: bursts whose last call on a key never ran (folded into a later
call instead); ``stale``: over the keys, how many calls on a key came after the one its last
run carried (0: every key's last run had its latest arguments); the producer's time per call,
and over plain; Redis CPU per call.

Run from the repository root::

    python benchmarks/debounce.py [--bursts B] [--calls C] [--keys K] [--quick] [--json PATH]

(``DEBOUNCE_BENCH_PERIOD`` sets PERIOD, 0.5 s by default.)

A full run (10 bursts x 10 calls x 10 keys = 1,000 calls per way, PERIOD 0.5 s) takes about
1 minute on 2 cores; ``--quick`` (3 bursts) about 25 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis
from celery import Celery

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import base_parser, delete_keys, redis_cpu_s, redis_target, section  # noqa: E402

from celery_redislock import install  # noqa: E402

URL = os.environ.get("DEBOUNCE_BENCH_URL", "redis://127.0.0.1:6379/0")
PERIOD = float(os.environ.get("DEBOUNCE_BENCH_PERIOD", "0.5"))
QUEUE = "debounce-bench"
WAYS = ("plain", "replace", "debounce")


def make_app(url: str) -> tuple[Celery, dict[str, Any]]:
    """The benchmark's app on ``url`` and its three tasks (the worker's, and the producer's)."""
    app = install(Celery("debounce_bench", broker=url, set_as_current=False))
    app.conf.update(
        redislock_url=url,
        redislock_line_sweep_interval=0.1,
        task_ignore_result=True,
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
    )
    marks = redis.Redis.from_url(url)

    def ran(way: str, run: str, k: int, seq: int) -> None:
        marks.rpush(f"bench:{run}:ran:{way}:{k}", seq)

    @app.task(name="bench.plain", shared=False)
    def plain(run: str, k: int, seq: int) -> None:
        ran("plain", run, k, seq)

    @app.task(
        name="bench.replace",
        shared=False,
        unique={
            "lifecycle": "until_started",
            "key": "bench:{run}:r:{k}",
            "on_duplicate": "replace",
        },
    )
    def replace(run: str, k: int, seq: int) -> None:
        ran("replace", run, k, seq)

    @app.task(
        name="bench.debounce",
        shared=False,
        unique={"lifecycle": "debounce", "key": "bench:{run}:d:{k}", "period": PERIOD},
    )
    def debounce(run: str, k: int, seq: int) -> None:
        ran("debounce", run, k, seq)

    return app, {"plain": plain, "replace": replace, "debounce": debounce}


app, _ = make_app(URL)  # the worker's (celery -A debounce): URL from its environment
TASKS: dict[str, Any] = {}  # the producer's, made in main()


def _call(way: str, run: str, k: int, seq: int) -> None:
    if way == "replace":
        TASKS[way].apply_async((run, k, seq), countdown=PERIOD)
    else:
        TASKS[way].delay(run, k, seq)


def measure(url: str, way: str, run: str, bursts: int, calls: int, keys: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    last: dict[tuple[int, int], int] = {}  # (burst, key) -> the burst's last seq on the key
    spent = 0.0
    sent = 0
    cpu0 = redis_cpu_s(client)
    for burst in range(bursts):
        for _ in range(calls):
            for k in range(keys):
                sent += 1
                began = time.perf_counter()
                _call(way, run, k, sent)
                spent += time.perf_counter() - began
                last[(burst, k)] = sent
        time.sleep(3 * PERIOD)
    redis_cpu = redis_cpu_s(client) - cpu0
    # Settled: no new run for 2 x PERIOD + 1 s.
    seen, quiet_since = -1, time.monotonic()
    while time.monotonic() - quiet_since < 2 * PERIOD + 1:
        now = sum(int(client.llen(f"bench:{run}:ran:{way}:{k}")) for k in range(keys))
        if now != seen:
            seen, quiet_since = now, time.monotonic()
        time.sleep(0.1)
    ran = {
        k: [int(s) for s in client.lrange(f"bench:{run}:ran:{way}:{k}", 0, -1)] for k in range(keys)
    }
    unrun = sum(1 for (_, k), s in last.items() if s not in ran[k])
    # How stale each key's last run is: calls made on the key after the call it carried.
    last_call = {k: max(s for (_, kk), s in last.items() if kk == k) for k in range(keys)}
    stale = max((last_call[k] - max(ran[k], default=0)) // keys for k in range(keys))
    client.close()
    return {
        "calls": sent,
        "runs": seen,
        "runs_per_key_burst": seen / (bursts * keys),
        "bursts_unrun": unrun,
        "stale_calls": stale,
        "us_per_call": spent / sent * 1e6,
        "redis_us_per_call": redis_cpu / sent * 1e6,
    }


def main() -> None:
    parser = base_parser(__doc__ or "", "3 bursts")
    parser.add_argument("--bursts", type=int, default=10)
    parser.add_argument("--calls", type=int, default=10, help="calls per key in a burst")
    parser.add_argument("--keys", type=int, default=10)
    args = parser.parse_args()
    bursts = 3 if args.quick else args.bursts
    with redis_target(args.url or os.environ.get("REDIS_URL")) as (url, origin):
        env = {**os.environ, "DEBOUNCE_BENCH_URL": url, "DEBOUNCE_BENCH_PERIOD": str(PERIOD)}
        run = os.urandom(4).hex()
        print(f"Redis: {url} ({origin}); period {PERIOD:g} s; run {run}")
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "debounce",
                "worker",
                "-P",
                "solo",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                "-Q",
                QUEUE,
                "-l",
                "ERROR",
            ],
            cwd=HERE,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            return _run(args, bursts, run, url)
        finally:
            worker.terminate()
            worker.wait(10)
            delete_keys(redis.Redis.from_url(url), run)


def _run(args: Any, bursts: int, run: str, url: str) -> None:
    _, tasks = make_app(url)
    TASKS.update(tasks)
    marks = redis.Redis.from_url(url)
    for task in TASKS.values():
        task.delay(run, 0, 0)  # warm-up: the worker is up once these ran
    deadline = time.monotonic() + 60
    while sum(int(marks.llen(f"bench:{run}:ran:{w}:0")) for w in WAYS) < 3:
        if time.monotonic() > deadline:
            raise SystemExit("the worker did not start")
        time.sleep(0.1)
    marks.delete(*(f"bench:{run}:ran:{w}:0" for w in WAYS))
    time.sleep(2 * PERIOD + 1)
    results = {w: measure(url, w, run, bursts, args.calls, args.keys) for w in WAYS}
    section(f"{bursts} bursts x {args.calls} calls x {args.keys} keys, period {PERIOD:g} s")
    base = results["plain"]["us_per_call"]
    print(
        f"{'way':<10}{'calls':>7}{'runs':>7}{'runs/key/burst':>16}{'unrun':>7}{'stale':>7}"
        f"{'us/call':>10}{'+us vs plain':>14}{'Redis us/call':>15}"
    )
    for way, r in results.items():
        print(
            f"{way:<10}{r['calls']:>7}{r['runs']:>7}{r['runs_per_key_burst']:>16.2f}"
            f"{r['bursts_unrun']:>7}{r['stale_calls']:>7}{r['us_per_call']:>10.0f}"
            f"{r['us_per_call'] - base:>14.0f}{r['redis_us_per_call']:>15.0f}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
