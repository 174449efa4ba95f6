"""Settings given under a namespace, as a Django project gives them:
``app.config_from_object(settings, namespace="CELERY")`` with ``CELERY_REDISLOCK_URL = ...``.
They are read, and a change after first use is seen, as with ``app.conf.redislock_url``."""

from __future__ import annotations

import logging
import types
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from celery_redislock import LockConfigError, install, lock_for
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.contrib.testing import configure_app
from celery_redislock.integrations.celery.receivers import check_worker_app
from celery_redislock.integrations.celery.settings import check_app


def _config(source: str, url: str) -> Any:
    """Django-style settings: upper-case names with the CELERY_ prefix, among other names."""
    values = {
        "DEBUG": True,
        "CELERY_BROKER_URL": "memory://",
        "CELERY_REDISLOCK_URL": url,
        "CELERY_REDISLOCK_TTL": 9,
        "CELERY_REDISLOCK_NAMESPACE": "django",
    }
    if source == "class":
        return type("Settings", (), values)
    module = types.ModuleType("proj_settings")
    for key, value in values.items():
        setattr(module, key, value)
    return module


@pytest.fixture(params=["class", "module"])
def settings(request: pytest.FixtureRequest, redis_server: RedisServer) -> Any:
    return _config(request.param, redis_server.url)


@pytest.fixture
def app(settings: Any) -> Iterator[Celery]:
    application = install(Celery("ns", set_as_current=False))
    application.config_from_object(settings, namespace="CELERY")
    yield application


def _port_and_db(client: Any) -> tuple[int, int]:
    kwargs = client.connection_pool.connection_kwargs
    return int(kwargs["port"]), int(kwargs.get("db", 0))


def test_namespaced_settings_are_read(
    app: Celery, redis_server: RedisServer, client: redis.Redis
) -> None:
    @app.task(shared=False, name="ns.sync", lock="sync:{n}")
    def sync(n: int) -> None: ...

    lock = lock_for(sync, (42,))
    assert (lock.name, lock.ttl, lock.namespace) == ("sync:42", 9.0, "django")
    assert _port_and_db(lock.client) == (redis_server.port, 0)
    with lock.acquire(blocking=False):
        assert client.exists("django:{sync:42}:leases")  # on that Redis, in that namespace
    assert app.conf.broker_url == "memory://"  # (the prefix applies to Celery's own too)


def test_a_namespaced_setting_changed_after_first_use_is_seen(
    app: Celery, settings: Any, redis_server: RedisServer
) -> None:
    @app.task(shared=False, name="ns.job", lock="job")
    def job() -> None: ...

    assert lock_for(job).ttl == 9.0
    settings.CELERY_REDISLOCK_TTL = 20  # the settings object itself
    assert lock_for(job).ttl == 20.0
    app.conf.CELERY_REDISLOCK_NAMESPACE = "changed"  # app.conf, under the prefixed name
    assert lock_for(job).namespace == "changed"
    app.conf.redislock_ttl = 30  # the unprefixed name still works, and comes first
    assert lock_for(job).ttl == 30.0
    settings.CELERY_REDISLOCK_URL = redis_server.url[: -len("/0")] + "/3"
    assert _port_and_db(lock_for(job).client) == (redis_server.port, 3)
    settings.CELERY_REDISLOCK_TTL = 0  # a bad value is refused, naming the setting
    del app.conf["redislock_ttl"]
    with pytest.raises(LockConfigError, match="redislock_ttl must be a number of seconds"):
        lock_for(job)


def test_a_typo_under_the_namespace_is_warned_about(
    app: Celery, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(shared=False, name="ns.w", lock="w")
    def w() -> None: ...

    settings.CELERY_REDISLOCK_TLL = 60  # a typo of CELERY_REDISLOCK_TTL
    settings.CELERY_redislock_ttl = 60  # not a name Celery reads under an upper-case prefix
    warnings = check_app(app, needs_redis=True)
    # Only those two are flagged: not the prefixed names Celery reads, nor other settings.
    assert sorted(w.split()[1] for w in warnings) == [
        "CELERY_REDISLOCK_TLL",
        "CELERY_redislock_ttl",
    ]
    assert ", CELERY_REDISLOCK_CLIENT, " in warnings[0]  # ours, as spelled under the prefix
    with caplog.at_level(logging.WARNING, "celery_redislock"):
        check_worker_app(app)
    assert "setting CELERY_REDISLOCK_TLL is not one of celery_redislock's" in caplog.text


def test_configure_app_wins_over_the_namespaced_settings(
    app: Celery, redis_server: RedisServer
) -> None:
    @app.task(shared=False, name="ns.c", lock="c")
    def c() -> None: ...

    app.conf.CELERY_REDISLOCK_NAMESPACE = "mine"  # app.conf's own, under the prefix: read first
    assert lock_for(c).namespace == "mine"
    configure_app(app, redis_server.url[: -len("/0")] + "/5", namespace="test")
    lock = lock_for(c)
    assert (lock.namespace, _port_and_db(lock.client)) == ("test", (redis_server.port, 5))
    assert app.conf.redislock_url.endswith("/5")
