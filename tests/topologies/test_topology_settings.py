"""The Sentinel settings form and replica acknowledgement, without a topology: what is checked
when, and the fail-closed path on a server that has no replica (every Redis version). Fast:
runs with the default tests (no marker)."""

from __future__ import annotations

import pytest
import redis
from celery import Celery
from redis.sentinel import SentinelConnectionPool

from celery_redislock import Lease, Lock, LockBackendError, LockConfigError, renew_leases
from celery_redislock.core.clients import parse_sentinels, sentinel_client
from celery_redislock.core.replicas import policy_of, require_replicas
from celery_redislock.integrations.celery import client_for, install
from celery_redislock.integrations.celery.settings import check_app


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("h1:26379,h2:26380", [("h1", 26379), ("h2", 26380)]),
        (["h1:26379"], [("h1", 26379)]),
        ([("h1", 26379), ["h2", "26380"]], [("h1", 26379), ("h2", 26380)]),
        ("::1:26379", [("::1", 26379)]),
    ],
)
def test_sentinel_addresses(value: object, expected: list[tuple[str, int]]) -> None:
    assert parse_sentinels(value) == expected


@pytest.mark.parametrize("value", ["", "h1", "h1:0", "h1:x", [("h1",)], 26379, None, [True]])
def test_bad_sentinel_addresses_name_the_setting(value: object) -> None:
    with pytest.raises(LockConfigError, match="setting redislock_sentinels must"):
        parse_sentinels(value, "setting redislock_sentinels")


def _app(**conf: object) -> Celery:
    app = install(Celery("sentinel-settings", broker="memory://"))
    app.conf.update(conf)
    return app


def test_the_sentinel_settings_make_a_master_for_client() -> None:
    app = _app(
        redislock_sentinels=["127.0.0.1:1", "127.0.0.1:2"],
        redislock_sentinel_master="locks",
        redislock_sentinel_options={"db": 3},
        redislock_min_replicas=1,
        redislock_replica_timeout=0.25,
    )
    assert check_app(app, needs_redis=True) == []  # no warning: every name is a setting
    client = client_for(app)  # makes no connection
    assert isinstance(client, redis.Redis)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "locks"
    assert pool.connection_kwargs["db"] == 3
    assert pool.connection_kwargs["socket_timeout"] == 5.0
    policy = policy_of(client)
    assert policy is not None and (policy.count, policy.timeout) == (1, 0.25)
    assert Lock(client, "x", ttl=1).replicas == policy
    assert Lock(client, "x", ttl=1, min_replicas=0).replicas is None  # the lock's own wins


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"redislock_sentinel_master": "m"}, "redislock_sentinel_master needs redislock_sentinels"),
        ({"redislock_sentinels": "h:1"}, "redislock_sentinel_master must name the Sentinel"),
        (
            {
                "redislock_sentinels": "h:1",
                "redislock_sentinel_master": "m",
                "redislock_sentinel_options": 3,
            },
            "redislock_sentinel_options must be a dict",
        ),
        ({"redislock_min_replicas": -1}, "min_replicas must be an integer >= 0, got -1"),
        ({"redislock_min_replicas": "1"}, "min_replicas must be an integer >= 0"),
        ({"redislock_replica_timeout": 0}, "replica_timeout must be a number of seconds"),
    ],
)
def test_bad_settings_name_the_setting(conf: dict[str, object], message: str) -> None:
    app = _app(redislock_url="redis://127.0.0.1:1/0", **conf)
    with pytest.raises(LockConfigError, match=message):
        check_app(app, needs_redis=True)


def test_min_replicas_applies_to_a_url_client_too() -> None:
    app = _app(redislock_url="redis://127.0.0.1:1/0", redislock_min_replicas=2)
    policy = policy_of(client_for(app))
    assert policy is not None and policy.count == 2


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_bad_min_replicas_on_a_lock(client: redis.Redis, bad: object) -> None:
    with pytest.raises(LockConfigError, match="min_replicas must be an integer >= 0") as info:
        Lock(client, "x", ttl=1, min_replicas=bad)  # type: ignore[arg-type]
    assert info.value.name == "x"


def test_sentinel_client_checks_its_arguments() -> None:
    with pytest.raises(LockConfigError, match="service"):
        sentinel_client("h:1", "")
    with pytest.raises(LockConfigError, match="min_replicas"):
        sentinel_client("h:1", "m", min_replicas=-2)


def test_without_a_replica_acquire_and_renewal_fail_closed(client: redis.Redis) -> None:
    """A server with no replica never acknowledges: the acquire raises LockBackendError and
    leaves no lease; a renewal is not counted."""
    strict = Lock(client, "strict", ttl=5, min_replicas=1, replica_timeout=0.05)
    with pytest.raises(LockBackendError, match="acknowledged by 0 of the 1") as info:
        strict.acquire()
    assert info.value.name == "strict"
    assert not strict.locked()
    for fair in (False, True):
        lease = Lock(client, f"held:{fair}", ttl=5, fair=fair).acquire()
        at_risk = Lease(
            Lock(client, lease.name, ttl=5, fair=fair, min_replicas=1, replica_timeout=0.05),
            lease.token,
            lease.fence,
            "write",
            None,
            lease.expires_at_ms,
            lease.valid_until,
        )
        with pytest.raises(LockBackendError, match="renewal"):
            renew_leases([at_risk])
        lease.release()
    # A policy on the client: the same, for every lock made on it.
    require_replicas(client, 1, timeout=0.05)
    try:
        with pytest.raises(LockBackendError):
            Lock(client, "by-client", ttl=5).acquire()
    finally:
        require_replicas(client, 0)
    Lock(client, "by-client", ttl=5).acquire().release()


def test_a_refused_re_entry_is_undone(client: redis.Redis) -> None:
    """An owner re-entering its lease through a lock that needs a replica: the re-entry is
    refused (no replica here) and undone, so the owner still holds it once."""
    lease = Lock(client, "re", ttl=5).acquire(owner="worker-1")
    strict = Lock(client, "re", ttl=5, min_replicas=1, replica_timeout=0.05)
    with pytest.raises(LockBackendError):
        strict.acquire(owner="worker-1")
    [holder] = strict.holders()
    assert holder.token == lease.token and holder.count == 1
    lease.release()
    assert not strict.locked()
