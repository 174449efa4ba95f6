"""The admin API and the ``redislock --cluster`` command on a real Redis Cluster (3 masters,
each with a replica, from local processes): locks and claims found on every node, waiters read
from a lock's slot, forced releases. Marked ``topology`` (``make test-topologies``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from redis.cluster import RedisCluster
from topologies import REQUIRED, ClusterGroup, redis_binary, redis_cli, wait_until

from celery_redislock import Lease, Lock
from celery_redislock.core import admin
from celery_redislock.core.claims import claim
from celery_redislock.core.protocol import ClaimKind

pytestmark = [
    pytest.mark.topology,
    pytest.mark.skipif(
        (redis_binary() is None or redis_cli() is None) and not REQUIRED,
        reason="needs redis-server and redis-cli",
    ),
]

NAMES = [f"sync:{i}" for i in range(12)]  # spread over every master's slots


def test_locks_and_waiters_on_every_node(cluster: RedisCluster) -> None:
    nodes = {cluster.get_node_from_key(f"redislock:{{{n}}}:leases").name for n in NAMES}
    assert len(nodes) == 3
    leases = {n: Lock(cluster, n, ttl=30).acquire(info={"task_id": f"t-{n}"}) for n in NAMES}
    got: list[Lease] = []
    lock = Lock(cluster, NAMES[0], ttl=30)
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=20)))
    waiter.start()
    wait_until(lambda: cluster.zcard(lock.keys.all[2]) >= 1, "the waiter queued", 10)
    states = admin.list_locks(cluster, "sync:*")
    assert sorted(s.name for s in states) == sorted(NAMES)
    state = admin.describe_lock(cluster, NAMES[0])
    assert [h.info["task_id"] for h in state.holders] == [f"t-{NAMES[0]}"]
    assert len(state.waiters) == 1 and state.waiters[0].info["pid"] == str(os.getpid())
    freed = admin.force_release(cluster, NAMES[0], task_id=f"t-{NAMES[0]}")
    assert [h.token for h in freed.holders] == [leases[NAMES[0]].token]
    waiter.join(10)
    assert got
    got[0].release()
    for name in NAMES[1:]:
        leases[name].release()


def test_claims_and_the_cluster_flag_of_the_console_script(
    cluster: RedisCluster, group: ClusterGroup
) -> None:
    for name in NAMES:
        claim(
            cluster,
            "redislock",
            name,
            task_id=f"t-{name}",
            lifetime=60,
            kind=ClaimKind.NEW,
            running_counts=False,
        )
    assert [c.name for c in admin.list_claims(cluster)] == sorted(NAMES)
    Lock(cluster, "held", ttl=30).acquire()
    url = f"redis://127.0.0.1:{group.processes[0].port}/0"
    script = Path(sys.executable).parent / "redislock"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(script), "--url", url, "--cluster", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    listed = run("unique", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [c["name"] for c in json.loads(listed.stdout)] == sorted(NAMES)
    assert [s["name"] for s in json.loads(run("list", "--json").stdout)] == ["held"]
    freed = run("release-claim", NAMES[5])
    assert freed.returncode == 0, freed.stderr
    assert NAMES[5] not in [c.name for c in admin.list_claims(cluster)]
