"""The lock on a real Redis Cluster: 3 masters, each with a replica, from local processes.

Every script on names spread over every node; batched renewal in one round trip per node;
replica acknowledgement sent to the node that holds the key; MOVED and ASK; the unique-task
spec registry; and a master failover under load. Marked ``topology`` (``make test-topologies``).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter

import pytest
import redis.asyncio
from celery import Celery
from helpers import wait_until_queued
from redis.client import Pipeline
from redis.cluster import RedisCluster
from topologies import (
    REQUIRED,
    ClusterGroup,
    Process,
    redis_binary,
    redis_cli,
    stretched,
    wait_until,
)

from celery_redislock import (
    Heartbeat,
    Lease,
    Lock,
    LockBackendError,
    LockConfigError,
    LockNotAcquired,
    LockNotOwned,
    RateLimit,
    RedisLockError,
    acquire_all,
    renew_leases,
    reserve_all,
)
from celery_redislock.asyncio import AsyncLock, AsyncRateLimit
from celery_redislock.asyncio import reserve_all as aio_reserve_all
from celery_redislock.core.claims import claim, release_claim
from celery_redislock.core.protocol import ClaimKind, ClaimStatus
from celery_redislock.core.replicas import require_replicas

pytestmark = [
    pytest.mark.topology,
    pytest.mark.skipif(
        (redis_binary() is None or redis_cli() is None) and not REQUIRED,
        reason="needs redis-server and redis-cli",
    ),
]


def _names_per_master(group: ClusterGroup, cluster: RedisCluster, count: int) -> dict[int, list]:
    """``count`` lock names, grouped by the port of the master that serves each."""
    by_port: dict[int, list[str]] = {}
    for i in range(count):
        name = f"job:{i}"
        node = cluster.get_node_from_key(Lock(cluster, name, ttl=1).keys.leases)
        by_port.setdefault(node.port, []).append(name)
    return by_port


def test_every_script_on_names_over_every_node(group: ClusterGroup, cluster: RedisCluster) -> None:
    names = [f"job:{i}" for i in range(120)]
    by_port = _names_per_master(group, cluster, len(names))
    assert len(by_port) == 3 and all(len(v) >= 20 for v in by_port.values()), by_port
    fences: list[int] = []
    for name in names:
        lock = Lock(cluster, name, ttl=5)
        lease = lock.acquire(info={"task_id": f"t-{name}"})
        fences.append(lease.fence)
        with pytest.raises(LockNotAcquired):
            lock.acquire(blocking=False)
        [holder] = lock.holders()
        assert holder.token == lease.token and holder.info["task_id"] == f"t-{name}"
        lease.release()
        assert not lock.locked()
        # read leases share, a writer is refused; release-where frees what a process held
        readers = Lock(cluster, name, ttl=5, mode="read")
        first, second = readers.acquire(), readers.acquire(info={"pid": "4242"})
        with pytest.raises(LockNotAcquired):
            lock.acquire(blocking=False)
        assert readers.release_where(pid="4242") == [second.token]
        first.release()
        again = lock.acquire()
        assert again.fence > lease.fence
        again.release(finish_job=f"j-{name}", keep=5)
        with pytest.raises(RedisLockError, match="finished"):
            lock.acquire(job=f"j-{name}", blocking=False)
        # a unique task's claim and its release
        got = claim(
            cluster,
            "redislock",
            name,
            task_id=f"id-{name}",
            lifetime=5,
            kind=ClaimKind.NEW,
            running_counts=True,
        )
        assert got.status is ClaimStatus.CLAIMED, got
        other = claim(
            cluster,
            "redislock",
            name,
            task_id=f"other-{name}",
            lifetime=5,
            kind=ClaimKind.NEW,
            running_counts=True,
        )
        assert other.duplicate and other.holder == f"id-{name}"
        assert release_claim(cluster, "redislock", name, f"id-{name}") is None
    assert len(set(fences)) == len(fences)


def test_a_fair_waiter_is_handed_the_lock_on_every_node(
    group: ClusterGroup, cluster: RedisCluster
) -> None:
    by_port = _names_per_master(group, cluster, 30)
    for names in by_port.values():
        lock = Lock(cluster, names[0], ttl=5, fair=True)
        lease = lock.acquire()
        got: list[Lease] = []
        waiter = threading.Thread(
            target=lambda lock=lock, got=got: got.append(lock.acquire(timeout=20))
        )
        waiter.start()
        wait_until(lambda lock=lock: cluster.zcard(lock.keys.all[2]) >= 1, "the waiter queued")
        lease.release()
        waiter.join(20)
        assert not waiter.is_alive() and len(got) == 1 and got[0].fence > lease.fence
        got[0].release()


def test_batched_renewal_is_one_round_trip_per_node(
    group: ClusterGroup, cluster: RedisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    leases = [Lock(cluster, f"batch:{i}", ttl=5).acquire() for i in range(300)]
    slots = {cluster.keyslot(lease.lock.keys.leases) for lease in leases}
    masters = [p for p in group.processes if p.client().info("replication")["role"] == "master"]
    for master in masters:
        master.client().config_resetstat()
    # Count the round trips the renewal makes: every pipeline execution, on any node.
    sent: Counter[int] = Counter()
    real_execute = Pipeline.execute

    def counting(self: Pipeline, raise_on_error: bool = True) -> list[object]:
        sent[self.connection_pool.connection_kwargs["port"]] += 1
        return real_execute(self, raise_on_error)

    monkeypatch.setattr(Pipeline, "execute", counting)
    for master in masters:
        master.client().script_flush()  # NOSCRIPT on every node: loaded again
    report = renew_leases(leases)
    monkeypatch.undo()
    assert len(report.renewed) == 300 and not report.lost
    # One pipeline per node, sent again once after the script was loaded (it was flushed).
    assert set(sent) == {m.port for m in masters} and set(sent.values()) == {2}, sent
    evalsha = 0
    for master in masters:
        stats = master.client().info("commandstats")
        evalsha += stats.get("cmdstat_evalsha", {}).get("calls", 0)
    # One script per slot, on the first try (refused) and the second.
    assert evalsha == 2 * len(slots)
    for lease in leases:
        lease.release()


@pytest.mark.faults
def test_replica_acknowledgement_waits_on_the_keys_own_node(
    group: ClusterGroup, cluster: RedisCluster
) -> None:
    by_port = _names_per_master(group, cluster, 40)
    for names in by_port.values():
        lease = Lock(cluster, names[0], ttl=5, min_replicas=1).acquire()
        lease.renew()
        lease.release()
    # Freeze one master's replica: only that master's names fail (closed), the others succeed.
    port = next(iter(by_port))
    master = next(p for p in group.processes if p.port == port)
    replica = group.replica_of(master)
    replica.pause()
    try:
        for other, names in by_port.items():
            # (A live replica is given 10 s: a busy machine's may take seconds to answer.)
            wait = 0.2 if other == port else 10
            lock = Lock(cluster, names[1], ttl=5, min_replicas=1, replica_timeout=wait)
            if other == port:
                with pytest.raises(LockBackendError, match="acknowledged by 0 of the 1"):
                    lock.acquire()
                assert not lock.locked()  # the lease it made was dropped
            else:
                lock.acquire().release()
        held = Lock(cluster, by_port[port][2], ttl=5).acquire()
        strict = Lock(cluster, held.name, ttl=5, min_replicas=1, replica_timeout=0.2)
        with pytest.raises(LockBackendError, match="renewal"):
            renew_leases([Lease(strict, held.token, held.fence, "write", None, 0, 0.0)])
        held.release()
    finally:
        replica.resume()
    # The policy may come with the client instead.
    require_replicas(cluster, 1)
    try:
        assert Lock(cluster, "policy", ttl=5).replicas is not None
    finally:
        require_replicas(cluster, 0)


def _node_id(process: Process) -> str:
    with process.client() as c:
        return str(c.execute_command("CLUSTER", "MYID").decode())


@pytest.mark.parametrize("min_replicas", [0, 1])
def test_moved_and_ask_are_followed(
    group: ClusterGroup, cluster: RedisCluster, min_replicas: int
) -> None:
    """A held lease's slot is migrated to another master while the client's slot map is stale:
    during the migration its keys answer ASK (the batched renewal follows it), after it MOVED
    (renewal, acquire and release follow it)."""
    by_port = _names_per_master(group, cluster, 60)
    source_port = next(iter(by_port))
    name, neighbour = by_port[source_port][:2]
    lock = Lock(cluster, name, ttl=5, min_replicas=min_replicas)
    lease = lock.acquire()
    held = Lock(cluster, neighbour, ttl=5, min_replicas=min_replicas).acquire()
    slot = cluster.keyslot(lock.keys.leases)
    source = group.node_of(lock.keys.leases)
    target = next(
        p
        for p in group.processes
        if p.alive() and p is not source and p.client().info("replication")["role"] == "master"
    )
    masters = [p for p in group.processes if p.client().info("replication")["role"] == "master"]
    target.client().execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", _node_id(source))
    source.client().execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", _node_id(target))
    try:
        with source.client() as c:
            keys = c.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            assert lock.keys.leases.encode() in keys
            c.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
        # One batch to the source: the neighbour's lease is renewed there, this one on the
        # target after ASK.
        report = renew_leases([lease, held])
        assert len(report.renewed) == 2 and not report.lost
        # A script over keys that do not all exist yet on an importing slot is refused by
        # Redis (TRYAGAIN): the acquire fails closed, as a backend error.
        with pytest.raises(LockBackendError):
            Lock(cluster, name, ttl=5, min_replicas=min_replicas).acquire(blocking=False)
    finally:
        for node in masters:
            node.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", _node_id(target))
    wait_until(lambda: group.settled(), "the slot's move is agreed")
    # The client still maps the slot to the source: MOVED, followed.
    assert cluster.get_node_from_key(lock.keys.leases).port == source.port
    report = renew_leases([lease, held])
    assert len(report.renewed) == 2 and not report.lost
    with pytest.raises(LockNotAcquired):
        Lock(cluster, name, ttl=5, min_replicas=min_replicas).acquire(blocking=False)
    lease.release()
    held.release()
    with pytest.raises(LockNotOwned):
        lease.release()
    assert not lock.locked()


def test_several_rate_limits_need_one_hash_slot(cluster: RedisCluster) -> None:
    """All or nothing needs one script: limits in different slots are refused saying how to
    put them in one; names that share a hash tag are reserved together."""
    apart = [(RateLimit(cluster, name, "1/10s"), 1.0) for name in ("tenant:7", "partner-api")]
    with pytest.raises(LockConfigError, match=r"different Redis Cluster slots.*hash tag"):
        reserve_all(apart, "r1")
    together = [
        (RateLimit(cluster, name, "1/10s"), 1.0) for name in ("{acme}:tenant:7", "{acme}:api")
    ]
    assert reserve_all(together, "r1").delay == 0.0
    again = reserve_all(together, "r2")
    assert 9 < again.delay <= 10 and again.name == "{acme}:tenant:7"


def test_a_lock_set_needs_one_hash_slot(cluster: RedisCluster) -> None:
    """Locks in different slots are refused saying how to put them in one, nothing taken;
    names that share a hash tag are taken together, all or nothing."""
    apart = [Lock(cluster, name, ttl=5) for name in ("tenant:7", "partner-api")]
    with pytest.raises(LockConfigError, match=r"different Redis Cluster slots.*hash tag"):
        acquire_all(apart)
    assert not any(lock.locked() for lock in apart)
    together = [Lock(cluster, name, ttl=5) for name in ("{acme}:tenant:7", "{acme}:api")]
    leases = acquire_all(together, blocking=False)
    with pytest.raises(LockNotAcquired) as refused:
        acquire_all([Lock(cluster, "{acme}:tenant:8", ttl=5), together[1]], blocking=False)
    assert refused.value.name == "{acme}:api"
    assert not Lock(cluster, "{acme}:tenant:8", ttl=5).locked()
    for lease in leases:
        lease.release()


def test_unique_task_specs_registry_on_the_cluster(cluster: RedisCluster) -> None:
    from celery_redislock.integrations.celery import install
    from celery_redislock.integrations.celery.registry import publish_specs, spec_for

    worker_app = install(Celery("worker-side"))
    worker_app.conf.redislock_client = lambda: cluster
    producer = install(Celery("producer-side"))
    producer.conf.redislock_client = lambda: cluster

    @worker_app.task(name="report", unique={"lifecycle": "until_finished", "key": "r:{day}"})
    def report(day: str) -> None: ...

    publish_specs(worker_app)
    spec = spec_for(producer, "report")
    assert spec is not None and spec.unique.lifecycle == "until_finished"


@pytest.mark.faults
def test_master_failover_under_load() -> None:
    """Clients take and give back leases (acknowledged by a replica) on names over every node
    while one master is killed: no two holders of a name at once, calls during the failover end
    in an error or a lease by their deadline, held leases are renewed again once the replica took
    over, and acquires succeed again."""
    with ClusterGroup() as group:
        cluster = group.client(socket_timeout=2, socket_connect_timeout=1)
        names = [f"load:{i}" for i in range(60)]
        holding: dict[str, str] = {}
        guard = threading.Lock()
        violations: list[str] = []
        slow: list[float] = []
        errors: Counter[str] = Counter()
        done = Counter[str]()
        stop = threading.Event()
        heartbeat = Heartbeat.current()
        lost: list[Lease] = []

        def client_loop(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                lock = Lock(cluster, rng.choice(names), ttl=6, min_replicas=1, replica_timeout=1)
                began = time.monotonic()
                try:
                    lease = lock.acquire(timeout=1)
                except LockNotAcquired:
                    continue
                except LockBackendError as exc:
                    errors[type(exc.__cause__).__name__] += 1
                    time.sleep(0.05)
                    continue
                finally:
                    # Timeout 1 s, a socket timeout of 2 s and a few redirects: never past 15 s.
                    if time.monotonic() - began > 15:
                        slow.append(time.monotonic() - began)
                with guard:
                    if lock.name in holding:
                        violations.append(lock.name)
                    holding[lock.name] = lease.token
                heartbeat.register(lease, on_lost=lambda lease, error: lost.append(lease))
                time.sleep(rng.uniform(0.005, 0.03))
                heartbeat.unregister(lease)
                with guard:
                    if holding.get(lock.name) == lease.token:
                        del holding[lock.name]
                try:
                    lease.release()
                    done["released"] += 1
                except (LockBackendError, LockNotOwned):
                    done["release failed"] += 1

        # Long-held leases on the master about to die: renewed again after the failover.
        victim = group.node_of(Lock(cluster, "kept:0", ttl=1).keys.leases)
        kept = []
        for i in range(400):
            lock = Lock(cluster, f"kept:{i}", ttl=20, min_replicas=1)
            if cluster.get_node_from_key(lock.keys.leases).port == victim.port:
                kept.append(lock.acquire())
            if len(kept) == 10:
                break
        for lease in kept:
            heartbeat.register(lease, on_lost=lambda lease, error: lost.append(lease))
        threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: done["released"] >= 50, "the load is running", 60)
            before = {lease.token: lease.expires_at_ms for lease in kept}
            group.failover_after_kill(victim)
            # Until the dead node is back as a replica of the new master, that master has no
            # replica: its acquires and renewals fail closed (min_replicas=1).
            group.restart(victim)
            released = done["released"]
            wait_until(lambda: done["released"] >= released + 50, "acquires succeed again", 30)
            wait_until(
                lambda: all(lease.expires_at_ms > before[lease.token] for lease in kept),
                "the kept leases are renewed on the new master",
                30,
            )
        finally:
            stop.set()
            for t in threads:
                t.join(stretched(30))
            for lease in kept:
                heartbeat.unregister(lease)
        assert not any(t.is_alive() for t in threads)
        assert not violations and not slow and not lost, (violations, slow, lost, errors)
        for lease in kept:
            lease.release()
        cluster.close()


def test_the_asyncio_lock_and_rate_limit_on_the_cluster(
    group: ClusterGroup, cluster: RedisCluster
) -> None:
    """redis-py's asyncio RedisCluster: each script goes to its keys' node (names over every
    node), the asyncio lock excludes the synchronous one and hands it to a fair asyncio waiter,
    a kept-alive lease is renewed past its ttl, and rate limits need one slot as they do
    synchronously."""
    names = [f"aio-{i}" for i in range(12)]
    assert len({cluster.get_node_from_key(f"redislock:{{{n}}}:leases").name for n in names}) == 3

    async def body() -> None:
        aclient = redis.asyncio.RedisCluster(host="127.0.0.1", port=group.processes[0].port)
        try:
            for name in names:
                alock = AsyncLock(aclient, name, ttl=1, fair=True)
                sync = Lock(cluster, name, ttl=5, fair=True)
                held = sync.acquire(blocking=False)
                waiting = asyncio.create_task(alock.acquire(timeout=10))
                await asyncio.to_thread(wait_until_queued, cluster, sync)
                await asyncio.to_thread(held.release)
                async with await waiting as lease:
                    assert lease.fence > held.fence
                    with pytest.raises(LockNotAcquired):
                        sync.acquire(blocking=False)
                    if name == names[0]:
                        await asyncio.sleep(2)  # two ttls: held only if renewed
                        lease.check()
                        assert [h.token for h in await alock.holders()] == [lease.token]
                assert not sync.locked()
            apart = [(AsyncRateLimit(aclient, n, "5/s"), 1.0) for n in ("tenant:7", "api")]
            with pytest.raises(LockConfigError, match="different Redis Cluster slots"):
                await aio_reserve_all(apart, "r-1")
            together = [(AsyncRateLimit(aclient, n, "5/s"), 1.0) for n in ("{a}:t", "{a}:api")]
            assert (await aio_reserve_all(together, "r-1")).granted
        finally:
            await aclient.aclose()

    asyncio.run(body())
