"""Fixtures of the topology tests: a Redis Cluster (3 masters, each with a replica) from local
processes, one per test module, emptied before each test. The Sentinel tests make their own
group (tests/topologies/test_topology_sentinel.py's ``group`` overrides this one there)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster
from topologies import ClusterGroup


@pytest.fixture(scope="module")
def group() -> Iterator[ClusterGroup]:
    """One cluster for a module's tests (they leave every node up, or say so)."""
    with ClusterGroup() as started:
        yield started


@pytest.fixture
def cluster(group: ClusterGroup) -> Iterator[RedisCluster]:
    """A client of the module's cluster, every master emptied first."""
    client = group.client()
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()
