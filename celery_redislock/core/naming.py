"""Lock names for task calls: one binding of the arguments, so ``f(1)`` and ``f(x=1)`` agree.

The rule (docs/celery.md, "How arguments make a lock name"): no key gives the task name and
all bound arguments as ``name=value`` when each is a short printable scalar (see
:func:`readable_arguments`), else a hash of them; a template writes each field from its value
by :func:`field_text` (equal values, equal names in every process; ``%``, ``{``, ``}``, lone
surrogates escaped, the empty string ``%e``); a key function's ``str`` is the name as is,
``None`` is refused (a function that forgot to ``return``), anything else follows the template
rule.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import hashlib
import inspect
import json
import re
import socket
import string
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..errors import LockConfigError
from .keys import check_name
from .options import KeyFunction, LockOptions
from .protocol import PRIORITIES

__all__ = [
    "READABLE_MAX",
    "bind_arguments",
    "canonical_hash",
    "field_text",
    "lock_name",
    "readable_arguments",
    "tenant_of",
]


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


# Signatures whose parameters are all plain (positional or keyword, none ``*args``,
# ``**kwargs``, positional-only or keyword-only), by id (the signature kept, to check it is the
# same one): their names in order and their defaults; ``None`` for any other signature. At most
# _PLAIN_KEPT (a producer reads the specs of tasks it cannot import again now and then, each
# with a new signature: emptied when full, it never grows without bound).
_Plain = tuple[tuple[str, ...], dict[str, Any]]
_PLAIN_PARAMETERS: dict[int, tuple[inspect.Signature, _Plain | None]] = {}
_PLAIN_KEPT = 1024


def _plain_parameters(signature: inspect.Signature) -> _Plain | None:
    entry = _PLAIN_PARAMETERS.get(id(signature))
    if entry is not None and entry[0] is signature:
        return entry[1]
    parameters = signature.parameters.values()
    plain: _Plain | None = None
    if all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters):
        names = tuple(p.name for p in parameters)
        plain = names, {p.name: p.default for p in parameters if p.default is not p.empty}
    if len(_PLAIN_PARAMETERS) >= _PLAIN_KEPT:
        _PLAIN_PARAMETERS.clear()
    _PLAIN_PARAMETERS[id(signature)] = (signature, plain)
    return plain


def _named_at_once(
    signature: inspect.Signature | None, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any] | None:
    """What ``_named(bind_arguments(...))`` gives, for a call that binds plainly to a plain
    signature (each argument once, none unknown or missing), without inspect's general binding
    (a delivery's hot path); ``None`` for any other call (bound in full, its errors said)."""
    plain = _plain_parameters(signature) if signature is not None else None
    if plain is None:
        return None
    names, defaults = plain
    if len(args) > len(names):
        return None
    named = dict(zip(names, args, strict=False))
    for name, value in kwargs.items():
        if name in named or name not in names[len(args) :]:
            return None
        named[name] = value
    if len(named) < len(names):
        for name in names[len(args) :]:
            if name not in named:
                if name not in defaults:
                    return None
                named[name] = defaults[name]
    return named


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
    """A stable hash of named arguments: the same for the same values, however they were passed."""
    text = json.dumps(_canonical(dict(arguments)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


# -- the default name: the arguments as an operator reads them --------------------------------

READABLE_MAX = 64
"""The longest ``name=value,...`` part of a default lock name; a longer one is hashed."""
# A text shown as is: no separator of the part (``,`` ``=``), of the name (``:``), no glob or
# hash-tag character, no escape, no space: what an operator can type back in a shell.
_READABLE_TEXT = re.compile(r"[A-Za-z0-9_.@/+~-]+")
# A text that reads as another type's value: shown, it would make "42" and 42 one name.
_READS_TYPED = re.compile(r"-?[0-9]+|True|False|None")


def _readable_value(value: object) -> str | None:
    """The text of a scalar value in a default name; ``None``: it must be hashed."""
    # The base types' own methods, as for template fields (an IntEnum reads as its int).
    if value is None or isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return int.__str__(int(value))
    if isinstance(value, str):
        text = str.__str__(value)
        if _READABLE_TEXT.fullmatch(text) and not _READS_TYPED.fullmatch(text):
            return text
    return None


def readable_arguments(bound: inspect.BoundArguments) -> str | None:
    """The bound arguments as ``name=value,...`` (signature order, ``**kwargs`` entries by
    name; an empty ``*args`` or ``**kwargs`` left out), when each value is ``None``, a
    ``bool``, an ``int`` or a ``str`` of the characters ``A-Z a-z 0-9 _ . @ / + ~ -`` that does
    not read as another type (``"42"``, ``"None"``), and the whole is at most
    :data:`READABLE_MAX` characters; else ``None`` (the name takes their hash). Equal values
    give equal texts, distinct values distinct texts.

    >>> def sync(customer_id, full=False): ...
    >>> readable_arguments(inspect.signature(sync).bind(42, full=False))
    'customer_id=42,full=False'
    """
    pairs: list[str] = []
    for name, value in bound.arguments.items():
        kind = bound.signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                return None
            continue
        items = sorted(value.items()) if kind is inspect.Parameter.VAR_KEYWORD else [(name, value)]
        for key, each in items:
            text = _readable_value(each)
            if text is None or not (key.isascii() and key.isidentifier()):
                return None
            pairs.append(f"{key}={text}")
    part = ",".join(pairs)
    return part if len(part) <= READABLE_MAX else None


# -- template fields ---------------------------------------------------------------------------

EMPTY = "%e"
"""The text of an empty string field: escaping never makes it (every ``%`` it writes is
followed by ``25``, ``7B``, ``7D`` or ``u``)."""
_ESCAPES = {"%": "%25", "{": "%7B", "}": "%7D"}
# Lone surrogates too: redis-py encodes names as strict UTF-8 and would fail on every call.
_TO_ESCAPE = re.compile("[%{}\ud800-\udfff]")


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    return _ESCAPES.get(char) or f"%u{ord(char):04X}"


def _escape(text: str) -> str:
    return _TO_ESCAPE.sub(_escape_one, text) if text else EMPTY


def _plain(value: object, spec: str) -> str:
    """The text of a value before escaping (see the module's rule); TypeError if it has none."""
    # The base types' own methods: a subclass's __str__ (an Enum, a date library's) must not
    # make one value read differently in two processes.
    if isinstance(value, bool) or value is None:
        text = str(value)
    elif isinstance(value, str):
        return format(str.__str__(value), spec)
    elif isinstance(value, int):
        return format(int(value), spec)
    elif isinstance(value, float):
        number = float(value) or 0.0  # -0.0 == 0.0: one name
        return format(number, spec) if spec else repr(number)
    elif isinstance(value, datetime.datetime):
        text = datetime.datetime.isoformat(value, " ")
    elif isinstance(value, datetime.date):
        text = datetime.date.isoformat(value)
    elif isinstance(value, datetime.time):
        text = datetime.time.isoformat(value)
    elif isinstance(value, uuid.UUID):
        text = uuid.UUID.__str__(value)
    elif isinstance(value, decimal.Decimal):
        text = decimal.Decimal.__str__(value)
    else:
        try:
            canonical = _canonical(value)
        except TypeError as exc:
            raise TypeError(
                f"a {type(value).__name__} has no canonical form ({exc}); use a field of it, "
                "a value of a JSON type, or a key function"
            ) from exc
        text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if spec:
        raise TypeError(
            f"a format spec ({spec!r}) applies to str, int and float values only, "
            f"not to a {type(value).__name__}"
        )
    return text


def field_text(value: object, spec: str = "") -> str:
    """The text a template field holding ``value`` puts in a lock name (see the module's rule).

    Raises ``TypeError`` for a value without a canonical form, ``ValueError`` for a format spec
    the value does not take.

    >>> field_text("}x"), field_text(""), field_text(42), field_text({"b": 1, "a": 2})
    ('%7Dx', '%e', '42', '%7B"__map__":[["a",2],["b",1]]%7D')
    """
    return _escape(_plain(value, spec))


class _Field(NamedTuple):
    """A template field resolved to its value (attribute and index access done)."""

    field: str
    value: Any


class _FieldError(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class _KeyFormatter(string.Formatter):
    """``str.format`` over the bound arguments, writing each field by :func:`field_text`."""

    def get_field(self, field_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        value, first = super().get_field(field_name, args, kwargs)
        return _Field(field_name, value), first

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion is not None and isinstance(value, _Field):
            # (refused when the task is declared; a template read from Redis lands here)
            raise _FieldError(value.field, f"conversion !{conversion} is not allowed")
        return value

    def format_field(self, value: Any, format_spec: str) -> str:
        if not isinstance(value, _Field):
            return str(super().format_field(value, format_spec))
        try:
            return field_text(value.value, format_spec)
        except (TypeError, ValueError) as exc:
            raise _FieldError(value.field, str(exc)) from exc


_formatter = _KeyFormatter()

# A template's literal texts, each followed by the name of the field after it (None at the end).
_Parts = tuple[tuple[str, str | None], ...]


@functools.lru_cache(maxsize=512)
def _plain_fields(key: str) -> _Parts | None:
    """The parts of ``key`` when each of its fields is an argument's bare name (``{customer_id}``:
    no attribute, index, spec or conversion), else None. Such a template is filled with the
    same :func:`field_text` as any other, without ``str.format``'s machinery (several times
    the cost, on every call of a task)."""
    parts: list[tuple[str, str | None]] = []
    try:
        for literal, field, spec, conversion in _formatter.parse(key):
            if field is not None and (not field.isidentifier() or spec or conversion):
                return None
            parts.append((literal, field))
    except ValueError:  # (a malformed template: _formatter says what is wrong)
        return None
    return tuple(parts)


def _fill(key: str, named: Mapping[str, Any]) -> str:
    """``key`` filled from ``named`` (see the module's rule)."""
    parts = _plain_fields(key)
    if parts is not None:
        try:
            return "".join(
                literal if field is None else literal + field_text(named[field])
                for literal, field in parts
            )
        except (KeyError, TypeError, ValueError):
            pass  # the full path below raises what is wrong, in its words
    return str(_formatter.vformat(key, (), named))


def _describe(key: object, option: str = "key") -> str:
    if isinstance(key, str):
        return f"{option} template {key!r}"
    return f"{option} function {getattr(key, '__qualname__', None) or key!r}"


def _from_function(
    task: str, key: Any, args: Sequence[Any], kwargs: Mapping[str, Any], option: str = "key"
) -> str:
    result = key(*args, **kwargs)
    if isinstance(result, str):
        return str.__str__(result)  # the function's own name for the lock (checked by caller)
    if result is None:
        made = "the lock name" if option == "key" else f"the {option}"
        raise LockConfigError(
            f"task {task!r}: {_describe(key, option)} returned None; return {made} (a str), or "
            "a value to write it from"
        )
    try:
        return field_text(result)
    except (TypeError, ValueError) as exc:
        raise LockConfigError(f"task {task!r}: {_describe(key, option)} returned {exc}") from exc


def lock_name(
    task: str,
    options: LockOptions,
    signature: inspect.Signature | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> str:
    """The lock name a call takes: the key (template, callable or default hash), plus the host
    for ``scope="host"``. Raises :class:`LockConfigError` naming the task (and the template or
    key function) when the call cannot make one."""
    key = options.key
    named = _named_at_once(signature, args, kwargs) if isinstance(key, str) else None
    if named is not None:
        name = _made(task, key, None, args, kwargs, named=named)
    else:
        name = _made(task, key, bind_arguments(task, signature, args, kwargs), args, kwargs)
    try:
        check_name(name)
    except LockConfigError as exc:
        made = "returned" if callable(key) else "made"
        raise LockConfigError(f"task {task!r}: {_describe(key)} {made} {name!r}: {exc}") from exc
    if options.scope == "host":
        name = f"{name}@{socket.gethostname()}"
    return name


def tenant_of(
    task: str,
    options: LockOptions,
    signature: inspect.Signature | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> tuple[str, int] | None:
    """The tenant of a call and its priority within the tenant (``None``: the lock has no
    ``tenant``). The tenant is made from the call's arguments as the lock's name is (the same
    rule, see the module); a ``priority`` callable takes them as a key function does and must
    return an ``int``. Raises :class:`LockConfigError` naming the task and the option."""
    if options.tenant is None:
        return None
    bound = bind_arguments(task, signature, args, kwargs)
    tenant = _made(task, options.tenant, bound, args, kwargs, "tenant")
    priority = options.priority
    if callable(priority):
        call = (bound.args, bound.kwargs) if bound is not None else (args, kwargs)
        described = _describe(priority, "priority")
        try:
            priority = priority(*call[0], **call[1])
        except (KeyError, IndexError, AttributeError, TypeError, ValueError) as exc:  # as a key
            raise LockConfigError(
                f"task {task!r}: {described} raised: {type(exc).__name__}: {exc}"
            ) from exc
        low, high = PRIORITIES
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise LockConfigError(
                f"task {task!r}: {described} returned {priority!r}; return an int from {low} to "
                f"{high} (higher first)"
            )
        if not low <= priority <= high:
            raise LockConfigError(
                f"task {task!r}: {described} returned {priority}, outside {low} to {high}"
            )
    return tenant, priority or 0


def _made(
    task: str,
    key: str | KeyFunction | None,
    bound: inspect.BoundArguments | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    option: str = "key",
    *,
    named: dict[str, Any] | None = None,
) -> str:
    """What ``key`` (a template, a callable, or ``None``: the default hash) makes of a call:
    the one rule for the lock's name and the tenant alike (``option`` names it in errors).
    ``named``: the call's arguments by name, when already known (a template's fields)."""
    try:
        if isinstance(key, str):
            if named is None:
                named = _named(bound) if bound is not None else dict(kwargs)
            return _fill(key, named)
        if key is not None:
            call = (bound.args, bound.kwargs) if bound is not None else (args, kwargs)
            return _from_function(task, key, *call, option=option)
        shown = readable_arguments(bound) if bound is not None else None
        if shown is not None:
            return f"{task}:{shown}" if shown else task
        named = _named(bound) if bound is not None else {"args": list(args), **kwargs}
        return f"{task}:{canonical_hash(named)}"
    except _FieldError as exc:
        raise LockConfigError(
            f"task {task!r}: {_describe(key, option)}: field {{{exc.field}}}: {exc}"
        ) from exc
    except LockConfigError:
        raise
    except (KeyError, IndexError, AttributeError, TypeError, ValueError) as exc:
        if isinstance(key, str):
            failed = f"{_describe(key, option)}: cannot fill it from the call's arguments"
        elif key is not None:
            failed = f"{_describe(key, option)} raised"
        else:
            failed = "cannot derive its lock key"
        raise LockConfigError(f"task {task!r}: {failed}: {type(exc).__name__}: {exc}") from exc
