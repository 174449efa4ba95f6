"""The lock name of a template whose fields are plain argument names is filled by a fast path:
it must give exactly the general path's name, and leave every refusal (and its words) to it."""

from __future__ import annotations

import inspect
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from celery_redislock import LockConfigError
from celery_redislock.core import naming
from celery_redislock.core.naming import lock_name
from celery_redislock.core.options import LockOptions

PARAMS = ("a", "b", "c")

values = st.one_of(
    st.integers(),
    st.text(max_size=5),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.builds(object),  # no canonical form: refused
)
literals = st.text(alphabet="x:{}%-", max_size=4).map(
    lambda t: t.replace("{", "{{").replace("}", "}}")
)
fields = st.tuples(
    st.sampled_from([*PARAMS, *PARAMS, "zz"]),  # zz: not an argument
    st.sampled_from(["", "", "", ":05d", ":.3", ":>4", ":x"]),
)


@st.composite
def templates(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.tuples(literals, fields), min_size=1, max_size=3))
    tail = draw(literals)
    return "".join(f"{lit}{{{name}{spec}}}" for lit, (name, spec) in parts) + tail


@st.composite
def signatures(draw: st.DrawFn) -> inspect.Signature:
    count = draw(st.integers(min_value=1, max_value=len(PARAMS)))
    first_default = draw(st.integers(min_value=0, max_value=count))
    params = [
        inspect.Parameter(
            name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            **({"default": draw(values)} if i >= first_default else {}),
        )
        for i, name in enumerate(PARAMS[:count])
    ]
    return inspect.Signature(params)


@st.composite
def calls(draw: st.DrawFn, signature: inspect.Signature) -> tuple[tuple[Any, ...], dict[str, Any]]:
    names = list(signature.parameters)
    given_names = [n for n in names if draw(st.booleans()) or draw(st.booleans())]
    positional = draw(st.integers(min_value=0, max_value=len(given_names)))
    # Positional arguments fill the first parameters in order; the rest go by keyword.
    args = tuple(draw(values) for _ in range(min(positional, len(names))))
    kwargs = {n: draw(values) for n in names[len(args) :] if n in given_names}
    extra = draw(st.sampled_from(["none"] * 5 + ["unknown", "twice", "too many"]))
    if extra == "unknown":
        kwargs["zz"] = draw(values)
    elif extra == "twice" and args:
        kwargs[names[0]] = draw(values)
    elif extra == "too many":
        args = (*args, *[draw(values) for _ in range(len(names) - len(args) + 1)])
    return args, kwargs


def _outcome(task: str, key: str, signature: inspect.Signature, args: Any, kwargs: Any) -> str:
    try:
        return "name " + lock_name(task, LockOptions(key=key), signature, args, kwargs)
    except LockConfigError as exc:
        return f"refused {exc}"


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_the_fast_path_gives_the_general_paths_name_or_refusal(data: st.DataObject) -> None:
    key = data.draw(templates())
    signature = data.draw(signatures())
    args, kwargs = data.draw(calls(signature))
    fast = _outcome("t", key, signature, args, kwargs)
    with mock.patch.object(naming, "_fast_name", lambda *a: None):
        general = _outcome("t", key, signature, args, kwargs)
    assert fast == general


def test_the_fast_path_fills_plain_templates_and_leaves_the_rest() -> None:
    def task(customer: int, region: str = "eu") -> None: ...

    signature = inspect.signature(task)
    assert naming._fast_name("sync:{customer}:{region}", signature, (42,), {}) == "sync:42:eu"
    assert naming._fast_name("{customer:05d}", signature, (), {"customer": 7}) == "00007"
    # Attribute or index access, conversions, positional fields: the general path's.
    for template in ("{customer.real}", "{region[0]}", "{customer!r}", "{0}", "{}", "{a"):
        assert naming._fast_name(template, signature, (42,), {}) is None
    # A call binding refuses: the general path words the error.
    assert naming._fast_name("{customer}", signature, (), {}) is None
    assert naming._fast_name("{region}", signature, (), {"region": "us"}) is None
    assert naming._fast_name("{customer}", signature, (1,), {"customer": 2}) is None
    assert naming._fast_name("{customer}", signature, (1,), {"other": 2}) is None

    def varargs(*ids: int, **extra: Any) -> None: ...

    assert naming._fast_name("{ids}", inspect.signature(varargs), (1, 2), {}) is None


def test_each_call_gets_its_own_lock_with_the_tasks_current_settings() -> None:
    # A task's locks are made from its first one (its settings checked once): each must still
    # carry its own name and keys, and a changed setting must reach the next one.
    from celery import Celery

    from celery_redislock import install, lock_for

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
