"""Topology benchmark: the lock core on one Redis server, through Sentinel (without and with
``min_replicas=1``), on a Redis Cluster, and as a RedLock over 3 and 5 independent masters beside
pottery's ``Redlock`` on the same masters, in one run on local processes.

What is measured, for each topology:

1. Uncontended acquire+release pairs per second: one thread, one lock name, looped for
   ``--seconds`` after a warm-up; the topologies take turns over 3 rounds and the best round
   is kept.
2. Handoff latency: this thread holds the lock while a waiter thread (of the same process) is
   blocked in ``acquire``; ``time.monotonic_ns()`` is stamped just before the release and just
   after the waiter's acquire returns. Median and 95th percentile over ``--handoffs`` handoffs.
   Both ends share the interpreter, so the figure includes a thread switch. A RedLock waiter
   (ours and pottery's) is woken by nothing: it tries again after a random pause (ours: up to
   0.2 s, growing from 10 ms; pottery: uniform in 0..0.2 s), so its handoff is that pause.

The servers are started here (the starters of ``tests/topologies.py``): a single
``redis-server``; a master, a replica and three sentinels; a cluster of 3 masters with a replica
each; 5 plain servers for RedLock (its 3-master rows use the first 3). Every one is stopped at
the end.

Run from the repository root::

    python benchmarks/topologies.py [--json out.json] [--quick]

A full run takes about two minutes on 2 cores, ``--quick`` about 45 s (most of it starting the
servers and the RedLock handoffs).
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
from typing import Any

import redis

# The tests' starters of local topologies.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from pottery import Redlock
from topologies import ClusterGroup, SentinelGroup

from celery_redislock import Lock
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.clients import sentinel_client
from celery_redislock.core.lease import RedisClient
from celery_redislock.core.redlock import RedLock
from celery_redislock.core.redlock_masters import master_clients

Release = Callable[[], object]
Take = Callable[[float | None], Release]
"""Takes the lock (waiting up to the timeout given; ``None``: try once), returns its release."""
Target = tuple[str, Callable[[str], Take], Callable[[str], Callable[[], bool]] | None]
"""A label, a maker of a ``Take`` for a lock name, and a maker of "a waiter stands in line"
(``None``: the kind of lock has no line to look at)."""


def ours(make: Callable[[str], Lock]) -> Callable[[str], Take]:
    def for_name(name: str) -> Take:
        lock = make(name)

        def take(timeout: float | None) -> Release:
            return lock.acquire(blocking=timeout is not None, timeout=timeout).release

        return take

    return for_name


def pottery(masters: Sequence[redis.Redis]) -> Callable[[str], Take]:
    def for_name(name: str) -> Take:
        lock = Redlock(key=name, masters=set(masters), auto_release_time=10)

        def take(timeout: float | None) -> Release:
            how: dict[str, Any] = {"blocking": False} if timeout is None else {"timeout": timeout}
            if not lock.acquire(**how):
                raise RuntimeError(f"pottery Redlock {name!r} not acquired")
            return lock.release

        return take

    return for_name


def pairs_per_second(take: Take, seconds: float) -> float:
    for _ in range(50):  # warm-up: connections, scripts loaded
        take(None)()
    count, began = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - began) < seconds:
        take(None)()
        count += 1
    return count / elapsed


def handoff_ms(
    make: Callable[[str], Take], queued: Callable[[], bool] | None, name: str, handoffs: int
) -> list[float]:
    holder, waiting = make(name), make(name)
    out: list[float] = []
    for _ in range(handoffs):
        release = holder(None)
        got: list[int] = []
        waiter = threading.Thread(target=lambda got=got: got.append(_acquired_at(waiting)))
        waiter.start()
        deadline = time.monotonic() + 10
        while queued is not None and not queued() and time.monotonic() < deadline:
            time.sleep(0.001)  # until the waiter stands in line (then it blocks on its pop)
        time.sleep(0.005 if queued is not None else 0.05)  # (a RedLock waiter: its first try)
        released = time.monotonic_ns()
        release()
        waiter.join(10)
        out.append((got[0] - released) / 1e6)
    return out


def _acquired_at(take: Take) -> int:
    release = take(10)
    stamp = time.monotonic_ns()
    release()
    return stamp


def _single(client: RedisClient, min_replicas: int = 0) -> tuple[Callable[[str], Take], Any]:
    def make(name: str) -> Lock:
        return Lock(client, name, ttl=10, min_replicas=min_replicas)

    def queued(name: str) -> Callable[[], bool]:
        key = make(name).keys.all[2]
        return lambda: bool(client.zcard(key))

    return ours(make), queued


@contextmanager
def topologies(stack: ExitStack) -> Iterator[tuple[str, list[Target]]]:
    single = stack.enter_context(RedisServer())
    sentinel = stack.enter_context(SentinelGroup())
    cluster = stack.enter_context(ClusterGroup())
    masters = [stack.enter_context(RedisServer()) for _ in range(5)]
    plain = redis.Redis.from_url(single.url)
    through_sentinel = sentinel_client(sentinel.addresses, sentinel.service)
    cluster_client = cluster.client()
    targets: list[Target] = []
    for label, client, replicas in [
        ("single server", plain, 0),
        ("Sentinel", through_sentinel, 0),
        ("Sentinel, min_replicas=1", through_sentinel, 1),
        ("Cluster (3 masters)", cluster_client, 0),
        ("Cluster, min_replicas=1", cluster_client, 1),
    ]:
        take, queued = _single(client, replicas)
        targets.append((label, take, queued))
    for count in (3, 5):
        clients = master_clients([m.url for m in masters[:count]])
        plain_clients = [redis.Redis.from_url(m.url) for m in masters[:count]]

        def redlock(name: str, clients: tuple[redis.Redis, ...] = clients) -> Lock:
            return RedLock(clients, name, ttl=10)

        targets.append((f"RedLock, {count} masters", ours(redlock), None))
        targets.append((f"pottery Redlock, {count} masters", pottery(plain_clients), None))
    yield str(plain.info("server")["redis_version"]), targets


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="shorter loops (about 45 s)")
    args = parser.parse_args(argv)
    seconds = 0.5 if args.quick else 2.0
    handoffs = 30 if args.quick else 100
    began = time.perf_counter()
    results: dict[str, dict[str, float]] = {}
    with ExitStack() as stack, topologies(stack) as (version, targets):
        print(f"topologies: Redis {version}; {seconds}s loops, {handoffs} handoffs", flush=True)
        best: dict[str, float] = {}
        for round_ in range(3):
            order = targets[round_:] + targets[:round_]
            for label, make, _ in order:
                rate = pairs_per_second(make(f"bench:{label}"), seconds)
                best[label] = max(best.get(label, 0.0), rate)
        print(f"\n{'topology':<34} {'pairs/s':>10} {'handoff p50':>12} {'p95':>9}")
        for label, make, queued in targets:
            name = f"handoff:{label}"
            waited = None if queued is None else queued(name)
            latencies = sorted(handoff_ms(make, waited, name, handoffs))
            p50 = statistics.median(latencies)
            p95 = latencies[int(0.95 * (len(latencies) - 1))]
            results[label] = {
                "pairs_per_second": round(best[label]),
                "handoff_ms_p50": round(p50, 3),
                "handoff_ms_p95": round(p95, 3),
            }
            print(f"{label:<34} {best[label]:>10,.0f} {p50:>10.2f}ms {p95:>7.2f}ms", flush=True)
    print(f"\ntotal runtime {time.perf_counter() - began:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"redis_version": version, "results": results}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
