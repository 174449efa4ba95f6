"""Commands, KEYS and ARGV per lock operation, counted (they do not move with the machine's
load): ours on the general path (the default layout) and on the lean fast path (a namespace
whose layout is ``lean``, see ``core/layout.py``), beside redis-py's ``Lock``,
python-redis-lock and the fenced floor (``lock_core.py``'s locks), in one run.

* **uncontended pair**: one acquire and release of a free lock, repeated; Redis's own count of
  the commands it ran (``INFO commandstats``: a script's ``redis.call`` s included) per pair,
  and the KEYS and ARGV the client sent per pair (script calls: ``EVALSHA``/``EVAL``; a plain
  command counts its key and its other arguments);
* **steady contention**: ``--processes`` processes (4) each take the lock, hold it ``--hold``
  ms (10), release it and take it again, for ``--seconds`` (5): commands per acquisition;
* **a unique task** (``unique="until_finished"``, keyed as its ``lock=``), publish and run, each
  on a key of its own: the calls a producer and a locked run make in the lock Redis, in their
  order (the claim and its confirmation; the lease, the claim's end, the release), through the
  core's own functions: commands (a script's included), KEYS, round trips (a pipeline is one),
  in each layout.

Run from the repository root::

    python benchmarks/layout_counts.py [--pairs N] [--url redis://...]

It takes about half a minute. Against ``--url`` it resets the server's statistics and deletes
the keys it made (every one contains ``counts-<run id>``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
import uuid
from typing import Any

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import base_parser, delete_keys, redis_target, section
from lock_core import LOCKS, OURS, OURS_LEAN

from celery_redislock import Lock
from celery_redislock.core.claims import ClaimKind, publish_claimed, release_claim
from celery_redislock.core.confirmations import confirmations
from celery_redislock.core.layout import set_layout

VARIANTS = (OURS, OURS_LEAN, "redis_py", "python_redis_lock", "fenced_floor")
CONTENDED = (OURS, OURS_LEAN, "celery_redislock_fair", "python_redis_lock", "waiting_floor")
RUN = uuid.uuid4().hex[:8]


class Sent:
    """What a client sent: KEYS and ARGV, summed over its commands."""

    def __init__(self) -> None:
        self.keys = 0
        self.args = 0


def counting(client: redis.Redis, sent: Sent) -> redis.Redis:
    """``client``, counting what each command it sends carries."""
    execute = client.execute_command

    def counted(*args: Any, **options: Any) -> Any:
        name = str(args[0]).upper()
        if name in ("EVALSHA", "EVAL"):
            sent.keys += int(args[2])
            sent.args += len(args) - 3 - int(args[2])
        elif name not in ("SCRIPT LOAD", "SCRIPT", "GET", "PING"):
            sent.keys += 1
            sent.args += max(0, len(args) - 2)
        return execute(*args, **options)

    client.execute_command = counted  # type: ignore[method-assign]
    return client


def _commands(client: redis.Redis) -> int:
    return sum(
        int(value["calls"])
        for key, value in client.info("commandstats").items()
        if not key.startswith(("cmdstat_info", "cmdstat_config", "cmdstat_get"))
    )


def pair_counts(url: str, variant: str, pairs: int) -> tuple[float, float, float]:
    """Commands, KEYS, ARGV per uncontended pair of ``variant``."""
    sent = Sent()
    client = counting(redis.Redis.from_url(url), sent)
    acquire = LOCKS[variant](client, f"counts-{RUN}:pair:{variant}")
    for _ in range(3):  # scripts loaded, the layout read, the keys' lives set
        acquire()()
    sent.keys = sent.args = 0
    watcher = redis.Redis.from_url(url)
    watcher.config_resetstat()
    for _ in range(pairs):
        acquire()()
    commands = _commands(watcher)
    return commands / pairs, sent.keys / pairs, sent.args / pairs


def unique_counts(url: str, layout: str, tasks: int) -> tuple[float, float, float]:
    """Commands, KEYS and round trips per unique task, published and run (see the module's
    doc), in a namespace of ``layout``."""
    sent, trips = Sent(), [0]
    client = counting(redis.Redis.from_url(url), sent)
    execute = client.execute_command

    def one_trip(*args: Any, **options: Any) -> Any:
        trips[0] += 1
        return execute(*args, **options)

    client.execute_command = one_trip  # type: ignore[method-assign]
    pipeline = client.pipeline

    def counted_pipeline(*args: Any, **options: Any) -> Any:
        pipe = pipeline(*args, **options)
        run = pipe.execute

        def once(*a: Any, **o: Any) -> Any:
            trips[0] += 1
            sent.keys += sum(int(c[0][2]) for c in pipe.command_stack if c[0][0] == "EVALSHA")
            return run(*a, **o)

        pipe.execute = once  # type: ignore[method-assign]
        return pipe

    client.pipeline = counted_pipeline  # type: ignore[method-assign]
    ns = f"counts-{RUN}-{layout}"
    set_layout(client, ns, layout)
    base = Lock(client, "base", ttl=30, namespace=ns)

    def task(n: int) -> None:
        name, task_id = f"u:{n}", uuid.uuid4().hex
        publish_claimed(
            client,
            ns,
            name,
            task_id=task_id,
            lifetime=600,
            kind=ClaimKind.NEW,
            running_counts=True,
            window=30,
            publish=lambda: None,
            what="task",
        )
        confirmations.flush()  # (its own round trip: the worst case)
        lease, ended = base.named(name).acquire_giving_up(
            "g", False, None, owner=task_id, info={"task_id": task_id, "task": "t"}, job=None
        )
        if ended is None:  # (the general path: the claim ends in a call of its own)
            release_claim(client, ns, name, task_id)
        lease.release()

    for n in range(3):  # scripts loaded, the layout read
        task(-n - 1)
    watcher = redis.Redis.from_url(url)
    sent.keys, trips[0] = 0, 0
    watcher.config_resetstat()
    for n in range(tasks):
        task(n)
    commands = sum(
        int(value["calls"])
        for key, value in watcher.info("commandstats").items()
        if not key.startswith(("cmdstat_info", "cmdstat_config"))
    )
    return commands / tasks, sent.keys / tasks, trips[0] / tasks


def _contender(url: str, variant: str, hold_s: float, until: float, out: Any) -> None:
    acquire = LOCKS[variant](redis.Redis.from_url(url), f"counts-{RUN}:contended:{variant}")
    n = 0
    while time.time() < until:
        release = acquire()
        time.sleep(hold_s)
        release()
        n += 1
    out.put(n)


def contended_counts(
    url: str, variant: str, processes: int, hold_ms: int, seconds: float
) -> tuple[float, list[int]]:
    """Commands per acquisition under steady contention, and each process's acquisitions."""
    watcher = redis.Redis.from_url(url)
    LOCKS[variant](watcher, f"counts-{RUN}:contended:{variant}")()()  # (warmed up)
    out: Any = mp.get_context("fork").Queue()
    watcher.config_resetstat()
    until = time.time() + seconds
    procs = [
        mp.get_context("fork").Process(
            target=_contender, args=(url, variant, hold_ms / 1000, until, out)
        )
        for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    counts = [out.get(timeout=seconds + 120) for _ in procs]
    for proc in procs:
        proc.join()
    return _commands(watcher) / max(1, sum(counts)), sorted(counts)


def main() -> int:
    parser = base_parser(__doc__ or "", "fewer pairs and a shorter contention")
    parser.add_argument("--pairs", type=int, default=500)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--hold", type=int, default=10, help="ms each holder holds the lock")
    parser.add_argument("--seconds", type=float, default=5.0)
    options = parser.parse_args()
    pairs, seconds = options.pairs, options.seconds
    if options.quick:
        pairs, seconds = 100, 2.0
    with redis_target(options.url) as (url, where):
        print(f"Redis: {where}")
        section("Uncontended pair: per acquire + release")
        print(f"  {'lock':<26}{'commands':>10}{'KEYS':>8}{'ARGV':>8}")
        for variant in VARIANTS:
            commands, keys, args = pair_counts(url, variant, pairs)
            print(f"  {variant:<26}{commands:>10.1f}{keys:>8.1f}{args:>8.1f}")
        section(
            f"Steady contention: {options.processes} processes, {options.hold} ms holds, "
            f"{seconds:g} s: per acquisition"
        )
        print(f"  {'lock':<26}{'commands':>10}  acquisitions per process")
        for variant in CONTENDED:
            per, counts = contended_counts(url, variant, options.processes, options.hold, seconds)
            print(f"  {variant:<26}{per:>10.1f}  {counts}")
        section("A unique task (until_finished, keyed as its lock): publish and run")
        print(f"  {'layout':<26}{'commands':>10}{'KEYS':>8}{'trips':>8}")
        for layout in ("shared", "lean"):
            commands, keys, trips = unique_counts(url, layout, min(pairs, 200))
            print(f"  {layout:<26}{commands:>10.1f}{keys:>8.1f}{trips:>8.1f}")
        if options.url:
            delete_keys(redis.Redis.from_url(url), f"counts-{RUN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
