"""Bad RQ job declarations and settings are refused when the function is defined (or the
settings made), naming the job, the option and what is allowed."""

from __future__ import annotations

import pytest

from celery_redislock.errors import LockConfigError
from celery_redislock.integrations.rq import Settings, locked, spec_of


def job(x: int, y: int = 0) -> None: ...


@pytest.mark.parametrize(
    ("lock", "unique", "message"),
    [
        ({"mode": "exclusive"}, None, r"test_rq_options.job.*'mode'.*'read' or 'write'"),
        ({"colour": 1}, None, r"unknown lock option\(s\) 'colour'; allowed: key, mode"),
        ("k:{z}", None, r"template names argument\(s\) 'z'.*its arguments are: x, y"),
        ({"limit": 0}, None, r"'limit'"),
        ({"ttl": -1}, None, r"'ttl'"),
        ({"on_conflict": "later"}, None, r"'on_conflict'.*'raise', 'queue'"),
        (None, "forever", r"unique option 'lifecycle'.*until_started"),
        ({"mode": "read"}, "until_finished", r"needs an exclusive lock="),
        (None, None, r"needs lock=, unique= or rate="),
        (42, None, r"lock must be True, a key template string, a list or a dict"),
        ({"tenant": "{x}"}, None, r"test_rq_options.job.*'tenant': applies to on_conflict"),
        ({"on_conflict": "queue", "tenant": "{z}"}, None, r"'tenant'.*argument\(s\) 'z'"),
        ({"on_conflict": "queue", "priority": 2}, None, r"'priority'.*needs the option 'tenant'"),
        (
            {"on_conflict": "queue", "tenant": "{x}", "priority": 0.5},
            None,
            r"'priority': must be an int from -2147483648 to 2147483647",
        ),
    ],
)
def test_bad_options_are_refused_at_declaration(lock, unique, message):
    with pytest.raises(LockConfigError, match=message):
        locked(lock=lock, unique=unique)(job)


def test_a_job_must_be_importable_by_rq():
    def local(x: int) -> None: ...

    with pytest.raises(LockConfigError, match="module-level function"):
        locked(lock=True)(local)
    with pytest.raises(LockConfigError, match="applied twice"):
        locked(lock=True)(locked(lock=True)(job))


def test_the_declaration_is_kept_on_the_function():
    decorated = locked(lock="k:{x}", unique="until_started")(job)
    spec = spec_of(decorated)
    assert spec is not None and spec.name == "test_rq_options.job"
    assert spec.lock_name((1,), {}) == "k:1" == spec.lock_name((), {"x": 1, "y": 0})
    assert decorated.__wrapped__ is job  # type: ignore[attr-defined]
    assert spec_of(job) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ttl": 0}, r"setting ttl"),
        ({"on_conflict": "later"}, r"setting on_conflict.*'skip'"),
        ({"on_backend_error": "ignore"}, r"setting on_backend_error.*'fail', 'retry', 'run'"),
        ({"namespace": "a{b"}, r"setting namespace"),
        ({"url": ""}, r"setting url must be a Redis URL"),
        ({"max_conflict_retries": 0}, r"max_conflict_retries must be an integer >= 1"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(LockConfigError, match=message):
        Settings(**kwargs)


def test_settings_come_from_the_environment():
    s = Settings.from_env({"REDISLOCK_TTL": "30", "REDISLOCK_ON_CONFLICT": "retry"})
    assert (s.ttl, s.on_conflict, s.on_duplicate) == (30.0, "retry", "existing")
    with pytest.raises(LockConfigError, match="REDISLOCK_TTL must be a number of seconds"):
        Settings.from_env({"REDISLOCK_TTL": "soon"})
    with pytest.raises(LockConfigError, match="REDISLOCK_ON_CONFLICT"):
        Settings.from_env({"REDISLOCK_ON_CONFLICT": "later"})
    with pytest.raises(LockConfigError, match="settings must be a"):
        locked(lock=True, settings={"ttl": 3})(job)  # type: ignore[arg-type]


def test_sentinel_and_replica_settings_build_the_lock_client():
    from redis.sentinel import SentinelConnectionPool

    from celery_redislock.core.replicas import policy_of
    from celery_redislock.integrations.rq.settings import client_for

    s = Settings.from_env(
        {
            "REDISLOCK_SENTINELS": "127.0.0.1:26379,127.0.0.1:26380",
            "REDISLOCK_SENTINEL_MASTER": "locks",
            "REDISLOCK_MIN_REPLICAS": "1",
            "REDISLOCK_REPLICA_TIMEOUT": "0.25",
        }
    )
    client = client_for(s, None)  # making it does not connect
    assert isinstance(client.connection_pool, SentinelConnectionPool)
    assert client.connection_pool.service_name == "locks"
    policy = policy_of(client)
    assert policy is not None and (policy.count, policy.timeout) == (1, 0.25)
    assert client_for(s, None) is client  # one per process and address
    with pytest.raises(LockConfigError, match="sentinel_master must name the Sentinel service"):
        Settings(sentinels="127.0.0.1:26379")
    with pytest.raises(LockConfigError, match="give one of them, not both"):
        Settings(url="redis://x", sentinels="127.0.0.1:26379", sentinel_master="m")
    with pytest.raises(LockConfigError, match="setting sentinels"):
        Settings(sentinels="nowhere", sentinel_master="m")
    with pytest.raises(LockConfigError, match="min_replicas must be an integer >= 0"):
        Settings(min_replicas=-1)
