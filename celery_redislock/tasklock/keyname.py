"""Lock names for task calls: one binding of the arguments, so ``f(1)`` and ``f(x=1)`` agree."""

from __future__ import annotations

import datetime
import decimal
import hashlib
import inspect
import json
import socket
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import LockConfigError
from .options import LockOptions

__all__ = ["bind_arguments", "canonical_hash", "lock_name"]


def bind_arguments(
    task: str, signature: inspect.Signature | None, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> inspect.BoundArguments | None:
    """Binds a call to the task's signature with defaults applied (``None``: no signature)."""
    if signature is None:
        return None
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise LockConfigError(f"task {task!r}: cannot derive its lock key: {exc}") from exc
    bound.apply_defaults()
    return bound


def _named(bound: inspect.BoundArguments) -> dict[str, Any]:
    """Argument name -> value; what arrived through ``**kwargs`` is flattened in."""
    out: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = bound.signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        else:
            out[name] = value
    return out


def _canonical(value: Any) -> Any:
    """A JSON-able form that is equal for equal values (sets sorted, tuples as lists)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {"__map__": sorted([_canonical(k), _canonical(v)] for k, v in value.items())}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, set | frozenset):
        return {"__set__": sorted((_canonical(v) for v in value), key=json.dumps)}
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return {"__" + type(value).__name__ + "__": value.isoformat()}
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return {"__" + type(value).__name__ + "__": str(value)}
    raise TypeError(f"cannot hash a {type(value).__name__} into a lock key")


def canonical_hash(arguments: Mapping[str, Any]) -> str:
    """A stable hash of named arguments: the same for the same values, however they were passed.

    >>> canonical_hash({"x": 1}) == canonical_hash({"x": 1})
    True
    """
    text = json.dumps(_canonical(dict(arguments)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def lock_name(
    task: str,
    options: LockOptions,
    signature: inspect.Signature | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> str:
    """The lock name a call takes: the key (template, callable or default hash), plus the host
    for ``scope="host"``."""
    bound = bind_arguments(task, signature, args, kwargs)
    key = options.key
    try:
        if isinstance(key, str):
            named = _named(bound) if bound is not None else dict(kwargs)
            name = key.format_map(named)
        elif key is not None:
            call_args = (bound.args, bound.kwargs) if bound is not None else (args, kwargs)
            name = str(key(*call_args[0], **call_args[1]))
        else:
            named = _named(bound) if bound is not None else {"args": list(args), **kwargs}
            name = f"{task}:{canonical_hash(named)}"
    except (KeyError, IndexError, AttributeError, TypeError) as exc:
        raise LockConfigError(f"task {task!r}: cannot derive its lock key: {exc!r}") from exc
    if options.scope == "host":
        name = f"{name}@{socket.gethostname()}"
    return name
