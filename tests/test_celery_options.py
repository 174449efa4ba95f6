"""The lock= option: checked when the task is declared; keys derived from the bound call."""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, Task

import celery_redislock
from celery_redislock import LockConfigError, LockedTask, install, lock_for


@pytest.fixture
def app() -> Iterator[Celery]:
    application = install(Celery("opts", broker="memory://", set_as_current=False))
    application.conf.redislock_url = "redis://127.0.0.1:1/0"  # never connected to here
    yield application


@pytest.mark.parametrize(
    ("lock", "message"),
    [
        ({"kye": "x"}, "task 'opts.f': unknown lock option(s) 'kye'; allowed: key, mode, limit"),
        ({"mode": "exclusive"}, "lock option 'mode': must be 'read' or 'write', got 'exclusive'"),
        ({"limit": 0}, "lock option 'limit': must be an integer >= 1 or None, got 0"),
        ({"limit": True}, "lock option 'limit': must be an integer >= 1 or None, got True"),
        (
            {"key": "sync:{customer}"},
            "lock option 'key': template names argument(s) 'customer' that the task does not "
            "take; its arguments are: customer_id, full",
        ),
        ({"key": "x:{0}"}, "template fields must name arguments, got {0}"),
        ({"key": "x:{"}, "lock option 'key': is not a valid format string"),
        ({"key": 42}, "lock option 'key': must be a template string, a callable or None"),
        ({"on_conflict": "ignore"}, "'on_conflict': must be one of 'skip', 'retry', 'wait'"),
        ({"scope": "machine"}, "lock option 'scope': must be one of 'global', 'host'"),
        ({"ttl": 0}, "lock option 'ttl': must be a positive number of seconds or None, got 0"),
        ({"timeout": -1}, "lock option 'timeout': must be a positive number of seconds, got -1"),
        ({"countdown": "2"}, "lock option 'countdown': must be a positive number of seconds"),
        ({"max_retries": -1}, "lock option 'max_retries': must be an integer >= 0 or None"),
        ({"count_retries": 1}, "lock option 'count_retries': must be True or False, got 1"),
        (["key"], "task 'opts.f': lock must be True, a key template string or a dict of options"),
    ],
)
def test_bad_option_is_refused_when_the_task_is_declared(
    app: Celery, lock: Any, message: str
) -> None:
    with pytest.raises(LockConfigError) as raised:

        @app.task(name="opts.f", lock=lock)
        def f(customer_id: int, full: bool = False) -> None: ...

    assert message in str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_without_install_the_task_class_checks_when_celery_creates_the_task() -> None:
    plain = Celery("opts", broker="memory://", set_as_current=False, task_cls=LockedTask)

    @plain.task(shared=False, name="opts.g", lock={"mode": "shared"})
    def g() -> None: ...

    with pytest.raises(LockConfigError, match="'mode': must be 'read' or 'write'"):
        plain.finalize()  # Celery builds task classes lazily: here, or at worker start


def test_lock_on_a_task_that_is_not_locked_is_refused() -> None:
    plain = Celery("opts", broker="memory://", set_as_current=False)

    @plain.task(shared=False, name="opts.h", lock=True)
    def h() -> None: ...

    plain.finalize()
    with pytest.raises(
        LockConfigError, match=r"opts\.h declare lock= or unique= but do not derive"
    ):
        install(plain)


def test_lock_with_a_base_that_is_not_locked_is_refused(app: Celery) -> None:
    with pytest.raises(LockConfigError, match="lock= and unique= need a base class derived from"):

        @app.task(name="opts.i", base=Task, lock=True)
        def i() -> None: ...


def test_bound_task_key_drops_self_and_checks_the_rest(app: Celery) -> None:
    @app.task(name="opts.bound", bind=True, lock="b:{n}")
    def bound(self: Any, n: int) -> None: ...

    assert lock_for(bound, (3,)).name == "b:3"
    with pytest.raises(LockConfigError, match="'self'"):

        @app.task(name="opts.bad", bind=True, lock="b:{self}")
        def bad(self: Any, n: int) -> None: ...


def test_positional_keyword_and_default_forms_are_one_key(app: Celery) -> None:
    @app.task(name="opts.sync", lock=True)
    def sync(customer_id: int, full: bool = False, **extra: Any) -> None: ...

    names = {
        lock_for(sync, (42,)).name,
        lock_for(sync, (), {"customer_id": 42}).name,
        lock_for(sync, (42, False)).name,
        lock_for(sync, (), {"full": False, "customer_id": 42}).name,
    }
    assert len(names) == 1
    (name,) = names
    assert name.startswith("opts.sync:")
    assert lock_for(sync, (43,)).name != name
    assert lock_for(sync, (42, True)).name != name
    assert lock_for(sync, (42,), {"region": "eu"}).name != name


def test_canonical_hash_ignores_mapping_order_and_knows_common_types(app: Celery) -> None:
    @app.task(name="opts.c", lock=True)
    def c(data: Any) -> None: ...

    assert lock_for(c, ({"a": 1, "b": 2},)).name == lock_for(c, ({"b": 2, "a": 1},)).name
    assert lock_for(c, ({1, 2},)).name == lock_for(c, ({2, 1},)).name
    assert lock_for(c, ((1, 2),)).name == lock_for(c, ([1, 2],)).name
    day = datetime.date(2026, 11, 21)
    assert lock_for(c, (day,)).name == lock_for(c, (datetime.date(2026, 11, 21),)).name
    with pytest.raises(LockConfigError, match="cannot hash a object into a lock key"):
        lock_for(c, (object(),))


def test_template_uses_bound_defaults_and_kwargs(app: Celery) -> None:
    @app.task(name="opts.t", lock="t:{region}:{full}:{extra}")
    def t(region: str, full: bool = False, **kw: Any) -> None: ...

    assert lock_for(t, ("eu",), {"extra": 1}).name == "t:eu:False:1"


def test_callable_key_gets_the_call_arguments(app: Celery) -> None:
    @app.task(name="opts.k", lock={"key": lambda account, amount=0: f"acct:{account % 10}"})
    def k(account: int, amount: int = 0) -> None: ...

    assert lock_for(k, (1234,)).name == "acct:4"


def test_host_scope_puts_the_host_in_the_name(app: Celery) -> None:
    @app.task(name="opts.host", lock={"key": "api", "scope": "host", "limit": 2})
    def per_host() -> None: ...

    lock = lock_for(per_host)
    assert lock.name == f"api@{socket.gethostname()}"
    assert lock.limit == 2


def test_ttl_and_namespace_come_from_settings_unless_given(app: Celery) -> None:
    app.conf.redislock_ttl = 7
    app.conf.redislock_namespace = "jobs"

    @app.task(name="opts.s1", lock="a")
    def s1() -> None: ...

    @app.task(name="opts.s2", lock={"key": "a", "ttl": 2.5, "mode": "read"})
    def s2() -> None: ...

    assert (lock_for(s1).ttl, lock_for(s1).namespace) == (7.0, "jobs")
    assert (lock_for(s2).ttl, lock_for(s2).mode) == (2.5, "read")


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("redislock_ttl", -1, "setting redislock_ttl must be a positive number of seconds"),
        ("redislock_on_conflict", "drop", "setting redislock_on_conflict must be one of"),
        ("redislock_on_backend_error", "ignore", "redislock_on_backend_error must be one of"),
        ("redislock_client", "redis://x", "setting redislock_client must be a callable"),
    ],
)
def test_bad_setting_is_named(app: Celery, setting: str, value: Any, message: str) -> None:
    app.conf[setting] = value

    @app.task(name="opts.z", lock="z")
    def z() -> None: ...

    with pytest.raises(LockConfigError, match=message):
        lock_for(z)


def test_no_redis_for_locks_is_a_clear_error() -> None:
    rabbit = install(Celery("opts", broker="amqp://guest@localhost//", set_as_current=False))

    @rabbit.task(name="opts.r", lock="r")
    def r() -> None: ...

    with pytest.raises(LockConfigError, match=r"no Redis for locks: set app\.conf\.redislock_url"):
        lock_for(r)


def test_public_names_are_exported() -> None:
    for name in ("LockedTask", "install", "lock_for", "client_for", "lock_conflict", "lock_lost"):
        assert name in celery_redislock.__all__
