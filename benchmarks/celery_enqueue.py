"""Enqueue-time uniqueness benchmark: what a unique task's ``delay()`` costs the producer.

Plain Celery, celery_redislock, celery-singleton and celery-once side by side, in one run on one
Redis (broker, result backend and every lock): a throwaway ``redis-server`` started here, unless
``--url`` (or ``REDIS_URL``) names one. No worker runs: this is the publishing process alone.
The apps are those of ``benchmarks/celery_apps.py`` (the same settings as the Celery overhead
benchmark); the task is ``unique(run, n)``, unique on both arguments until it finishes:

* ours: ``@app.task(unique={"lifecycle": "until_finished", "key": "bench:{run}:{n}"})`` with
  ``celery_redislock.install(app)``: one Lua script claims the key, then the message is published;
  a duplicate is not published and gets the AsyncResult of the copy that holds the key;
* celery-singleton: ``base=Singleton``: SET NX of its key, then publish; a duplicate reads the
  holder's id (GET) and gets its AsyncResult;
* celery-once: ``base=QueueOnce, once={"graceful": True}``: SET NX of its key (redis-py's Lock),
  then publish; a duplicate reads the key's PTTL and gets an EagerResult with no id, state
  REJECTED (without ``graceful``: AlreadyQueued is raised);
* plain: ``delay`` with no uniqueness at all: every call is published;
* floor: plain ``delay`` after one ``PING`` to the same Redis: the least any claim made at enqueue
  (one round trip before the publish) can cost here. Every call is published.
* floor_confirmed: one ``PING`` before the plain ``delay`` and one after it: the least a claim
  confirmed once its message went out (ours) can cost. Every call is published.

What is measured, each call ``task.delay(run, n)`` with its result dropped at once (as a
fire-and-forget caller does: Celery's Redis result backend subscribes to each published task's
result channel and unsubscribes when the AsyncResult goes away, for every variant alike):

1. ``distinct``: N calls, each with a different ``n``: every call is published.
2. ``duplicate``: one call publishes ``n`` (not timed), then N calls with the same ``n``: none is
   published. Plain Celery has no such notion: its distinct figure is the reference.

Each measurement starts with a warm-up (50 distinct calls, not timed) and from an empty queue
with no lock or claim left (the run's keys are deleted, kombu's bindings kept); afterwards it
checks, not timed, that exactly the calls expected were published (queue length) and that every
duplicate got what its library documents. Shown per variant: calls/s, the ratio to plain
``delay`` (distinct), the extra microseconds per call over plain, and CPU per call of this
process (``time.process_time``) and of redis-server (``INFO cpu``: only meaningful on a Redis
nobody else uses). Rounds alternate the variants (order rotated each round); the best round per
variant and scenario is kept.

Run from the repository root::

    python benchmarks/celery_enqueue.py [--calls N] [--rounds R] [--json out.json] [--quick] \\
        [--url redis://...] [--load N]

``--load N`` runs N CPU-burning processes throughout.

A full run (N = 2000, 3 rounds) takes about 30 s on 2 cores, ``--quick`` about 4 s. ``--json``
writes ``calls_per_s``, ``vs_plain``, ``client_cpu_us`` and ``redis_cpu_us`` per scenario and
variant. Against ``--url`` the keys created (each contains the run id) are deleted at the end.

Reading it: a publish costs the same in every variant (kombu's Redis transport builds a new
redis-py client for each, then LPUSH; the result backend's SUBSCRIBE and UNSUBSCRIBE), so the
``+us/call`` column is the cost of uniqueness itself, while the ratio also depends on how costly
a plain publish is on the setup. Compare within one run: the rounds vary with the machine's load.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import celery
import redis
from celery import Celery

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other benchmark modules
from celery_apps import ENQUEUE_VARIANTS as VARIANTS
from celery_apps import Keys, make_app
from common import (
    Load,
    add_load_option,
    base_parser,
    delete_keys,
    print_header,
    redis_cpu_s,
    redis_target,
    section,
)

OURS = "celery_redislock"
# The variants with enqueue uniqueness (the floors' round trips dedupe nothing).
UNIQUE = tuple(v for v in VARIANTS if v not in ("plain", "floor", "floor_confirmed"))
SCENARIOS = ("distinct", "duplicate")
TASK = "celerybench.unique"
WARMUP_CALLS = 50
DUPLICATE_N = -1  # the argument every duplicate call repeats (distinct calls use 0..N-1)
TTL_S = 15.0  # our lease ttl (the default); no task runs here
SINGLETON_EXPIRY_S = 3600.0  # celery-singleton's lock_expiry: as long as celery-once's timeout
# What a duplicate call returns, as documented by each library.
DUPLICATE_RETURNS = {
    OURS: "AsyncResult of the holder",
    "celery_singleton": "AsyncResult of the holder",
    "celery_once": "EagerResult(id None, REJECTED)",
}


@dataclass(frozen=True)
class Measure:
    """One measurement: the rate, and CPU per call (in microseconds) where it was spent."""

    calls_per_s: float
    client_cpu_us: float  # this process (user + sys)
    redis_cpu_us: float  # redis-server (user + sys)


@dataclass
class Bench:
    """The apps (publishing side only) and Redis of one run."""

    url: str
    run: str
    client: redis.Redis
    apps: dict[str, Celery] = field(default_factory=dict)

    def task(self, variant: str) -> celery.Task:
        if variant not in self.apps:
            self.apps[variant] = make_app(
                variant, self.url, self.run, ttl=TTL_S, expiry=SINGLETON_EXPIRY_S
            )
        return self.apps[variant].tasks[TASK]

    @property
    def queue(self) -> str:
        """The Redis list the messages go to: the queue, under the broker's key prefix."""
        prefix = Keys(self.run, "").prefix  # every variant publishes to the same queue
        return f"{prefix}:{prefix}"

    def purge(self) -> None:
        """Deletes the run's keys (queued messages, every lock and claim) but kombu's bindings:
        each app's producer declared the queue once and will not declare it again."""
        keys = [
            k
            for k in self.client.scan_iter(match=f"*{self.run}*", count=1000)
            if b"_kombu.binding" not in k
        ]
        if keys:
            self.client.unlink(*keys)

    def close(self) -> None:
        for app in self.apps.values():
            app.close()
        self.client.close()


def measure(bench: Bench, variant: str, scenario: str, count: int) -> Measure:
    task = bench.task(variant)
    run = bench.run
    for n in range(-WARMUP_CALLS - 1, DUPLICATE_N):  # connections up, scripts loaded
        task.delay(run, n)
    bench.purge()
    first = task.delay(run, DUPLICATE_N).id if scenario == "duplicate" else None
    args = range(count) if scenario == "distinct" else [DUPLICATE_N] * count
    gc.collect()
    redis_before, cpu_before = redis_cpu_s(bench.client), time.process_time()
    start = time.perf_counter()
    ids = [task.delay(run, n).id for n in args]
    elapsed = time.perf_counter() - start
    cpu_after, redis_after = time.process_time(), redis_cpu_s(bench.client)
    # Not timed: exactly the calls expected were published, duplicates got the documented result.
    queued = int(bench.client.llen(bench.queue))
    expected = count if scenario == "distinct" else 1
    if queued != expected:
        raise RuntimeError(f"{variant} {scenario}: {queued} messages queued, {expected} expected")
    if scenario == "duplicate":
        wanted = None if variant == "celery_once" else first
        wrong = sum(i != wanted for i in ids)
        if wrong:
            raise RuntimeError(f"{variant}: {wrong} duplicate(s) did not return {wanted!r}")
    bench.purge()
    return Measure(
        count / elapsed,
        (cpu_after - cpu_before) / count * 1e6,
        (redis_after - redis_before) / count * 1e6,
    )


Results = dict[str, dict[str, list[Measure]]]  # scenario -> variant -> one per round


def run_rounds(bench: Bench, rounds: int, count: int) -> Results:
    """Rounds alternate the variants (order rotated each round)."""
    results: Results = {
        "distinct": {v: [] for v in VARIANTS},
        "duplicate": {v: [] for v in UNIQUE},
    }
    for r in range(rounds):
        shift = r % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            for scenario in SCENARIOS:
                if variant in results[scenario]:
                    results[scenario][variant].append(measure(bench, variant, scenario, count))
    return results


def best(measures: list[Measure]) -> Measure:
    return max(measures, key=lambda m: m.calls_per_s)


# -- reporting -----------------------------------------------------------------------------------


def print_scenario(results: Results, scenario: str, count: int, rounds: int) -> None:
    if scenario == "distinct":
        title = f"1. distinct: {count} calls, each a different argument (all published)"
    else:
        title = f"2. duplicate: {count} calls repeating a queued call's argument (none published)"
    section(f"{title}; best of {rounds} round(s)")
    plain = best(results["distinct"]["plain"])
    print(
        f"  {'variant':<30}{'calls/s':>9}{'vs plain':>10}{'us/call':>9}{'+us/call':>10}"
        f"{'client CPU us':>15}{'redis CPU us':>14}  all rounds (calls/s)"
    )
    rows: list[tuple[str, list[Measure]]] = []
    if scenario == "duplicate":
        rows.append(("plain (distinct: reference)", results["distinct"]["plain"]))
    rows += list(results[scenario].items())
    for label, measures in rows:
        m = best(measures)
        extra = (1 / m.calls_per_s - 1 / plain.calls_per_s) * 1e6
        each = " ".join(f"{x.calls_per_s:.0f}" for x in measures)
        print(
            f"  {label:<30}{m.calls_per_s:>9.0f}{m.calls_per_s / plain.calls_per_s:>9.2f}x"
            f"{1e6 / m.calls_per_s:>9.0f}{extra:>+10.0f}{m.client_cpu_us:>15.0f}"
            f"{m.redis_cpu_us:>14.1f}  {each}"
        )
    if scenario == "duplicate":
        for variant, returns in DUPLICATE_RETURNS.items():
            print(f"  a duplicate, {variant}: returns {returns}")
    else:
        print(
            "  vs plain: calls/s over plain delay's; +us/call: 1/rate - 1/plain rate; CPU: "
            "user+sys per call of this process and of redis-server, in the best round"
        )


def to_json(results: Results, count: int, rounds: int) -> dict[str, Any]:
    plain = best(results["distinct"]["plain"]).calls_per_s
    out: dict[str, Any] = {"calls": count, "rounds": rounds}
    for name in ("calls_per_s", "vs_plain", "client_cpu_us", "redis_cpu_us"):
        out[name] = {}
    for scenario, variants in results.items():
        top = {v: best(ms) for v, ms in variants.items()}
        out["calls_per_s"][scenario] = {v: round(m.calls_per_s, 1) for v, m in top.items()}
        out["vs_plain"][scenario] = {v: round(m.calls_per_s / plain, 3) for v, m in top.items()}
        out["client_cpu_us"][scenario] = {v: round(m.client_cpu_us, 1) for v, m in top.items()}
        out["redis_cpu_us"][scenario] = {v: round(m.redis_cpu_us, 1) for v, m in top.items()}
    return out


# -- command line --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__ or "", "500 calls, one round (a few seconds)")
    parser.add_argument("--calls", type=int, help="calls per measurement (2000, quick 500)")
    parser.add_argument("--rounds", type=int, help="rounds; the best is kept (3, quick 1)")
    add_load_option(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    count = args.calls or (500 if args.quick else 2000)
    rounds = args.rounds or (1 if args.quick else 3)
    began = time.perf_counter()
    run = f"{os.getpid()}-{os.urandom(3).hex()}"
    given = args.url or os.environ.get("REDIS_URL")
    with redis_target(given) as (url, origin):
        bench = Bench(url, run, redis.Redis.from_url(url))
        try:
            print_header(
                "Celery enqueue benchmark",
                url,
                origin,
                bench.client,
                args.quick,
                "no worker: producer cost only"
                + (f"; {args.load} CPU-burning process(es) throughout" if args.load else ""),
            )
            with Load(args.load):
                results = run_rounds(bench, rounds, count)
            for scenario in SCENARIOS:
                print_scenario(results, scenario, count, rounds)
        finally:
            if given:
                delete_keys(bench.client, run)
            bench.close()
    print(f"\ntotal runtime {time.perf_counter() - began:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(to_json(results, count, rounds), indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
