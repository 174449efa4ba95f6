"""The lock= option: checked when the task is declared; keys derived from the bound call."""

from __future__ import annotations

import datetime
import importlib
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, Task
from workers import TESTS, Worker

from celery_redislock import (
    DuplicateTask,
    LockConfigError,
    LockedTask,
    TaskSkipped,
    install,
    lock_for,
)
from celery_redislock.contrib.redis_server import RedisServer


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
        (
            {"ttl": 0},
            "lock option 'ttl': must be a number of seconds from 0.1 to 604800 (7 days) or None, "
            "got 0",
        ),
        (
            {"timeout": -1},
            "lock option 'timeout': must be a number of seconds from 0 to 86400 (1 day), got -1",
        ),
        ({"countdown": "2"}, "lock option 'countdown': must be a number of seconds from 0.01"),
        ({"max_retries": -1}, "lock option 'max_retries': must be an integer >= 0 or None"),
        ({"count_retries": 1}, "lock option 'count_retries': must be True or False, got 1"),
        (["key"], "task 'opts.f': lock as a list takes two or more locks, got 1"),
        (7, "task 'opts.f': lock must be True, a key template string, a list or a dict of options"),
        # tenants in the task line
        (
            {"tenant": "{customer_id}"},
            "task 'opts.f': lock option 'tenant': applies to on_conflict='queue' only (the "
            "parked tasks of the task line take turns by tenant), but on_conflict is None",
        ),
        (
            {"on_conflict": "skip", "tenant": "{customer_id}"},
            "lock option 'tenant': applies to on_conflict='queue' only",
        ),
        (
            {"on_conflict": "queue", "tenant": "{account}"},
            "task 'opts.f': lock option 'tenant': template names argument(s) 'account' that the "
            "task does not take; its arguments are: customer_id, full",
        ),
        (
            {"on_conflict": "queue", "tenant": "{customer_id!r}"},
            "lock option 'tenant': template field {customer_id!r} in '{customer_id!r}': "
            "conversions are not allowed",
        ),
        ({"on_conflict": "queue", "tenant": ""}, "lock option 'tenant': must not be empty"),
        (
            {"on_conflict": "queue", "tenant": 42},
            "lock option 'tenant': must be a template string over the task's arguments "
            "(e.g. '{account}') or a callable taking them, got int",
        ),
        (
            {"on_conflict": "queue", "priority": 1},
            "task 'opts.f': lock option 'priority': orders the parked tasks of one tenant, so it "
            "needs the option 'tenant'",
        ),
        (
            {"on_conflict": "queue", "tenant": "{customer_id}", "priority": "high"},
            "lock option 'priority': must be an int from -2147483648 to 2147483647 (higher "
            "first) or a callable taking the task's arguments and returning one, got 'high'",
        ),
        (
            {"on_conflict": "queue", "tenant": "{customer_id}", "priority": True},
            "lock option 'priority': must be an int",
        ),
        (
            {"on_conflict": "queue", "tenant": "{customer_id}", "priority": 2**31},
            "lock option 'priority': must be an int from -2147483648 to 2147483647",
        ),
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
    with pytest.raises(LockConfigError, match=r"opts\.h declares? lock=, unique= or rate=, but"):
        install(plain)


def test_lock_with_a_base_that_is_not_locked_is_refused(app: Celery) -> None:
    with pytest.raises(LockConfigError, match="lock=, unique= and rate= need a base class"):

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
        ("redislock_ttl", -1, "setting redislock_ttl must be a number of seconds from 0.1"),
        ("redislock_namespace", "a{b", "setting redislock_namespace: namespace must be"),
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


def test_each_call_gets_its_own_lock_with_the_tasks_current_settings() -> None:
    # A task's locks are made from its first one (its settings checked once): each must still
    # carry its own name and keys, and a changed setting must reach the next one.
    app = install(Celery("kfp", broker="memory://", set_as_current=False))
    app.conf.redislock_url = "redis://127.0.0.1:1/0"  # never connected to here

    @app.task(name="kfp.t", lock={"key": "k:{n}", "mode": "read", "limit": 3})
    def t(n: int) -> None: ...

    first, second = lock_for(t, (1,)), lock_for(t, (2,))
    assert (first.name, second.name) == ("k:1", "k:2")
    assert first.keys != second.keys and first.encoded_keys != second.encoded_keys
    assert [k.encode() for k in second.keys.all] == second.encoded_keys
    assert (second.mode, second.limit, second.ttl) == ("read", 3, first.ttl)
    assert second._entered is not first._entered
    app.conf.redislock_ttl = first.ttl + 7
    third = lock_for(t, (3,))
    assert (third.name, third.ttl) == ("k:3", first.ttl + 7)
    app.conf.redislock_namespace = "other"
    assert lock_for(t, (4,)).keys.leases.startswith("other:")


def test_no_redis_for_locks_is_a_clear_error() -> None:
    rabbit = install(Celery("opts", broker="amqp://guest@localhost//", set_as_current=False))

    @rabbit.task(name="opts.r", lock="r")
    def r() -> None: ...

    with pytest.raises(LockConfigError, match=r"no Redis for locks: set app\.conf\.redislock_url"):
        lock_for(r)


# -- a worker refuses to start with a configuration mistake ------------------------------------

PLAIN_APP = """
import os
from celery import Celery, Task
from celery_redislock import install

app = install(Celery("plainapp", broker=os.environ["LOCKAPP_REDIS_URL"]))

class Forgotten(Task):  # Celery's own base: its lock= would be ignored
    name = "plainapp.forgotten"
    lock = True

    def run(self) -> None: ...

app.register_task(Forgotten())
"""


TASK_CLS_APP = """
import os
from celery import Celery

app = Celery(
    "clsapp", broker=os.environ["LOCKAPP_REDIS_URL"], task_cls="celery_redislock:LockedTask"
)
app.conf.redislock_url = os.environ["LOCKAPP_REDIS_URL"]
app.conf.redislock_ttl = float(os.environ["CLSAPP_TTL"])

@app.task(lock="k")
def k() -> None: ...
"""


def refused_to_start(worker: Worker) -> str:
    """Starts ``worker``, which must exit with status 1 before it is ready; returns its log."""
    try:
        with pytest.raises(AssertionError, match="did not start"):
            worker.start(timeout=60)  # (liveness only)
    finally:
        worker.kill()
    # Status 1: it exited by itself (one still starting at the deadline is killed, -9).
    assert worker.proc is not None and worker.proc.returncode == 1, worker.log()
    return worker.log()


def test_a_worker_with_a_malformed_redislock_url_refuses_to_start(
    celery_server: RedisServer, tmp_path: Path
) -> None:
    log = refused_to_start(
        Worker(celery_server.url, tmp_path, env={"LOCKAPP_LOCK_URL": "notaurl://x"})
    )
    assert "the worker refuses to start: setting redislock_url 'notaurl://x'" in log


def test_a_worker_of_a_task_cls_app_with_a_bad_setting_refuses_to_start(
    celery_server: RedisServer, tmp_path: Path
) -> None:
    (tmp_path / "clsapp.py").write_text(TASK_CLS_APP)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS)]), "CLSAPP_TTL": "inf"}
    log = refused_to_start(Worker(celery_server.url, tmp_path, app="clsapp", env=env))
    assert "setting redislock_ttl must be a number of seconds from 0.1" in log


def test_a_worker_with_a_lock_on_a_plain_task_refuses_to_start(
    celery_server: RedisServer, tmp_path: Path
) -> None:
    (tmp_path / "plainapp.py").write_text(PLAIN_APP)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS)])}
    log = refused_to_start(Worker(celery_server.url, tmp_path, app="plainapp", env=env))
    assert "task plainapp.forgotten declares lock=, unique= or rate=, but" in log


def test_a_worker_with_good_settings_starts(celery_server: RedisServer, tmp_path: Path) -> None:
    (tmp_path / "clsapp.py").write_text(TASK_CLS_APP)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS)]), "CLSAPP_TTL": "15"}
    worker = Worker(celery_server.url, tmp_path, app="clsapp", env=env)
    try:
        worker.start(timeout=60)
    finally:
        worker.kill()


def test_worker_start_checks_in_process(app: Celery, caplog: pytest.LogCaptureFixture) -> None:
    from celery_redislock.integrations.celery.receivers import check_worker_app

    @app.task(shared=False, name="opts.w", lock="w")
    def w() -> None: ...

    app.conf.redislock_tll = 60  # a typo: named, not fatal
    with caplog.at_level(logging.WARNING, "celery_redislock"):
        check_worker_app(app)  # the client is made; nothing connects
    assert "setting redislock_tll is not one of celery_redislock's" in caplog.text
    app.conf.redislock_client = lambda: "redis://localhost"
    with pytest.raises(LockConfigError, match=r"redislock_client must return a redis\.Redis"):
        check_worker_app(app)
    app.conf.redislock_client = None
    app.conf.redislock_url = "redis://localhost:notaport"
    with pytest.raises(LockConfigError, match="setting redislock_url 'redis://localhost:notaport'"):
        check_worker_app(app)


def test_worker_start_leaves_apps_without_locks_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    installing = importlib.import_module("celery_redislock.integrations.celery.receivers")
    # (shared tasks other tests declared with lock= would be flagged in any plain app)
    monkeypatch.setattr(installing, "check_tasks", lambda app: None)
    other = Celery("other", broker="memory://", set_as_current=False)
    other.conf.redislock_url = "notaurl://x"  # not this package's app: not its business

    @other.task(shared=False, name="other.t")
    def t() -> None: ...

    other.finalize()
    for name in [n for n, task in other.tasks.items() if isinstance(task, LockedTask)]:
        del other.tasks[name]  # shared tasks other test modules declared with LockedTask
    installing.check_worker_app(other)


def test_a_worker_refuses_the_task_line_over_redlock_masters(app: Celery) -> None:
    from celery_redislock.integrations.celery.receivers import check_worker_app

    @app.task(name="opts.line", lock={"key": "l", "on_conflict": "queue"})
    def parks() -> None: ...

    check_worker_app(app)  # one Redis: fine
    app.conf.redislock_redlock_urls = [f"redis://127.0.0.1:{p}/0" for p in (1, 2, 3)]
    with pytest.raises(LockConfigError, match="not available over RedLock masters"):
        check_worker_app(app)


def test_max_wait_with_another_action_is_refused(app: Celery) -> None:
    with pytest.raises(LockConfigError, match="applies to on_conflict='queue' only"):

        @app.task(name="opts.mw", lock={"key": "l", "on_conflict": "skip", "max_wait": 5})
        def mw() -> None: ...

    with pytest.raises(LockConfigError, match="max_wait"):

        @app.task(name="opts.mw2", lock={"key": "l", "on_conflict": "queue", "max_wait": 0.5})
        def mw2() -> None: ...


def test_skips_and_workflow_duplicates_are_expected_errors_beside_the_task_s_own(
    app: Celery,
) -> None:
    """Celery logs an error in ``throws`` at INFO, without a traceback: ours are added to what
    a task declares, never in its place."""

    @app.task(lock="t:{n}", throws=(KeyError,))
    def own(n: int) -> None: ...

    @app.task(lock="u:{n}")
    def plain(n: int) -> None: ...

    assert own.throws == (KeyError, TaskSkipped, DuplicateTask)
    assert plain.throws == (TaskSkipped, DuplicateTask)
