"""Scale: what each option costs one Redis in memory and in CPU, and what one Redis (or a
Cluster) sustains from it.

Everything runs on throwaway ``redis-server`` processes started here (a Redis Cluster of 3
masters for the last part: the starters of ``tests/topologies.py``). What is measured:

1. **Memory** (``MEMORY USAGE`` of every key the items made, summed, and ``used_memory``'s
   growth, which also counts the key table): ``--items`` (10,000) of each, made by the core's
   own calls as a task's locked run makes them:

   * a held lease: ``Lock.acquire`` with the task id as owner and ``{"task_id", "task"}`` as
     info, one lock name per lease;
   * a unique claim: ``publish_claimed`` (claim, then its confirmation), one key per claim;
   * a parked task: ``park`` behind 100 held locks, 100 per line, with the payload Celery
     parks (the task's message, args ``(42,)``) and the one RQ parks (a job reference);
   * a rate key: one ``RateLimit.reserve`` on each of as many keys; and a reservation more on
     one key (what a key at its limit holds per start in its window);
   * what a lock name leaves once released: its fence record (``redislock_fence_keep``).

2. **Redis CPU per task** (``INFO cpu`` of redis-server, user + sys, over the run, divided by
   the tasks), and Redis commands per task (``INFO commandstats``, scripts' own calls
   included), for the Redis calls each option makes per task, in the order the locked run makes
   them, from ``--processes`` (2) processes for ``--seconds`` (5) each, every task on its own
   key:

   * ``lock=``: acquire, release;
   * ``unique=`` (``until_finished``, keyed as its lock): claim and confirm at publish, then
     acquire, give up the queued claim, release;
   * ``lock=`` with ``on_conflict="queue"``, every task through the line: it parks behind the
     holder, the holder's release hands it the lock (the hand-over read and confirmed), it
     claims the lease as it starts;
   * ``rate=``: one reservation (on a rate never full).

   These are the lock Redis's own calls; the broker's and the result backend's are apart (on
   the broker Redis, the same with or without the options).

3. **Projection**: at one core of Redis per master, tasks per second per option
   (10^6 / µs per task), for one Redis and for a Cluster of 3 and 6 masters with keys spread by
   hash tag (every key of a task shares its lock's tag, so a task's calls touch one master), and
   the worker processes that keeps busy at a given task length (tasks/s x seconds per task).

4. **Check on a Cluster** of 3 masters: the ``lock=`` task loop from as many processes as this
   machine's cores, through ``RedisCluster``; the tasks per second reached, each master's CPU
   per task and how busy it was. On a small machine the clients saturate before the masters:
   the check is that CPU per task on a master matches the single server's, and that the load
   spreads evenly, which is what the projection assumes.

Run from the repository root::

    python benchmarks/scale.py [--json out.json] [--quick] [--items N] [--seconds S]

A full run takes about 3 minutes on 2 cores, ``--quick`` about 45 s.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from kombu.utils.json import dumps
from redis.cluster import RedisCluster

from celery_redislock import Lease, Lock, RateLimit
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.claims import publish_claimed, release_claim
from celery_redislock.core.handover import Handed
from celery_redislock.core.keys import LockKeys
from celery_redislock.core.line import park
from celery_redislock.core.protocol import (
    AcquireArgs,
    AcquireReply,
    AcquireStatus,
    ClaimKind,
    ReleaseArgs,
)
from celery_redislock.core.scripts import script

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The tests' starters of local topologies (before benchmarks/topologies.py, of the same name).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from common import base_parser, redis_cpu_s, section
from topologies import ClusterGroup

TASK = "tasks.sync_customer"
TTL_S = 60.0
CLAIM_LIFETIME_S = 600.0
LINES = 100  # held locks the parked tasks wait behind
LENGTHS_S = (0.1, 1.0, 10.0)  # task lengths for the fleet projection
SHARDS = (1, 3, 6)

Client = redis.Redis | RedisCluster


# -- what a task of each option does in Redis ------------------------------------------------------


def _info(task_id: str) -> dict[str, str]:
    return {"task_id": task_id, "task": TASK}


def hold_lease(client: Client, ns: str, name: str) -> Any:
    """A running task's lease, as the locked run takes it."""
    task_id = str(uuid.uuid4())
    lock = Lock(client, name, ttl=TTL_S, namespace=ns)
    return lock.acquire(blocking=False, owner=task_id, reentrant=False, info=_info(task_id))


def make_claim(client: Client, ns: str, name: str, task_id: str) -> None:
    """A queued unique task's claim, as its publish makes it (claim, publish, confirm)."""
    publish_claimed(
        client,
        ns,
        name,
        task_id=task_id,
        lifetime=CLAIM_LIFETIME_S,
        kind=ClaimKind.NEW,
        running_counts=True,
        window=30.0,
        publish=lambda: None,
        what=f"task {TASK}[{task_id}]",
    )


def celery_payload() -> str:
    """What the Celery adapter parks: the running request as a message, with its line
    headers (the task's args ``(42,)``)."""
    app = Celery("scale", set_as_current=False)
    task_id = str(uuid.uuid4())
    headers = {"redislock_line_since": time.time(), "redislock_line": "L" + "0" * 31}
    signature = app.signature(TASK, args=(42,), kwargs={}, task_id=task_id, headers=headers)
    signature.options.update(retries=0, queue="celery", routing_key="celery")
    return str(dumps(dict(signature)))


def rq_payload(ns: str, name: str) -> str:
    """What the RQ adapter parks: where the job is, and its lock."""
    spec = {"name": name, "namespace": ns, "ttl": TTL_S, "mode": "write", "limit": None}
    spec["fence_keep"] = 86400.0
    return json.dumps({"job": str(uuid.uuid4()), "queue": "default", "lock": spec})


# -- 1. memory -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    keys_per_item: float
    bytes_per_item: float  # MEMORY USAGE of the keys, summed, per item
    used_per_item: float  # used_memory's growth per item (the key table too)


def _measure(client: redis.Redis, count: int, make: Callable[[int], object]) -> Memory:
    client.flushall()
    before_keys = client.dbsize()
    before = int(client.info("memory")["used_memory"])
    for i in range(count):
        make(i)
    used = int(client.info("memory")["used_memory"]) - before
    total = 0
    keys = 0
    for key in client.scan_iter(count=1000):
        total += int(client.memory_usage(key, samples=0) or 0)
        keys += 1
    return Memory((keys - before_keys) / count, total / count, used / count)


def _extra(
    client: redis.Redis, count: int, base: Callable[[], object], more: Callable[[int], object]
) -> Memory:
    """What ``more`` adds per item on top of ``base``."""
    client.flushall()
    base()
    keys_before = client.dbsize()
    before_total = sum(
        int(client.memory_usage(k, samples=0) or 0) for k in client.scan_iter(count=1000)
    )
    before = int(client.info("memory")["used_memory"])
    for i in range(count):
        more(i)
    used = int(client.info("memory")["used_memory"]) - before
    total = sum(int(client.memory_usage(k, samples=0) or 0) for k in client.scan_iter(count=1000))
    keys = client.dbsize() - keys_before
    return Memory(keys / count, (total - before_total) / count, used / count)


def memory(client: redis.Redis, count: int) -> dict[str, Memory]:
    ns = "scale"
    found: dict[str, Memory] = {}
    found["held lease"] = _measure(client, count, lambda i: hold_lease(client, ns, f"l{i}"))
    found["unique claim (queued)"] = _measure(
        client, count, lambda i: make_claim(client, ns, f"u{i}", str(uuid.uuid4()))
    )

    def released(i: int) -> None:
        hold_lease(client, ns, f"r{i}").release()

    found["lock name after release"] = _measure(client, count, released)
    locks = [Lock(client, f"line{n}", ttl=TTL_S, namespace=ns) for n in range(LINES)]

    def hold_all() -> None:
        for lock in locks:
            lock.acquire(blocking=False, owner=str(uuid.uuid4()), reentrant=False)

    for label, payload in (
        ("parked task, Celery", lambda lock: celery_payload()),
        ("parked task, RQ", lambda lock: rq_payload(ns, lock.name)),
    ):

        def park_one(i: int, payload: Callable[[Lock], str] = payload) -> None:
            lock = locks[i % LINES]
            task_id = str(uuid.uuid4())
            park(lock, payload(lock), owner=task_id, info=_info(task_id), max_wait=3600)

        found[label] = _extra(client, count, hold_all, park_one)
    found["rate key, one reservation"] = _measure(
        client, count, lambda i: RateLimit(client, f"k{i}", "10/s", namespace=ns).reserve(f"{i}")
    )
    one = RateLimit(client, "busy", f"{count}/h", namespace=ns)
    found["rate reservation more on one key"] = _extra(
        client, count, lambda: one.reserve("first"), lambda i: one.reserve(f"r{i}")
    )
    return found


# -- 2. Redis CPU per task -------------------------------------------------------------------------


def task_loop(kind: str, client: Client, ns: str, tag: str) -> Iterator[int]:
    """Yields after each task of ``kind``; every task on its own key."""
    n = 0
    if kind == "lock":
        while True:
            n += 1
            hold_lease(client, ns, f"{tag}:{n}").release()
            yield 1
    elif kind == "unique":
        while True:
            n += 1
            name, task_id = f"{tag}:{n}", str(uuid.uuid4())
            make_claim(client, ns, name, task_id)
            lock = Lock(client, name, ttl=TTL_S, namespace=ns)
            lease = lock.acquire(
                blocking=False, owner=task_id, reentrant=False, info=_info(task_id)
            )
            release_claim(client, ns, name, task_id)
            lease.release()
            yield 1
    elif kind == "line":
        handed: list[Handed] = []
        payload = celery_payload()
        lock = Lock(client, f"{tag}:line", ttl=TTL_S, namespace=ns, handover=handed.append)
        lease = lock.acquire(blocking=False, owner="first", reentrant=False)
        while True:
            task_id = str(uuid.uuid4())
            park(lock, payload, owner=task_id, info=_info(task_id), max_wait=3600)
            lease.release()  # hands the lock to the parked task, which is published
            token = handed.pop().token
            got = park(lock, payload, token=token, owner=task_id, info=_info(task_id))
            assert isinstance(got, Lease), got
            lease = got
            yield 1
    elif kind == "rate":
        limits = [RateLimit(client, f"{tag}:{k}", "100000/s", namespace=ns) for k in range(100)]
        while True:
            n += 1
            limits[n % 100].reserve(f"{tag}:{n}")
            yield 1
    else:
        raise ValueError(kind)


KINDS = ("lock", "unique", "line", "rate")


def _client(url: str | list[tuple[str, int]]) -> Client:
    if isinstance(url, str):
        return redis.Redis.from_url(url)
    host, port = url[0]
    return RedisCluster(host=host, port=port)


def _counted(client: Client, trips: list[int]) -> None:
    """Counts ``client``'s round trips (a pipeline's is one) in ``trips[0]``."""
    plain = client.execute_command

    def counted(*args: Any, **options: Any) -> Any:
        trips[0] += 1
        return plain(*args, **options)

    client.execute_command = counted  # type: ignore[method-assign]


def _worker(
    url: str | list[tuple[str, int]],
    kind: str,
    seconds: float,
    go: Any,
    out: Queue[tuple[int, int]],
) -> None:
    client = _client(url)
    trips = [0]
    loop = pipelined if kind.endswith("*") else task_loop
    tasks = loop(kind, client, "scale", f"p{os.getpid()}")
    per_step = next(tasks)  # connected, scripts loaded
    _counted(client, trips)
    go.wait()
    end = time.perf_counter() + seconds
    trips[0] = done = 0
    while time.perf_counter() < end:
        next(tasks)
        done += per_step
    out.put((done, trips[0]))


def drive(
    url: str | list[tuple[str, int]], kind: str, processes: int, seconds: float
) -> tuple[int, int, float]:
    """(tasks, round trips, wall seconds) of ``processes`` processes looping tasks of
    ``kind``."""
    ctx = mp.get_context("fork")
    go = ctx.Event()
    out: Queue[tuple[int, int]] = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(url, kind, seconds, go, out)) for _ in range(processes)
    ]
    for p in procs:
        p.start()
    time.sleep(0.5)  # every process connected and warmed up
    began = time.perf_counter()
    go.set()
    got = [out.get(timeout=seconds + 60) for _ in procs]
    wall = time.perf_counter() - began
    for p in procs:
        p.join()
    return sum(d for d, _ in got), sum(t for _, t in got), wall


BATCH = 64  # tasks per pipeline in the saturation runs


def pipelined(kind: str, client: Client, ns: str, tag: str) -> Iterator[int]:
    """Tasks of ``kind`` (``lock*`` or ``rate*``), ``BATCH`` at a time in one pipeline per step:
    the same script calls as :func:`task_loop`'s, sent so that Redis, not this process, is
    what limits them. Yields the tasks per step."""
    if kind == "lock*":
        locks = [Lock(client, f"{tag}:{n}", ttl=TTL_S, namespace=ns) for n in range(BATCH)]
        acquire, release = script("acquire").sha, script("release").sha
        while True:
            tokens = [os.urandom(16).hex() for _ in locks]
            pipe = client.pipeline(transaction=False)
            for lock, token in zip(locks, tokens, strict=True):
                info = json.dumps(_info(token))
                args = AcquireArgs(token, lock._spec, False, info, once=True, owner=token)
                keys = lock.encoded_keys
                pipe.execute_command("EVALSHA", acquire, len(keys), *keys, *args.encode())
            replies = [AcquireReply.decode(r) for r in pipe.execute()]
            assert all(r.status is AcquireStatus.HELD for r in replies), replies
            pipe = client.pipeline(transaction=False)
            for lock, token in zip(locks, tokens, strict=True):
                args = ReleaseArgs(token, lock._spec, False, os.urandom(8).hex()).encode()
                keys = lock.encoded_keys
                pipe.execute_command("EVALSHA", release, len(keys), *keys, *args)
            pipe.execute()
            yield BATCH
    elif kind == "rate*":
        limits = [LockKeys.of(ns, f"{tag}:{k}") for k in range(100)]
        rate, n = script("rate").sha, 0
        while True:
            pipe = client.pipeline(transaction=False)
            for _ in range(BATCH):
                n += 1
                named = limits[n % 100]
                keys = (named.bucket, named.rate_request(f"{tag}:{n}"), named.limits)
                # (rate.lua's ARGV: reserve, 100000 per 1000 ms, burst 1, cost 1)
                args = ("r", "100000", "1000", "1", "1.0", "", "", "", "")
                pipe.execute_command("EVALSHA", rate, 3, *keys, *args)
            pipe.execute()
            yield BATCH
    else:
        raise ValueError(kind)


@dataclass(frozen=True)
class Cpu:
    tasks_per_s: float
    redis_cpu_us: float  # per task
    inside_us: float  # per task: Redis's time inside the commands sent (commandstats)
    commands: float  # per task, scripts' own calls included
    trips: float  # round trips per task
    busy: float  # redis-server's CPU / wall


def _stats(client: redis.Redis) -> tuple[int, int]:
    """(commands, usec inside the commands sent) since the last reset, but INFO and CONFIG.
    A script's time includes the commands it ran, which Redis also counts apart: only the
    scripts' time and that of the commands sent alone (``HMGET``) are summed."""
    stats = {
        k: v
        for k, v in client.info("commandstats").items()
        if not k.startswith(("cmdstat_info", "cmdstat_config", "cmdstat_flushall"))
    }
    calls = sum(int(v["calls"]) for v in stats.values())
    sent = ("cmdstat_evalsha", "cmdstat_hmget")
    return calls, sum(int(v["usec"]) for k, v in stats.items() if k in sent)


def cpu(url: str, client: redis.Redis, kind: str, processes: int, seconds: float) -> Cpu:
    client.flushall()
    client.config_resetstat()
    cpu_before = redis_cpu_s(client)
    done, trips, wall = drive(url, kind, processes, seconds)
    cpu_s = redis_cpu_s(client) - cpu_before
    calls, usec = _stats(client)
    return Cpu(
        done / wall, cpu_s / done * 1e6, usec / done, calls / done, trips / done, cpu_s / wall
    )


def rounds(
    url: str, client: redis.Redis, kinds: tuple[str, ...], processes: int, seconds: float, n: int
) -> dict[str, list[Cpu]]:
    """``n`` rounds of every kind, the order rotated each round (the machine's load drifts)."""
    got: dict[str, list[Cpu]] = {kind: [] for kind in kinds}
    for r in range(n):
        for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
            got[kind].append(cpu(url, client, kind, processes, seconds))
    return got


def median(runs: list[Cpu]) -> Cpu:
    fields = Cpu.__dataclass_fields__
    return Cpu(**{f: statistics.median(getattr(r, f) for r in runs) for f in fields})


# -- 4. the Cluster check -------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterCheck:
    tasks_per_s: float
    cpu_us_per_task: list[float]  # per master: its CPU over the run, less idle, per task it served
    idle: list[float]  # per master: its CPU / wall with no load (cluster bus, replication)
    busy: list[float]  # per master: its CPU / wall under the load
    share: list[float]  # of the tasks' calls, per master


def _wait_linked(master: redis.Redis) -> None:
    """Until ``master`` has a replica in sync."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = master.info("replication")
        if info.get("connected_slaves") and info.get("slave0", {}).get("state") == "online":
            return
        time.sleep(0.1)
    raise RuntimeError("the replica never came in sync")


def _cpus(clients: list[redis.Redis]) -> list[float]:
    return [redis_cpu_s(c) for c in clients]


def cluster_check(group: ClusterGroup, processes: int, seconds: float) -> ClusterCheck:
    cluster = group.client()
    masters = [n for n in cluster.get_nodes() if n.server_type == "primary"]
    clients = [redis.Redis(host=n.host, port=n.port) for n in masters]
    for c in clients:
        c.flushall()
    # What the masters spend with no task at all (gossip on the cluster bus, pings to their
    # replicas): a fixed cost per second, not per task.
    before, began = _cpus(clients), time.perf_counter()
    time.sleep(seconds)
    idle_wall = time.perf_counter() - began
    idle = [(a - b) / idle_wall for a, b in zip(_cpus(clients), before, strict=True)]
    for c in clients:
        c.config_resetstat()
    before = _cpus(clients)
    done, _, wall = drive([(masters[0].host, masters[0].port)], "lock", processes, seconds)
    spent = [a - b for a, b in zip(_cpus(clients), before, strict=True)]
    calls = [_stats(c)[0] for c in clients]
    share = [c / (sum(calls) or 1) for c in calls]
    per_task = [
        (s - i * wall) / (done * f) * 1e6 if f else 0.0
        for s, i, f in zip(spent, idle, share, strict=True)
    ]
    cluster.close()
    return ClusterCheck(done / wall, per_task, idle, [s / wall for s in spent], share)


# -- output ----------------------------------------------------------------------------------------


def _cpu_table(runs: dict[str, list[Cpu]]) -> dict[str, Cpu]:
    """Prints the medians of each kind's runs, with the range of Redis us; returns them."""
    print(
        f"  {'option':<10}{'tasks/s':>10}{'Redis us (range)':>24}{'inside':>8}{'commands':>10}"
        f"{'trips':>7}{'busy':>7}"
    )
    medians = {}
    for kind, got in runs.items():
        c = medians[kind] = median(got)
        spread = f"({min(r.redis_cpu_us for r in got):.0f}-{max(r.redis_cpu_us for r in got):.0f})"
        trips = f"{c.trips:.2f}" if c.trips else "-"
        print(
            f"  {kind:<10}{c.tasks_per_s:>10,.0f}{c.redis_cpu_us:>11.1f} {spread:>12}"
            f"{c.inside_us:>8.1f}{c.commands:>10.1f}{trips:>7}{c.busy:>7.0%}"
        )
    print(
        f"  medians of {len(next(iter(runs.values())))} rounds; per task: Redis us = "
        "redis-server's CPU (INFO cpu); inside = its time inside the commands sent (INFO "
        "commandstats); commands = those it ran, scripts' own calls included; trips = round "
        "trips"
    )
    return medians


def _projection(cpus: dict[str, Cpu]) -> dict[str, Any]:
    head = "".join(f"{f'{s} master' + ('s' if s > 1 else ''):>12}" for s in SHARDS)
    lengths = "".join(f"{f'{t:g} s':>9}" for t in LENGTHS_S)
    print(f"  {'option':<10}{head}   workers per master, tasks of{lengths}")
    projection: dict[str, Any] = {}
    for kind, c in cpus.items():
        per_s = 1e6 / c.redis_cpu_us
        fleet = [per_s * t for t in LENGTHS_S]
        print(
            f"  {kind:<10}"
            + "".join(f"{per_s * s:>12,.0f}" for s in SHARDS)
            + " " * 30
            + "".join(f"{f:>9,.0f}" for f in fleet)
        )
        projection[kind] = {
            "tasks_per_s": {str(s): round(per_s * s) for s in SHARDS},
            "workers_one_master": {str(t): round(f) for t, f in zip(LENGTHS_S, fleet, strict=True)},
        }
    print(
        "  tasks/s: 10^6 / Redis us per task (section 2, with a round trip per call: a "
        "cautious figure), times the masters; workers: tasks/s x task length, one task per "
        "worker process"
    )
    return projection


def main() -> int:
    parser = base_parser(__doc__ or "", "1,000 items, 2 s per option")
    parser.add_argument("--items", type=int, default=10_000, help="items per memory row")
    parser.add_argument("--seconds", type=float, default=5.0, help="per CPU row (5)")
    parser.add_argument("--processes", type=int, default=2, help="client processes (2)")
    args = parser.parse_args()
    if args.url:
        parser.error("scale.py flushes its servers: it starts its own, --url is not taken")
    items = 1000 if args.quick else args.items
    seconds = 2.0 if args.quick else args.seconds
    results: dict[str, Any] = {}
    with ExitStack() as stack:
        server = stack.enter_context(RedisServer())
        client = redis.Redis.from_url(server.url)
        version = client.info("server")["redis_version"]
        print(
            f"Scale: Redis {version} ({server.binary}), {os.cpu_count()} CPU(s), "
            f"{items:,} items per memory row, {args.processes} client processes x {seconds:g} s "
            "per CPU row",
            flush=True,
        )
        section(f"1. Memory per item ({items:,} of each)")
        found = memory(client, items)
        print(f"  {'item':<36}{'keys':>6}{'MEMORY USAGE':>14}{'used_memory':>13}")
        for label, m in found.items():
            print(
                f"  {label:<36}{m.keys_per_item:>6.2f}{m.bytes_per_item:>12,.0f} B"
                f"{m.used_per_item:>11,.0f} B"
            )
        results["memory"] = {k: asdict(v) for k, v in found.items()}

        section(f"2. Redis CPU per task, by option ({args.processes} client processes)")
        n = 1 if args.quick else 3
        runs = rounds(server.url, client, KINDS, args.processes, seconds, n)
        cpus = _cpu_table(runs)
        results["cpu"] = {k: [asdict(r) for r in v] for k, v in runs.items()}

        section(f"   The same scripts, {BATCH} tasks per pipeline: Redis is the limit")
        piped = rounds(server.url, client, ("lock*", "rate*"), args.processes, seconds, n)
        saturated = _cpu_table(piped)
        for kind, c in saturated.items():
            ratio = cpus[kind.rstrip("*")].redis_cpu_us / c.redis_cpu_us
            print(f"  {kind.rstrip('*')}: {ratio:.1f}x fewer Redis us per task than one by one")
        results["saturated"] = {k: [asdict(r) for r in v] for k, v in piped.items()}

        section("3. Projection: one core of Redis per master, keys spread by hash tag")
        results["projection"] = _projection(cpus)

        section("4. Check: the lock= loop on a Cluster of 3 masters, each with a replica")
        # Beside it, the single server again, alone and with a replica of its own: a master
        # also spends CPU on sending each write to its replica.
        replica = stack.enter_context(RedisServer())
        group = stack.enter_context(ClusterGroup())
        processes = os.cpu_count() or 2
        alone = cpu(server.url, client, "lock", processes, seconds)
        host, port = server.url.split("//")[1].split("/")[0].split(":")
        replicated = redis.Redis.from_url(replica.url)
        replicated.replicaof(host, int(port))
        _wait_linked(client)
        with_replica = cpu(server.url, client, "lock", processes, seconds)
        replicated.replicaof("NO", "ONE")
        check = cluster_check(group, processes, seconds)
        print(f"  {'':<36}{'tasks/s':>9}{'Redis us per task':>20}")
        print(f"  {'single server':<36}{alone.tasks_per_s:>9,.0f}{alone.redis_cpu_us:>20.1f}")
        print(
            f"  {'single server with a replica':<36}{with_replica.tasks_per_s:>9,.0f}"
            f"{with_replica.redis_cpu_us:>20.1f}"
        )
        for i, (us, idle, busy, share) in enumerate(
            zip(check.cpu_us_per_task, check.idle, check.busy, check.share, strict=True)
        ):
            label = f"Cluster master {i + 1} ({share:.0%} of calls)"
            shown = f"{check.tasks_per_s:>9,.0f}" if i == 0 else " " * 9
            print(f"  {label:<36}{shown}{us:>20.1f}   {busy:.0%} busy ({idle:.0%} idle load)")
        # Each master's spare CPU over what the tasks cost it: where the first one fills up.
        reach = min(
            (1.0 - i) / (us * f / 1e6)
            for us, i, f in zip(check.cpu_us_per_task, check.idle, check.share, strict=True)
            if us > 0 and f > 0
        )
        print(
            f"  from {processes} client processes. At the cost per task measured on the Cluster, "
            f"its 3 masters fill up at about {reach:,.0f} tasks/s (the projection above, from "
            f"the single server: {3e6 / cpus['lock'].redis_cpu_us:,.0f})"
        )
        results["replica"] = {"alone": asdict(alone), "with_replica": asdict(with_replica)}
        results["cluster_check"] = asdict(check) | {"full_at": round(reach)}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
