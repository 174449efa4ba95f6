"""Topology benchmark: the lock core on one Redis server, through Sentinel (without and with
``min_replicas=1``) and on a Redis Cluster, in one run on local processes.

What is measured, for each topology:

1. Uncontended acquire+release pairs per second: one thread, one lock name, looped for
   ``--seconds`` after a warm-up; the topologies take turns over 3 rounds and the best round
   is kept.
2. Handoff latency: this thread holds the lock while a waiter thread (of the same process) is
   blocked in ``acquire``; ``time.monotonic_ns()`` is stamped just before the release and just
   after the waiter's acquire returns. Median and 95th percentile over ``--handoffs`` handoffs.
   Both ends share the interpreter, so the figure includes a thread switch.

The servers are started here (the starters of ``tests/topologies.py``): a single
``redis-server``; a master, a replica and three sentinels; a cluster of 3 masters with a replica
each. Every one is stopped at the end.

Run from the repository root::

    python benchmarks/topologies.py [--json out.json] [--quick]

A full run takes about a minute on 2 cores, ``--quick`` about 30 s (most of it starting the
servers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import redis

# The tests' starters of local topologies.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from topologies import ClusterGroup, SentinelGroup

from celery_redislock import Lock
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.clients import sentinel_client
from celery_redislock.core.lease import RedisClient

Target = tuple[str, Callable[[], RedisClient], int]
"""A label, a client maker, and min_replicas."""


def pairs_per_second(client: RedisClient, label: str, seconds: float, min_replicas: int) -> float:
    lock = Lock(client, f"bench:{label}", ttl=10, min_replicas=min_replicas)
    for _ in range(50):  # warm-up: connections, scripts loaded
        lock.acquire().release()
    count, began = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - began) < seconds:
        lock.acquire().release()
        count += 1
    return count / elapsed


def handoff_ms(client: RedisClient, label: str, handoffs: int, min_replicas: int) -> list[float]:
    lock = Lock(client, f"handoff:{label}", ttl=10, min_replicas=min_replicas)
    queue = lock.keys.all[2]
    out: list[float] = []
    for _ in range(handoffs):
        lease = lock.acquire()
        got: list[int] = []
        waiter = threading.Thread(target=lambda got=got: got.append(_acquired_at(lock)))
        waiter.start()
        deadline = time.monotonic() + 10
        while not client.zcard(queue) and time.monotonic() < deadline:
            time.sleep(0.001)  # until the waiter stands in line (then it blocks on its pop)
        time.sleep(0.005)
        released = time.monotonic_ns()
        lease.release()
        waiter.join(10)
        out.append((got[0] - released) / 1e6)
    return out


def _acquired_at(lock: Lock) -> int:
    lease = lock.acquire(timeout=10)
    stamp = time.monotonic_ns()
    lease.release()
    return stamp


@contextmanager
def topologies(stack: ExitStack) -> Iterator[list[Target]]:
    single = stack.enter_context(RedisServer())
    sentinel = stack.enter_context(SentinelGroup())
    cluster = stack.enter_context(ClusterGroup())
    plain = redis.Redis.from_url(single.url)
    through_sentinel = sentinel_client(sentinel.addresses, sentinel.service)
    cluster_client = cluster.client()
    yield [
        ("single server", lambda: plain, 0),
        ("Sentinel", lambda: through_sentinel, 0),
        ("Sentinel, min_replicas=1", lambda: through_sentinel, 1),
        ("Cluster (3 masters)", lambda: cluster_client, 0),
        ("Cluster, min_replicas=1", lambda: cluster_client, 1),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="shorter loops (about 30 s)")
    args = parser.parse_args(argv)
    seconds = 0.5 if args.quick else 2.0
    handoffs = 30 if args.quick else 100
    began = time.perf_counter()
    results: dict[str, dict[str, float]] = {}
    with ExitStack() as stack, topologies(stack) as targets:
        version = targets[0][1]().info("server")["redis_version"]
        print(f"topologies: Redis {version}; {seconds}s loops, {handoffs} handoffs", flush=True)
        best: dict[str, float] = {}
        for round_ in range(3):
            order = targets[round_:] + targets[:round_]
            for label, make, replicas in order:
                rate = pairs_per_second(make(), label, seconds, replicas)
                best[label] = max(best.get(label, 0.0), rate)
        print(f"\n{'topology':<28} {'pairs/s':>10} {'handoff p50':>12} {'p95':>8}")
        for label, make, replicas in targets:
            latencies = sorted(handoff_ms(make(), label, handoffs, replicas))
            p50 = statistics.median(latencies)
            p95 = latencies[int(0.95 * (len(latencies) - 1))]
            results[label] = {
                "pairs_per_second": round(best[label]),
                "handoff_ms_p50": round(p50, 3),
                "handoff_ms_p95": round(p95, 3),
            }
            print(f"{label:<28} {best[label]:>10,.0f} {p50:>10.2f}ms {p95:>6.2f}ms", flush=True)
    print(f"\ntotal runtime {time.perf_counter() - began:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"redis_version": version, "results": results}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
