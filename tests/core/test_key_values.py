"""What users pass as data makes a valid, canonical lock name, and every duration has a finite
range: checked in process (no worker), the lock core on a real Redis where it acquires."""

from __future__ import annotations

import datetime
import decimal
import inspect
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from hypothesis import given
from hypothesis import strategies as st

from celery_redislock import (
    Heartbeat,
    Lock,
    LockConfigError,
    client_for,
    install,
    lock_for,
    renew_leases,
)
from celery_redislock.core.keys import check_name
from celery_redislock.core.naming import lock_name
from celery_redislock.core.options import LockOptions

INF, NAN = float("inf"), float("nan")
DAY = 86400


@pytest.fixture
def app() -> Iterator[Celery]:
    application = install(Celery("kv", broker="memory://", set_as_current=False))
    application.conf.redislock_url = "redis://127.0.0.1:1/0"  # never connected to here
    yield application


def from_template(template: str, value: object) -> str:
    """The lock name the template ``template`` over one argument ``v`` gives for ``value``."""
    options = LockOptions(key=template, fields=("v",))
    return lock_name("kv.t", options, None, (), {"v": value})


class User:
    """An argument type without a canonical form (its str() is its address)."""

    def __init__(self, id: int, tags: list[str] | None = None) -> None:
        self.id = id
        self.tags = tags or []


# -- defect 4: template fields come from a canonical form -----------------------------------------


def test_equal_dicts_give_one_name_whatever_their_order(app: Celery) -> None:
    @app.task(name="kv.d", lock="d:{data}")
    def d(data: dict[str, Any]) -> None: ...

    assert lock_for(d, ({"a": 1, "b": [1, 2]},)).name == lock_for(d, ({"b": [1, 2], "a": 1},)).name
    assert lock_for(d, ({"a": 1},)).name != lock_for(d, ({"a": 2},)).name


def test_equal_values_give_one_name_in_every_process(tmp_path: Path) -> None:
    # Set order (and so str() of a set) depends on the process's string hash seed.
    script = tmp_path / "name.py"
    script.write_text(
        "from celery_redislock.core.naming import lock_name\n"
        "from celery_redislock.core.options import LockOptions\n"
        "options = LockOptions(key='s:{v}', fields=('v',))\n"
        "tags = frozenset(['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta', 'eta'])\n"
        "print(lock_name('kv.s', options, None, (), {'v': tags}))\n"
        "print(lock_name('kv.s', options, None, (), {'v': {'x': tags, 'y': {1, 2, 3}}}))\n"
    )
    names = {
        subprocess.run(
            [sys.executable, str(script)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(names) == 1, names


def test_an_object_without_a_canonical_form_is_refused_naming_task_template_and_field(
    app: Celery,
) -> None:
    @app.task(name="kv.u", lock={"key": "user:{user}"})
    def u(user: User) -> None: ...

    with pytest.raises(LockConfigError) as raised:
        lock_for(u, (User(7),))
    message = str(raised.value)
    assert "task 'kv.u'" in message
    assert "'user:{user}'" in message
    assert "field {user}" in message
    assert "User" in message


def test_attribute_and_index_access_give_canonical_fields(app: Celery) -> None:
    @app.task(name="kv.a", lock="a:{user.id}:{ids[0]}:{user.tags}")
    def a(user: User, ids: list[int]) -> None: ...

    assert lock_for(a, (User(42, ["x", "y"]), [7, 8])).name == 'a:42:7:["x","y"]'
    with pytest.raises(LockConfigError, match=r"field \{user\.tags\}.*has no canonical form"):
        lock_for(a, (User(42, [User(1)]), [7]))  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("eu-west", "eu-west"),
        ("a b:c/d", "a b:c/d"),
        (42, "42"),
        (-3, "-3"),
        (True, "True"),
        (None, "None"),
        (2.5, "2.5"),
        (-0.0, "0.0"),
        (datetime.date(2026, 11, 21), "2026-11-21"),
        (
            datetime.datetime(2026, 11, 21, 10, 30, tzinfo=datetime.UTC),
            "2026-11-21 10:30:00+00:00",
        ),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        (decimal.Decimal("12.50"), "12.50"),
        ([1, "a"], '[1,"a"]'),
        ((1, "a"), '[1,"a"]'),
        ({"b": 1, "a": 2}, '%7B"__map__":[["a",2],["b",1]]%7D'),
        ({3, 1, 2}, '%7B"__set__":[1,2,3]%7D'),
        (b"hi", '%7B"__bytes__":"6869"%7D'),
    ],
)
def test_the_text_of_a_field(value: object, text: str) -> None:
    assert from_template("{v}", value) == text


def test_format_specs_apply_to_strings_and_numbers_only(app: Celery) -> None:
    assert from_template("{v:05d}", 42) == "00042"
    assert from_template("{v:.2f}", 2.5) == "2.50"
    assert from_template("{v:.3}", "abcdef") == "abc"
    assert from_template("{v:>4}", "}") == "   %7D"  # padded first, then escaped
    with pytest.raises(LockConfigError, match=r"field \{v\}: a format spec \('x'\) applies"):
        from_template("{v:x}", [1])
    with pytest.raises(LockConfigError, match=r"field \{v\}.*Unknown format code 'd'"):
        from_template("{v:d}", "abc")


def test_conversions_are_refused_when_the_task_is_declared(app: Celery) -> None:
    with pytest.raises(LockConfigError, match=r"lock option 'key': template field \{user!r\}"):

        @app.task(name="kv.r", lock="r:{user!r}")
        def r(user: User) -> None: ...

    with pytest.raises(LockConfigError, match=r"\{n:\{w\}\} in 'n:\{n:\{w\}\}': a format spec"):

        @app.task(name="kv.w", lock="n:{n:{w}}")
        def w(n: int, w: int) -> None: ...


def test_callable_keys_a_str_is_the_name_anything_else_is_canonical(app: Celery) -> None:
    @app.task(name="kv.c", lock={"key": lambda data: data})
    def c(data: Any) -> None: ...

    assert lock_for(c, ("acct:{7}",)).name == "acct:{7}"  # the function's name, as returned
    assert lock_for(c, (42,)).name == "42"
    assert lock_for(c, ({"b": 1, "a": 2},)).name == lock_for(c, ({"a": 2, "b": 1},)).name
    with pytest.raises(LockConfigError, match=r"task 'kv\.c': key function .* returned '}x'"):
        lock_for(c, ("}x",))
    with pytest.raises(LockConfigError, match=r"task 'kv\.c': key function .* returned None"):
        lock_for(c, (None,))
    with pytest.raises(LockConfigError, match=r"task 'kv\.c': key function .*User"):
        lock_for(c, (User(1),))


# -- defect 5: any string makes a valid name; template errors name the task and template --------


def test_a_string_value_starting_with_a_brace_makes_a_valid_name(app: Celery) -> None:
    @app.task(name="kv.b", lock="{name}")
    def b(name: str) -> None: ...

    names = {lock_for(b, (value,)).name for value in ("}x", "}", "%", "%7D", "%25", "", "%e")}
    assert len(names) == 7
    assert not any(n.startswith("}") or not n for n in names)


def test_an_empty_string_field_has_a_marker(app: Celery) -> None:
    @app.task(name="kv.e", lock="{a}{b}")
    def e(a: str, b: str) -> None: ...

    assert lock_for(e, ("", "")).name == "%e%e"
    assert lock_for(e, ("x", "")).name == "x%e"
    assert from_template("{v:.0}", "abc") == "%e"  # cut to nothing by its format spec


def test_a_lone_surrogate_makes_a_name_redis_can_take(app: Celery) -> None:
    name = from_template("s:{v}", "a\ud800b")
    assert name == "s:a%uD800b"
    name.encode()  # redis-py encodes names as strict UTF-8


@given(st.text(), st.text())
def test_distinct_strings_give_distinct_valid_names(a: str, b: str) -> None:
    name_a, name_b = from_template("{v}", a), from_template("{v}", b)
    assert (name_a == name_b) == (a == b)
    assert name_a and "{" not in name_a and "}" not in name_a
    name_a.encode()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((None,), "cannot fill it from the call's arguments: AttributeError"),
        ((), "cannot derive its lock key"),
    ],
)
def test_template_errors_name_the_task_and_the_template(
    app: Celery, args: tuple[Any, ...], expected: str
) -> None:
    @app.task(name="kv.t", lock="t:{user.id}")
    def t(user: User) -> None: ...

    with pytest.raises(LockConfigError) as raised:
        lock_for(t, args)
    assert "task 'kv.t'" in str(raised.value)
    assert expected in str(raised.value)
    if args:
        assert "'t:{user.id}'" in str(raised.value)


def test_a_template_that_starts_with_a_closing_brace_is_refused_when_declared(app: Celery) -> None:
    with pytest.raises(LockConfigError, match=r"lock option 'key': a lock name must not start"):

        @app.task(name="kv.rb", lock="}}{n}")
        def rb(n: int) -> None: ...


# -- defect 5: every duration has a finite range ----------------------------------------------

RANGES = {
    "ttl": "from 0.1 to 604800 (7 days)",
    "timeout": "from 0 to 86400 (1 day)",
    "countdown": "from 0.01 to 86400 (1 day)",
    "max_hold": "from 0.1 to 2592000 (30 days)",
    "allowance": "from 0.1 to 2592000 (30 days)",
}


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("ttl", INF),
        ("ttl", NAN),
        ("ttl", 1e300),
        ("ttl", 0.0005),
        ("ttl", 0.05),
        ("ttl", 7 * DAY + 1),
        ("max_hold", 1e-9),
        ("max_hold", INF),
        ("timeout", INF),
        ("timeout", NAN),
        ("timeout", DAY + 1),
        ("countdown", 0.001),
        ("countdown", INF),
        ("countdown", True),
    ],
)
def test_a_lock_option_duration_out_of_range_is_refused(
    app: Celery, option: str, value: float
) -> None:
    with pytest.raises(LockConfigError) as raised:

        @app.task(name="kv.dur", lock={"key": "k", option: value})
        def dur() -> None: ...

    assert str(raised.value) == (
        f"task 'kv.dur': lock option {option!r}: must be a number of seconds "
        f"{RANGES[option]}{' or None' if option in ('ttl', 'max_hold') else ''}, got {value!r}"
    )


@pytest.mark.parametrize("value", [INF, NAN, 1e300, 0.01, -1])
def test_a_unique_allowance_out_of_range_is_refused(app: Celery, value: float) -> None:
    with pytest.raises(LockConfigError) as raised:

        @app.task(name="kv.al", unique={"lifecycle": "until_started", "allowance": value})
        def al() -> None: ...

    assert str(raised.value) == (
        f"task 'kv.al': unique option 'allowance': must be a number of seconds "
        f"{RANGES['allowance']} or None, got {value!r}"
    )


def test_the_bounds_of_each_range_are_accepted(app: Celery) -> None:
    @app.task(
        name="kv.lo",
        lock={"key": "lo", "ttl": 0.1, "max_hold": 0.1, "timeout": 0, "countdown": 0.01},
    )
    def lo() -> None: ...

    @app.task(
        name="kv.hi",
        lock={"key": "hi", "ttl": 7 * DAY, "max_hold": 30 * DAY, "timeout": DAY, "countdown": DAY},
        unique={"lifecycle": "until_started", "allowance": 30 * DAY},
    )
    def hi() -> None: ...

    assert lock_for(lo).ttl == 0.1 and lo.lock_options.timeout == 0.0
    assert lock_for(hi).ttl == 7 * DAY and hi.unique_options.allowance == 30 * DAY


@pytest.mark.parametrize(
    ("setting", "value", "allowed"),
    [
        ("redislock_ttl", INF, RANGES["ttl"]),
        ("redislock_ttl", 1e300, RANGES["ttl"]),
        ("redislock_ttl", 0.0005, RANGES["ttl"]),
        ("redislock_queue_allowance", NAN, RANGES["allowance"]),
    ],
)
def test_a_duration_setting_out_of_range_is_named(
    app: Celery, setting: str, value: float, allowed: str
) -> None:
    @app.task(name="kv.s", lock="s")
    def s() -> None: ...

    app.conf[setting] = value
    with pytest.raises(LockConfigError) as raised:
        lock_for(s)
    assert (
        str(raised.value)
        == f"setting {setting} must be a number of seconds {allowed}, got {value!r}"
    )


@pytest.mark.parametrize("ttl", [INF, -INF, NAN, 1e300, 0.0005, "10", None])
def test_the_lock_core_refuses_a_ttl_out_of_range(ttl: Any) -> None:
    with pytest.raises(LockConfigError) as raised:
        Lock(redis.Redis(), "job", ttl=ttl)  # no connection is made
    assert str(raised.value) == f"ttl must be a number of seconds {RANGES['ttl']}, got {ttl!r}"
    assert raised.value.name == "job"


@pytest.mark.parametrize("timeout", [INF, NAN, DAY + 1, -1, "1"])
def test_the_lock_core_refuses_a_timeout_out_of_range(client: redis.Redis, timeout: Any) -> None:
    lock = Lock(client, "job", ttl=1)
    with pytest.raises(LockConfigError) as raised:
        lock.acquire(timeout=timeout)
    assert str(raised.value) == (
        f"timeout must be a number of seconds {RANGES['timeout']} or None, got {timeout!r}"
    )
    assert not lock.locked()


def test_the_lock_core_accepts_the_bounds(client: redis.Redis) -> None:
    assert Lock(client, "lo", ttl=0.1).ttl == 0.1
    lock = Lock(client, "hi", ttl=7 * DAY)
    with lock.acquire(timeout=DAY) as lease:
        assert 7 * DAY - 60 < lock.holders()[0].expires_in <= 7 * DAY
    assert lease.released
    for timeout in (0, None):
        with lock.acquire(timeout=timeout):
            pass


def test_a_malformed_redis_url_is_a_config_error_naming_the_setting(app: Celery) -> None:
    app.conf.redislock_url = "notaurl://x"
    with pytest.raises(LockConfigError, match=r"setting redislock_url .*'notaurl://x'") as raised:
        client_for(app)
    assert isinstance(raised.value.__cause__, ValueError)


def test_renewal_durations_are_checked(client: redis.Redis) -> None:
    lease = Lock(client, "renew-range", ttl=5).acquire()
    with pytest.raises(LockConfigError, match=r"ttl must be a number of seconds from 0\.1"):
        renew_leases([lease], ttl=float("inf"))
    with pytest.raises(LockConfigError, match=r"ttl must be"):
        lease.renew(1e300)
    with pytest.raises(LockConfigError, match=r"max_hold must be"):
        Heartbeat.current().register(lease, max_hold=1e-9)
    assert lease.name not in [x.name for x in Heartbeat.current().leases()]
    lease.release()


_TEMPLATE_PARTS = st.lists(
    st.one_of(
        st.sampled_from(
            ["{a}", "{b}", "{c}", "{a.real}", "{a:>4}", "{a!r}", "{0}", "{}", "{{", "}}"]
        ),
        st.text(alphabet=":-_x{}%", max_size=3),
    ),
    max_size=5,
)
_FIELD_VALUES = st.one_of(
    st.integers(),
    st.text(max_size=4),
    st.none(),
    st.floats(allow_nan=False),
    st.lists(st.integers()),
    st.builds(object),  # (no canonical form: an error)
)


@given(_TEMPLATE_PARTS, _FIELD_VALUES, _FIELD_VALUES)
def test_a_template_of_plain_fields_is_filled_as_str_format_fills_it(
    parts: list[str], a: object, b: object
) -> None:
    """A template whose fields are bare names is filled without str.format's machinery: the
    same name as str.format with the field rule gives, or the same error."""
    from celery_redislock.core import naming

    template, values = "".join(parts), {"a": a, "b": b}

    def outcome(fill: Any) -> object:
        try:
            return fill(template, values)
        except Exception as exc:  # (compared, not handled)
            return (type(exc), str(exc))

    assert outcome(naming._fill) == outcome(lambda t, v: naming._formatter.vformat(t, (), v))


def _p3(a: int, b: int = 2, c: str = "c") -> None: ...


def _p0() -> None: ...


def _star(a: int, *rest: int, b: int = 1) -> None: ...


def _kw(a: int, **more: int) -> None: ...


_SIGNATURES = [inspect.signature(f) for f in (_p3, _p0, _star, _kw)]
_NAMES = st.sampled_from(["a", "b", "c", "d", "rest", "more"])


@given(
    st.sampled_from(_SIGNATURES),
    st.lists(st.integers(0, 9), max_size=4),
    st.dictionaries(_NAMES, st.integers(0, 9), max_size=3),
)
def test_a_plain_call_is_bound_at_once_as_inspect_binds_it(
    signature: inspect.Signature, args: list[int], kwargs: dict[str, int]
) -> None:
    """A call to a signature of plain parameters binds without inspect's general binding (a
    delivery's hot path): to the same names and values where it binds at all; any other call,
    or any other signature, takes the full binding (which says what is wrong)."""
    from celery_redislock.core import naming

    quick = naming._named_at_once(signature, args, kwargs)
    try:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        full: dict[str, object] | None = naming._named(bound)
    except TypeError:
        full = None
    plain = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in signature.parameters.values())
    assert quick == (full if plain else None)


def test_the_plain_signatures_kept_stay_bounded() -> None:
    """A producer reads the spec of a task it cannot import again now and then, each time with
    a new signature: what the quick binding keeps of them never grows without bound."""
    from celery_redislock.core import naming

    for _ in range(naming._PLAIN_KEPT + 10):
        signature = inspect.signature(_p3).replace()  # (a new, equal signature)
        assert naming._named_at_once(signature, (1,), {}) == {"a": 1, "b": 2, "c": "c"}
    assert len(naming._PLAIN_PARAMETERS) <= naming._PLAIN_KEPT


# -- lock=True: names an operator can read --------------------------------------------------------


def default_name(signature: inspect.Signature, *args: Any, **kwargs: Any) -> str:
    """The name ``lock=True`` (no key) gives a call of task ``kv.d`` with ``signature``."""
    return lock_name("kv.d", LockOptions(), signature, args, kwargs)


def _sync(customer_id: int, full: bool = False, **extra: Any) -> None: ...


SYNC = inspect.signature(_sync)


def test_a_default_name_shows_short_printable_arguments(app: Celery) -> None:
    @app.task(name="proj.sync", lock=True)
    def sync(customer_id: int, full: bool = False, **extra: Any) -> None: ...

    @app.task(name="proj.nightly_report", lock=True)
    def nightly_report() -> None: ...

    assert lock_for(sync, (42,)).name == "proj.sync:customer_id=42,full=False"
    assert lock_for(sync, (), {"customer_id": 42, "full": False}).name == lock_for(sync, (42,)).name
    assert lock_for(nightly_report).name == "proj.nightly_report"
    # **extra's entries by name, whatever their order in the call.
    assert default_name(SYNC, 7, b="x", a=None) == "kv.d:customer_id=7,full=False,a=None,b=x"
    assert default_name(SYNC, 7, b="x", a=None) == default_name(SYNC, 7, a=None, b="x")
    assert default_name(SYNC, "cus_A-1.b@x/y+z~", True) == (
        "kv.d:customer_id=cus_A-1.b@x/y+z~,full=True"
    )


HASHED = [
    "x" * 60,  # the whole part past 64 characters
    "",  # no text to show
    "42",  # would read as the int 42
    "None",
    "True",
    "-7",
    "a b",  # separators, glob and hash-tag characters, escapes, non-ASCII
    "a,b",
    "a=b",
    "a:b",
    "sync*",
    "{tag}",
    "50%",
    "caf\u00e9",
    "line\n",
    1.5,  # values that are not str, int, bool or None
    [1],
    {"a": 1},
    datetime.date(2026, 11, 28),
]


@pytest.mark.parametrize("value", HASHED, ids=repr)
def test_a_default_name_falls_back_to_the_hash(value: object) -> None:
    name = default_name(SYNC, value)
    assert re.fullmatch(r"kv\.d:[0-9a-f]{24}", name), name
    assert name == default_name(SYNC, customer_id=value)


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.text())


def _typed(value: object) -> tuple[str, object]:
    # True == 1 in Python, yet they are two values to a lock name.
    return (type(value).__name__, value)


@given(_SCALARS, _SCALARS, _SCALARS, _SCALARS)
def test_default_names_are_equal_exactly_for_equal_arguments(
    a: object, b: object, c: object, d: object
) -> None:
    first, second = default_name(SYNC, a, b=b), default_name(SYNC, c, b=d)
    assert (first == second) == ((_typed(a), _typed(b)) == (_typed(c), _typed(d)))
    assert "{" not in first and "}" not in first and check_name(first) == first
    first.encode()
    assert len(first) <= len("kv.d:") + 64


def test_default_names_are_equal_in_every_process(tmp_path: Path) -> None:
    script = tmp_path / "name.py"
    script.write_text(
        "import inspect\n"
        "from celery_redislock.core.naming import lock_name\n"
        "from celery_redislock.core.options import LockOptions\n"
        "def f(a, **kw): ...\n"
        "s = inspect.signature(f)\n"
        "print(lock_name('kv.d', LockOptions(), s, (1,), dict(z=1, y='b', x=None, w=True)))\n"
        "print(lock_name('kv.d', LockOptions(), s, (1,), dict(w=True, x=None, y='b', z=1)))\n"
    )
    outputs = {
        subprocess.run(
            [sys.executable, str(script)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert outputs == {"kv.d:a=1,w=True,x=None,y=b,z=1\n" * 2}
