"""The unique= option and the producer's side, in process, on a real Redis (no worker needed:
what is or is not published is visible in the broker's queue)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from celery_redislock import DuplicateTask, LockBackendError, LockConfigError, install
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.keys import LockKeys, registry_key
from celery_redislock.integrations.celery.registry import Spec, publish_specs, spec_of


@pytest.fixture
def app(celery_server: RedisServer) -> Iterator[Celery]:
    application = install(
        Celery("uq", broker=celery_server.url, backend=celery_server.url, set_as_current=False)
    )
    application.conf.redislock_url = celery_server.url
    redis.Redis.from_url(celery_server.url).flushall()
    yield application
    redis.Redis.from_url(celery_server.url).flushall()


def queued(app: Celery) -> int:
    return int(redis.Redis.from_url(app.conf.broker_url).llen("celery"))


@pytest.mark.parametrize(
    ("unique", "lock", "message"),
    [
        ("until_done", None, "unique option 'lifecycle': must be one of 'until_started', "),
        ({"lifecycle": "until_started", "on_dup": "x"}, None, "unknown unique option(s) 'on_dup'"),
        ({"on_duplicate": "skip"}, None, "'on_duplicate': must be one of 'existing', 'raise'"),
        ({"allowance": 0}, None, "unique option 'allowance': must be a number of seconds from"),
        ({"key": "x:{nope}"}, None, "unique option 'key': template names argument(s) 'nope'"),
        ({"scope": "rack"}, None, "unique option 'scope': must be one of 'global', 'host'"),
        (
            {"lifecycle": "until_finished", "key": "other:{n}"},
            "k:{n}",
            "lifecycle 'until_finished' holds the task's lock= while it runs, so the key comes "
            "from lock=",
        ),
        (
            "until_and_while_running",
            {"key": "k:{n}", "limit": 3},
            "needs an exclusive lock= (mode 'write', no limit), got mode 'write', limit 3",
        ),
        (["until_started"], None, "unique must be a lifecycle (until_started, until_finished"),
        (
            "once_per_period",
            None,
            "unique option 'period': lifecycle 'once_per_period' needs a period: the seconds",
        ),
        (
            {"lifecycle": "once_per_period", "period": -1},
            None,
            "unique option 'period': must be a number of seconds from 0.1 to 31536000",
        ),
        (
            {"lifecycle": "until_started", "period": 60},
            None,
            "unique option 'period': only lifecycles 'once_per_period' and 'debounce' take a "
            "period, not 'until_started'",
        ),
        (
            {"lifecycle": "debounce", "period": 5, "max_wait": 2},
            None,
            "unique option 'max_wait': 2s is shorter than the period (5s): a debounced call "
            "would be published before it was ever quiet",
        ),
        (
            {"lifecycle": "debounce"},
            None,
            "unique option 'period': lifecycle 'debounce' needs a period: the quiet seconds",
        ),
        (
            {"lifecycle": "until_finished", "max_wait": 5},
            None,
            "unique option 'max_wait': only lifecycle 'debounce' takes a max_wait",
        ),
        (
            {"lifecycle": "debounce", "period": 5, "on_duplicate": "raise"},
            None,
            "lifecycle 'debounce' folds every call into the pending one",
        ),
        (
            {"lifecycle": "keep_last", "on_duplicate": "existing"},
            None,
            "lifecycle 'keep_last' replaces the pending call with the latest (on_duplicate "
            "'replace'), got 'existing'",
        ),
        (
            "keep_last",
            {"key": "k:{n}", "on_conflict": "skip"},
            "unique lifecycle 'keep_last' needs its lock= to wait its turn (on_conflict one of "
            "queue, retry, wait), got 'skip': the pending call would be lost",
        ),
        (
            {"lifecycle": "until_started", "on_duplicate": "cancel"},
            None,
            "'on_duplicate': 'cancel' stops a running copy, which only lifecycle "
            "'until_finished' counts as a duplicate; got lifecycle 'until_started'",
        ),
    ],
)
def test_bad_unique_option_is_refused_when_declared(
    app: Celery, unique: Any, lock: Any, message: str
) -> None:
    with pytest.raises(LockConfigError) as raised:

        @app.task(shared=False, name="uq.f", unique=unique, lock=lock)
        def f(n: int) -> None: ...

    assert message in str(raised.value)


def test_cancel_on_a_pool_that_cannot_terminate_is_refused(app: Celery) -> None:
    """When declared, against the configured pool; as a worker starts, against its own."""
    from celery.concurrency.thread import TaskPool

    from celery_redislock.integrations.celery.receivers import check_worker_app

    app.conf.worker_pool = "solo"
    with pytest.raises(LockConfigError, match=r"uq\.f: .*worker pool 'solo' cannot do"):

        @app.task(shared=False, name="uq.f", unique={"on_duplicate": "cancel"})
        def f(n: int) -> None: ...

    app.conf.worker_pool = "prefork"

    @app.task(shared=False, name="uq.g", unique={"on_duplicate": "cancel"})
    def g(n: int) -> None: ...

    check_worker_app(app, None)  # prefork terminates
    with pytest.raises(LockConfigError, match=r"uq\.g: .*'celery\.concurrency\.thread\.TaskPool'"):
        check_worker_app(app, TaskPool)


def test_unique_on_a_task_that_is_not_locked_is_refused() -> None:
    plain = Celery("plain", broker="memory://", set_as_current=False)

    @plain.task(shared=False, name="plain.f", unique="until_started")
    def f() -> None: ...

    plain.finalize()
    # (Shared tasks that other tests of this process declared join the app too, and are named
    # beside it.)
    with pytest.raises(LockConfigError, match=r"\bplain\.f\b.* declares? lock=, unique= or rate="):
        install(plain)


def test_lifecycles_imply_the_run_lock_on_the_same_key(app: Celery) -> None:
    @app.task(shared=False, name="uq.a", unique={"lifecycle": "until_finished", "key": "a:{n}"})
    def a(n: int) -> None: ...

    @app.task(
        shared=False, name="uq.b", unique={"lifecycle": "until_and_while_running", "key": "b:{n}"}
    )
    def b(n: int) -> None: ...

    @app.task(shared=False, name="uq.c", unique="until_started", lock={"key": "api", "limit": 5})
    def c(n: int) -> None: ...

    assert a.lock_options.key == "a:{n}" and a.lock_options.on_conflict is None
    assert b.lock_options.on_conflict == "retry"  # a queued copy waits for the running one
    assert c.lock_options.limit == 5 and c.unique_options.keying.key == "api"

    @app.task(shared=False, name="uq.d", unique="keep_last")
    def d(n: int) -> None: ...

    @app.task(shared=False, name="uq.e", unique={"lifecycle": "once_per_period", "period": 60})
    def e(n: int) -> None: ...

    # keep_last's pending call waits in the task line; once_per_period keeps no run apart.
    assert d.lock_options.on_conflict == "queue" and d.unique_options.on_duplicate == "replace"
    assert e.lock_options is None and e.unique_options.kept_after_start == 60


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("redislock_on_duplicate", "drop", "setting redislock_on_duplicate must be one of"),
        ("redislock_queue_allowance", -5, "redislock_queue_allowance must be a number of seconds"),
    ],
)
def test_bad_setting_is_named_at_the_first_publish(
    app: Celery, setting: str, value: Any, message: str
) -> None:
    @app.task(shared=False, name="uq.s", unique="until_started")
    def s() -> None: ...

    app.conf[setting] = value
    with pytest.raises(LockConfigError, match=message):
        s.delay()
    assert queued(app) == 0


def test_raise_carries_the_queued_id_and_time_left(app: Celery) -> None:
    @app.task(
        shared=False, name="uq.r", unique={"lifecycle": "until_started", "on_duplicate": "raise"}
    )
    def r(n: int) -> None: ...

    first = r.apply_async((1,), countdown=30)
    with pytest.raises(DuplicateTask) as raised:
        r.delay(n=1)  # the same call, however it is spelled
    err = raised.value
    assert err.task_id == first.id and err.state == "queued"
    assert 600 < err.expires_in <= 630  # countdown + the default allowance of 600 s
    # The key of r(1): the task name and its bound arguments (the default key), and the very
    # key whose claim names the queued copy.
    assert err.name == "uq.r:n=1" and first.id in str(err)
    client = redis.Redis.from_url(app.conf.redislock_url)
    assert client.get(LockKeys.of("redislock", err.name).queued) == first.id.encode()
    assert queued(app) == 1


def test_the_app_default_and_an_explicit_task_id(app: Celery) -> None:
    @app.task(shared=False, name="uq.d", unique="until_started")
    def d() -> None: ...

    app.conf.redislock_on_duplicate = "raise"
    d.apply_async(task_id="fixed-id")
    assert queued(app) == 1
    # The id that holds the key is no duplicate of itself: the same job, published again.
    d.apply_async(task_id="fixed-id")
    assert queued(app) == 2
    with pytest.raises(DuplicateTask) as raised:  # another id: the app's default, "raise"
        d.delay()
    assert raised.value.task_id == "fixed-id"
    assert queued(app) == 2


def test_an_expired_message_claims_nothing(app: Celery) -> None:
    import datetime

    @app.task(shared=False, name="uq.e", unique="until_started")
    def e() -> None: ...

    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=5)
    ids = {e.apply_async(expires=past).id for _ in range(2)}
    assert len(ids) == 2  # the worker discards both; nothing to be unique about


def test_redis_down_at_enqueue_follows_the_backend_policy(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(shared=False, name="uq.down", unique="until_started")
    def down() -> None: ...

    app.conf.redislock_url = "redis://127.0.0.1:1/0"
    with (
        caplog.at_level(logging.DEBUG, "celery_redislock"),
        pytest.raises(LockBackendError) as raised,
    ):
        down.delay()
    assert raised.value.name == "uq.down"  # the key of down(): no argument to show
    # Issue 24, item 5: the error is the news; the give-up that failed with it (Redis is
    # unreachable) is not a warning before it.
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name.startswith("celery_")]
    assert [m for level, m in said if level >= logging.WARNING] == []
    assert [level for level, m in said if "could not give up the claim" in m] == [logging.DEBUG]
    caplog.clear()
    assert queued(app) == 0
    app.conf.redislock_on_backend_error = "run"
    with caplog.at_level(logging.ERROR, "celery_redislock"):
        down.delay()
    assert queued(app) == 1
    assert "published WITHOUT unique key" in caplog.text


def test_a_producer_that_cannot_import_the_task_reads_its_spec(
    app: Celery, celery_server: RedisServer
) -> None:
    @app.task(
        shared=False, name="uq.remote", unique={"lifecycle": "until_finished", "key": "rep:{day}"}
    )
    def remote(day: str, full: bool = False) -> None: ...

    publish_specs(app)  # what a worker does as it starts
    other = install(Celery("other", broker=celery_server.url, set_as_current=False))
    other.conf.redislock_url = celery_server.url
    first = other.send_task("uq.remote", ("mon",))
    assert other.send_task("uq.remote", kwargs={"day": "mon", "full": True}).id == first.id
    assert remote.delay("mon").id == first.id
    assert other.send_task("uq.remote", ("tue",)).id != first.id
    assert queued(app) == 2


def test_spec_round_trip_and_callable_keys(app: Celery, caplog: pytest.LogCaptureFixture) -> None:
    @app.task(
        shared=False,
        name="uq.cb",
        unique={"lifecycle": "until_started", "key": lambda n, scale: f"cb:{n}"},
    )
    def cb(n: int, scale: float = 1.5) -> None: ...

    spec = spec_of(cb)
    assert spec is not None
    back = Spec.from_json("uq.cb", spec.to_json())
    assert back is not None and not back.derivable
    params = [(p.name, p.kind, p.default) for p in cb.call_signature.parameters.values()]
    assert back.signature is not None
    assert [(p.name, p.kind, p.default) for p in back.signature.parameters.values()] == params
    assert Spec.from_json("uq.cb", '{"lifecycle": "until_lunch"}') is None
    publish_specs(app)
    raw = redis.Redis.from_url(app.conf.broker_url).hget(registry_key("redislock"), "uq.cb")
    assert raw is not None
    other = install(Celery("other", broker=app.conf.broker_url, set_as_current=False))
    other.conf.redislock_url = app.conf.broker_url
    with caplog.at_level(logging.WARNING, "celery_redislock"):
        other.send_task("uq.cb", (1,))
    assert "its unique key is a callable this process cannot import" in caplog.text


def test_task_cls_alone_is_enough(celery_server: RedisServer) -> None:
    from celery_redislock import LockedTask

    bare = Celery("bare", broker=celery_server.url, set_as_current=False, task_cls=LockedTask)
    bare.conf.redislock_url = celery_server.url

    @bare.task(shared=False, name="bare.t", unique="until_started")
    def t(n: int) -> None: ...

    assert t.delay(1).id == t.delay(n=1).id  # binding the task wrapped the app's send_task
    assert bare.send_task("bare.t", (1,)).id == t.delay(1).id


def test_eager_calls_are_not_unique(app: Celery) -> None:
    @app.task(shared=False, name="uq.eager", unique="until_finished")
    def eager() -> int:
        return 1

    queued_copy = eager.delay()
    app.conf.task_always_eager = True
    assert eager.delay().get() == 1 and eager.delay().get() == 1  # not checked, not skipped
    assert eager.apply().get() == 1
    app.conf.task_always_eager = False
    assert eager.delay().id == queued_copy.id


def test_equal_dict_arguments_in_another_order_are_one_call(app: Celery) -> None:
    @app.task(
        shared=False, name="uq.dict", unique={"lifecycle": "until_started", "key": "q:{filters}"}
    )
    def search(filters: dict[str, Any]) -> None: ...

    first = search.delay({"region": "eu", "tiers": [1, 2]})
    assert search.delay({"tiers": [1, 2], "region": "eu"}).id == first.id
    assert search.delay({"region": "us", "tiers": [1, 2]}).id != first.id
    assert queued(app) == 2


def test_a_string_argument_starting_with_a_brace_can_be_published(app: Celery) -> None:
    @app.task(shared=False, name="uq.brace", unique={"lifecycle": "until_started", "key": "{n}"})
    def brace(n: str) -> None: ...

    first = brace.delay("}x")
    assert brace.delay("}x").id == first.id
    assert brace.delay("%7Dx").id != first.id
    assert queued(app) == 2


def test_an_absurd_countdown_is_not_blamed_on_redis(app: Celery) -> None:
    """countdown=1e300 is Celery's to refuse; the claim must not reach Redis as a number it
    cannot take (a LockBackendError blaming Redis), and nothing stays claimed."""

    @app.task(shared=False, name="uq.far", unique="until_started")
    def far() -> None: ...

    with pytest.raises(Exception) as raised:
        far.apply_async(countdown=1e300)
    assert not isinstance(raised.value, LockBackendError), raised.value
    assert queued(app) == 0
    assert far.delay().id  # the key is free: a plain call publishes
