"""The ``lock=`` task option: parsed and checked once, when the task is defined."""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypedDict, get_args

from ..errors import LockConfigError
from ._validate import int_at_least, one_of, true_or_false
from .durations import (
    COUNTDOWN,
    MAX_HOLD,
    MAX_WAIT,
    TIMEOUT,
    TTL,
    seconds,
    seconds_or_none,
)
from .protocol import PRIORITIES, Mode

__all__ = [
    "ConflictAction",
    "KeyFunction",
    "LockOption",
    "LockOptionDict",
    "LockOptions",
    "PriorityFunction",
    "Scope",
    "call_signature",
    "check_fields",
    "known_options",
    "option_what",
    "parse_key",
    "parse_keying",
    "parse_lock_option",
    "template_fields",
]

ConflictAction = Literal["skip", "retry", "wait", "raise", "queue"]
Scope = Literal["global", "host"]
KeyFunction = Callable[..., object]
PriorityFunction = Callable[..., int]

CONFLICT_ACTIONS: tuple[ConflictAction, ...] = get_args(ConflictAction)
SCOPES: tuple[Scope, ...] = get_args(Scope)
MODES: tuple[Mode, ...] = get_args(Mode)
DEFAULT_COUNTDOWN = 2.0
DEFAULT_WAIT_TIMEOUT = 10.0
DEFAULT_MAX_WAIT = 3600.0


@dataclass(frozen=True, slots=True)
class LockOptions:
    """A task's lock, as declared by its ``lock=`` option (``None`` fields take settings)."""

    key: str | KeyFunction | None = None
    """Template over the bound arguments, a callable taking the task's arguments, or ``None``
    for the task name plus a hash of all bound arguments."""
    mode: Mode = "write"
    limit: int | None = None
    scope: Scope = "global"
    ttl: float | None = None
    on_conflict: ConflictAction | None = None
    countdown: float = DEFAULT_COUNTDOWN
    max_retries: int | None = None
    count_retries: bool = False
    timeout: float = DEFAULT_WAIT_TIMEOUT
    max_hold: float | None = None
    max_wait: float = DEFAULT_MAX_WAIT
    """``queue``: how long a parked task waits in line before it ends as expired."""
    max_waiting: int | None = None
    """``queue``: at most this many tasks parked in the lock's line (``None``: no bound)."""
    tenant: str | KeyFunction | None = None
    """``queue``: the call's tenant, made from the call's arguments as ``key`` makes the lock's
    name (a template or a callable): parked tasks are served tenant by tenant in turn."""
    priority: int | PriorityFunction | None = None
    """``queue`` with a ``tenant``: an ``int`` (or a callable of the call's arguments returning
    one) ordering one tenant's parked tasks, higher first (``None``: 0)."""
    fields: tuple[str, ...] = ()
    """Names of the arguments a key template uses (checked against the signature)."""
    also: tuple[LockOptions, ...] = ()
    """``lock=`` as a list: the further locks, taken together with this one, all or nothing
    (their ``key``, ``scope``, ``mode``, ``limit`` and ``ttl``; the rest is this one's)."""


class LockOptionDict(TypedDict, total=False):
    """The dict form of a task's ``lock=`` option; every key may be left out (see
    :class:`LockOptions` for the defaults, and the README for what each does).

    >>> opts: LockOptionDict = {"key": "sync:{customer_id}", "on_conflict": "retry"}
    """

    key: str | KeyFunction | None
    mode: Mode
    limit: int | None
    scope: Scope
    ttl: float | None
    on_conflict: ConflictAction | None
    countdown: float
    max_retries: int | None
    count_retries: bool
    timeout: float
    max_hold: float | None
    max_wait: float
    max_waiting: int | None
    tenant: str | KeyFunction | None
    priority: int | PriorityFunction | None


LockOption = bool | str | LockOptionDict | Sequence[str | LockOptionDict] | None
"""What a task's ``lock=`` takes: see :func:`parse_lock_option`."""

# The option names, in the order errors list them: the dict form's keys, so they cannot drift.
_ALLOWED = tuple(LockOptionDict.__annotations__)
# What each further lock of a ``lock=`` list may say: how the run goes (on_conflict, retries,
# waits) is the first entry's, for the whole set.
_PER_LOCK = ("key", "mode", "limit", "scope", "ttl")


def option_what(task: str, option: str, what: str = "lock") -> str:
    """How an error about one option of a task opens: ``task 'x': lock option 'ttl':``."""
    return f"task {task!r}: {what} option {option!r}:"


def _error(task: str, option: str, message: str, what: str = "lock") -> LockConfigError:
    return LockConfigError(f"{option_what(task, option, what)} {message}")


def template_fields(
    task: str, template: str, what: str = "lock", option: str = "key"
) -> tuple[str, ...]:
    """The argument names a key template refers to (``{a}``, ``{a.b}``, ``{a[0]}``); ``what``
    and ``option`` name the option in errors. Refuses what would make names that are not
    canonical (see :mod:`.naming`): conversions (``{a!r}``) and fields nested in a format
    spec."""

    def refused(message: str) -> LockConfigError:
        return _error(task, option, message, what)

    names = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise refused(f"is not a valid format string ({exc}): {template!r}") from exc
    if parsed and parsed[0][0].startswith("}"):
        # "{}...}" would be an empty Redis Cluster hash tag in the lock's keys.
        raise refused(f"a lock name must not start with '}}': {template!r}")
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise refused(f"template fields must name arguments, got {{{field}}} in {template!r}")
        if conversion is not None:
            raise refused(
                f"template field {{{field}!{conversion}}} in {template!r}: conversions are not "
                "allowed (a field is written from a canonical form of its value)"
            )
        if spec and "{" in spec:
            raise refused(
                f"template field {{{field}:{spec}}} in {template!r}: a format spec must not "
                "hold fields"
            )
        names.append(root)
    return tuple(dict.fromkeys(names))


def parse_lock_option(
    task: str,
    signature: inspect.Signature | None,
    value: LockOption,
) -> LockOptions | None:
    """Checks a task's ``lock=`` option against its function and returns it parsed.

    ``value`` is ``None``/``False`` (no lock), ``True`` (one run per distinct arguments), a key
    template string, a mapping of options, or a list of key strings and mappings: several locks
    taken all or nothing (the first entry says how the run goes; see :class:`LockOptions`).
    ``signature`` is the task's call signature (see :func:`call_signature`). Raises
    :class:`LockConfigError` naming the task and the option.

    >>> sig = inspect.signature(lambda customer_id: None)
    >>> parse_lock_option("sync", sig, "sync:{customer_id}").key
    'sync:{customer_id}'
    """
    if value is None or value is False:
        return None
    if isinstance(value, list | tuple):
        return _parse_lock_list(task, signature, value)
    if value is True:
        return LockOptions()
    if isinstance(value, str):
        value = {"key": value}
    opts = known_options(task, "lock", value, _ALLOWED, "True, a key template string, a list")

    def what(option: str) -> str:
        return option_what(task, option)

    keying = parse_keying(task, signature, opts, "lock")
    on_conflict = opts.get("on_conflict")
    if on_conflict is not None:
        on_conflict = one_of(on_conflict, CONFLICT_ACTIONS, what("on_conflict"))
    line_only = [k for k in ("max_wait", "max_waiting") if k in opts]
    if line_only and on_conflict not in (None, "queue"):
        raise LockConfigError(
            f"{what(line_only[0])} applies to on_conflict='queue' only (the task line), but "
            f"on_conflict is {on_conflict!r}"
        )
    tenant = _parse_tenant(task, signature, opts, on_conflict)
    return replace(
        keying,
        tenant=tenant,
        priority=_parse_priority(task, opts, tenant),
        mode=one_of(opts.get("mode", "write"), MODES, what("mode"), listed="'read' or 'write'"),
        limit=int_at_least(opts.get("limit"), 1, what("limit"), or_none=True),
        ttl=seconds_or_none(opts.get("ttl"), TTL, what("ttl")),
        on_conflict=on_conflict,
        countdown=seconds(opts.get("countdown", DEFAULT_COUNTDOWN), COUNTDOWN, what("countdown")),
        max_retries=int_at_least(opts.get("max_retries"), 0, what("max_retries"), or_none=True),
        count_retries=true_or_false(opts.get("count_retries", False), what("count_retries")),
        timeout=seconds(opts.get("timeout", DEFAULT_WAIT_TIMEOUT), TIMEOUT, what("timeout")),
        max_hold=seconds_or_none(opts.get("max_hold"), MAX_HOLD, what("max_hold")),
        max_wait=seconds(opts.get("max_wait", DEFAULT_MAX_WAIT), MAX_WAIT, what("max_wait")),
        max_waiting=int_at_least(opts.get("max_waiting"), 1, what("max_waiting"), or_none=True),
    )


def _parse_lock_list(
    task: str, signature: inspect.Signature | None, value: Sequence[object]
) -> LockOptions:
    """``lock=`` as a list: the first entry in full, the others' own lock settings only; each
    names its lock with a ``key`` of its own (two entries never make one name)."""
    if len(value) < 2:
        raise LockConfigError(
            f"task {task!r}: lock as a list takes two or more locks, got {len(value)}; "
            "give a single lock as a string or a dict"
        )
    entries: list[dict[str, Any]] = []
    for number, entry in enumerate(value, 1):
        if isinstance(entry, str):
            entry = {"key": entry}
        opts = known_options(task, f"lock {number}", entry, _ALLOWED, "a key template string")
        if opts.get("key") is None:
            raise LockConfigError(
                f"task {task!r}: lock {number} of the list needs a 'key' of its own (a template "
                "or a callable: each lock of the list is a name of its own)"
            )
        run_wide = [k for k in opts if k not in _PER_LOCK]
        if number > 1 and run_wide:
            raise LockConfigError(
                f"task {task!r}: lock {number} of the list sets {', '.join(map(repr, run_wide))}, "
                f"which the first lock sets for the whole list; a further lock takes "
                f"{', '.join(_PER_LOCK)}"
            )
        entries.append(opts)
    keys = [opts["key"] for opts in entries]
    if len(set(keys)) != len(keys):
        raise LockConfigError(
            f"task {task!r}: the locks of the list must differ by key, got {keys}"
        )
    if entries[0].get("on_conflict") == "queue":
        raise LockConfigError(
            f"task {task!r}: lock as a list cannot take on_conflict='queue' (a task line waits "
            "for one lock); use 'retry' (the default), 'wait', 'skip' or 'raise', or one lock "
            "with a line (its 'tenant' serves tenants in turn)"
        )
    first = parse_lock_option(task, signature, entries[0]) or LockOptions()  # type: ignore[arg-type]
    also = tuple(
        parse_lock_option(task, signature, opts) or LockOptions()  # type: ignore[arg-type]
        for opts in entries[1:]
    )
    return replace(first, also=also)


def _parse_tenant(
    task: str, signature: inspect.Signature | None, opts: Mapping[str, Any], on_conflict: object
) -> str | KeyFunction | None:
    """The ``tenant`` option: a template over the call's arguments or a callable, as ``key``
    (checked alike), for tasks that park in the task line only."""
    tenant = opts.get("tenant")
    if tenant is None:
        return None
    what = option_what(task, "tenant")
    if on_conflict != "queue":
        raise LockConfigError(
            f"{what} applies to on_conflict='queue' only (the parked tasks of the task line "
            f"take turns by tenant), but on_conflict is {on_conflict!r}; say on_conflict='queue'"
        )
    if not isinstance(tenant, str) and not callable(tenant):
        raise LockConfigError(
            f"{what} must be a template string over the task's arguments (e.g. '{{account}}') "
            f"or a callable taking them, got {type(tenant).__name__}"
        )
    return parse_key(task, signature, tenant, option="tenant")[0]


def _parse_priority(
    task: str, opts: Mapping[str, Any], tenant: object
) -> int | PriorityFunction | None:
    """The ``priority`` option: an int in ``PRIORITIES``, or a callable taking the call's
    arguments and returning one; it orders one tenant's parked tasks, so it needs a tenant."""
    priority = opts.get("priority")
    if priority is None:
        return None
    what = option_what(task, "priority")
    if tenant is None:
        raise LockConfigError(
            f"{what} orders the parked tasks of one tenant, so it needs the option 'tenant' "
            "(with on_conflict='queue'); without tenants the line serves in arrival order"
        )
    if callable(priority):
        return priority  # type: ignore[no-any-return]
    low, high = PRIORITIES
    if isinstance(priority, bool) or not isinstance(priority, int) or not low <= priority <= high:
        raise LockConfigError(
            f"{what} must be an int from {low} to {high} (higher first) or a callable taking "
            f"the task's arguments and returning one, got {priority!r}"
        )
    return priority


def known_options(
    task: str, what: str, value: object, allowed: tuple[str, ...], shape: str
) -> dict[str, Any]:
    """The options of a dict-valued task option, refusing names it does not know, and any
    value but a mapping (the option's other forms, ``shape``, are the caller's)."""
    if not isinstance(value, Mapping):
        raise LockConfigError(
            f"task {task!r}: {what} must be {shape} or a dict of options "
            f"({', '.join(allowed)}), got {type(value).__name__}"
        )
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise LockConfigError(
            f"task {task!r}: unknown {what} option(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(allowed)}"
        )
    return dict(value)


def parse_key(
    task: str,
    signature: inspect.Signature | None,
    key: object,
    what: str = "lock",
    option: str = "key",
) -> tuple[str | KeyFunction | None, tuple[str, ...]]:
    """Checks a ``key`` option (or another made as a key is: ``option``); returns it with the
    argument names a template uses."""
    if isinstance(key, str):
        if not key:
            raise _error(task, option, "must not be empty", what)
        fields = template_fields(task, key, what, option)
        check_fields(task, signature, fields, what, option)
        return key, fields
    if key is not None and not callable(key):
        got = type(key).__name__
        message = f"must be a template string, a callable or None, got {got}"
        raise _error(task, option, message, what)
    return key, ()


def parse_keying(
    task: str, signature: inspect.Signature | None, opts: Mapping[str, Any], what: str
) -> LockOptions:
    """The ``key`` and ``scope`` of a ``unique=`` or ``rate=`` option, as a lock's keying."""
    key, fields = parse_key(task, signature, opts.get("key"), what)
    scope = one_of(opts.get("scope", "global"), SCOPES, option_what(task, "scope", what))
    return LockOptions(key=key, scope=scope, fields=fields)


def call_signature(fun: Callable[..., Any], bound: bool) -> inspect.Signature | None:
    """The signature callers use: ``fun``'s, without ``self`` for a ``bind=True`` task."""
    try:
        sig = inspect.signature(fun)
    except (TypeError, ValueError):
        return None  # no signature to check against (e.g. a C function)
    return sig.replace(parameters=list(sig.parameters.values())[1:]) if bound else sig


def check_fields(
    task: str,
    signature: inspect.Signature | None,
    fields: tuple[str, ...],
    what: str = "lock",
    option: str = "key",
) -> None:
    """Checks that the task takes every argument a key template (``option``) names."""
    if signature is None:
        return
    params = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return  # any name may arrive through **kwargs
    missing = [f for f in fields if f not in params]
    if missing:
        raise LockConfigError(
            f"{option_what(task, option, what)} template names argument(s) "
            f"{', '.join(map(repr, missing))} that the task does not take; its arguments are: "
            f"{', '.join(params) or '(none)'}"
        )
