"""The ``rate=`` task option (Celery tasks and RQ jobs alike), parsed and checked once, when the
task is defined; and a rate, ``"100/m"``: at most ``limit`` units (starts, or what calls cost)
per ``per`` seconds, refused early with an error naming the value and the forms allowed."""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypedDict

from ..errors import LockConfigError
from ._validate import finite_real, refuse
from .durations import Duration, seconds_or_none
from .options import KeyFunction, LockOptions, Scope, known_options, option_what, parse_keying

__all__ = [
    "MAX_BURST",
    "MAX_COST",
    "MAX_DELAY",
    "MAX_LIMIT",
    "MAX_PER",
    "MAX_UNITS_PER_SECOND",
    "MIN_PER",
    "CostFunction",
    "Rate",
    "RateOptionDict",
    "RateOptions",
    "check_burst",
    "check_cost",
    "parse_rate",
    "parse_rate_option",
]

MAX_DELAY = Duration(0.0, 30 * 86400.0)
"""The range of ``max_delay``: 0 (start now or not at all) to 30 days."""
MAX_LIMIT = 1_000_000_000
"""The largest ``limit`` (units per period)."""
MAX_UNITS_PER_SECOND = 1_000_000
"""The fastest rate: the bucket counts time in microseconds, one unit at least one."""
MAX_BURST = 1_000_000_000
"""The largest ``burst`` (units at once)."""
MAX_COST = 1_000_000_000.0
"""The largest cost of one call, in units."""
MIN_PER = 0.001
"""The shortest window, in seconds: the server's clock is read in milliseconds."""
MAX_PER = 7 * 86400.0
"""The longest window, in seconds (7 days): the window's key lives at least that long."""

_UNITS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hr", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
}
# "<limit>/<unit>", "<limit>/<number><unit>" or "<limit>/<number>" (seconds).
_FORM = re.compile(r"(\d+)\s*/\s*(?:(\d+(?:\.\d+)?|\.\d+)\s*([a-z]*)|([a-z]+))")
FORMS = (
    "'<limit>/<period>' such as '100/m', '100/min', '10/s', '5/2s', '1000/h', '50/d' or "
    "'100/60' (seconds), or a Rate(limit, per)"
)


def _in(part: object, value: object) -> str:
    return f" in {value!r}" if value is not part else ""


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``limit`` starts in any ``per`` seconds.

    >>> Rate(100, 60)
    Rate(limit=100, per=60.0)
    >>> str(Rate(5, 2)), Rate(5, 2).per_ms
    ('5/2s', 2000)
    """

    limit: int
    per: float

    def __post_init__(self) -> None:
        _check(self.limit, self.per, "rate", self, None)
        object.__setattr__(self, "per", float(self.per))

    @property
    def per_ms(self) -> int:
        """The window in whole milliseconds, rounded up (a longer window never lets more in)."""
        return math.ceil(round(self.per * 1000, 6))

    def __str__(self) -> str:
        per = int(self.per) if self.per.is_integer() else self.per
        return f"{self.limit}/{per}s"


def _check(limit: object, per: object, what: str, value: object, name: str | None) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise LockConfigError(
            f"{what}: the limit must be an integer from 1 to {MAX_LIMIT:,}, got {limit!r}"
            f"{_in(limit, value)}",
            name=name,
        )
    seconds = finite_real(per)
    if seconds is None or not MIN_PER <= seconds <= MAX_PER:
        raise LockConfigError(
            f"{what}: the period must be a number of seconds from {MIN_PER:g} to {MAX_PER:g} "
            f"(7 days), got {per!r}{_in(per, value)}",
            name=name,
        )
    if limit / seconds > MAX_UNITS_PER_SECOND:
        raise LockConfigError(
            f"{what}: at most {MAX_UNITS_PER_SECOND:,} units a second, got {limit} per "
            f"{seconds:g}s{_in(limit, value)}: count in larger units",
            name=name,
        )


def check_burst(value: object, what: str = "burst", name: str | None = None) -> int:
    """A burst: how many units may start at once (an integer from 1 to :data:`MAX_BURST`)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BURST:
        raise refuse(what, f"an integer from 1 to {MAX_BURST:,}", value, name=name)
    return value


def check_cost(value: object, what: str = "cost", name: str | None = None) -> float:
    """A call's cost in units: a number from 0 to :data:`MAX_COST`."""
    number = finite_real(value)
    if number is None or not 0 <= number <= MAX_COST:
        raise refuse(what, f"a number from 0 to {MAX_COST:,.0f}", value, name=name)
    return number


def parse_rate(value: object, *, what: str = "rate", name: str | None = None) -> Rate:
    """The :class:`Rate` that ``value`` writes: ``"<limit>/<period>"``, where the period is a
    unit (``s``, ``m`` or ``min``, ``h``, ``d``; also spelt out), a number and a unit (``2s``,
    ``1.5h``), or a number of seconds (``60``); or a :class:`Rate` (returned as is). Anything
    else raises :class:`~celery_redislock.LockConfigError` naming ``what`` (``"rate"``,
    ``"task 'x': lock option 'rate':"``), the value and the forms allowed; ``name`` is the lock
    name the error carries.

    >>> parse_rate("100/m")
    Rate(limit=100, per=60.0)
    >>> parse_rate("5/2s"), parse_rate("100/60")
    (Rate(limit=5, per=2.0), Rate(limit=100, per=60.0))
    >>> parse_rate("100")
    Traceback (most recent call last):
    ...
    celery_redislock.errors.LockConfigError: rate must be '<limit>/<period>' such as '100/m', '100/min', '10/s', '5/2s', '1000/h', '50/d' or '100/60' (seconds), or a Rate(limit, per), got '100'
    """  # noqa: E501
    if isinstance(value, Rate):
        return value
    found = _FORM.fullmatch(value.strip().lower()) if isinstance(value, str) else None
    count, number, unit, unit_alone = found.groups() if found else ("", "", "", "")
    scale = _UNITS.get(unit_alone or unit or "s")  # no unit: seconds
    if found is None or scale is None:
        raise refuse(what, FORMS, value, name=name)
    limit, per = int(count), (float(number) if number else 1.0) * scale
    _check(limit, per, what, value, name)
    return Rate(limit, per)


CostFunction = Callable[..., float]
"""A call's cost from its arguments: called as the task is, ``cost(*args, **kwargs)``."""


class RateOptionDict(TypedDict, total=False):
    """The dict form of a task's ``rate=`` option (``rate`` is required).

    >>> opts: RateOptionDict = {"rate": "100/m", "key": "partner:{account}"}
    """

    rate: str | Rate
    key: str | KeyFunction | None
    scope: Scope
    max_delay: float | None
    burst: int
    cost: float | CostFunction


_ALLOWED = tuple(RateOptionDict.__annotations__)


@dataclass(frozen=True, slots=True)
class RateOptions:
    """A task's rate limit: at most ``rate`` starts across the fleet per key."""

    rate: Rate
    keying: LockOptions
    """Where the key comes from (``key`` and ``scope``): the same derivation as ``lock=``; by
    default the task's name (one limit for every call of the task)."""
    max_delay: float | None = None
    """A start further ahead than this is refused (the task fails) rather than delayed."""
    burst: int = 1
    """Units that may start at once (the bucket's size); 1: starts spread evenly."""
    cost: float | CostFunction = 1.0
    """What one call costs, in units of the rate: a number, or a function of the call's
    arguments."""
    also: tuple[RateOptions, ...] = ()
    """Further limits a start takes with this one, all or nothing (``rate=`` as a list)."""

    @property
    def limits(self) -> tuple[RateOptions, ...]:
        """Every limit a start takes: this one, then :attr:`also`."""
        return (self, *self.also)

    def cost_of(self, task: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> float:
        """The cost of one call; :class:`LockConfigError` naming the task if the function
        fails or answers what is not a cost."""
        if not callable(self.cost):
            return self.cost
        what = option_what(task, "cost", "rate")
        try:
            value = self.cost(*args, **kwargs)
        except Exception as exc:
            raise LockConfigError(f"{what} the cost function failed: {exc!r}") from exc
        return check_cost(value, f"{what} the cost function's answer")

    @property
    def slack(self) -> float:
        """The room between slots and starts: slots are spaced over ``per + slack``, the
        starts counted over ``per + slack / 2`` (so that starts catch up after a late one,
        and a body may start a little after its counted start), and a start asked again within
        it counts once. 5% of ``per``, from 0.1 s to 1 s (never more than ``per``)."""
        return min(self.rate.per, max(0.1, min(1.0, 0.05 * self.rate.per)))


def parse_rate_option(
    task: str, signature: inspect.Signature | None, value: object
) -> RateOptions | None:
    """Checks a task's ``rate=`` option and returns it parsed: ``None``/``False`` (no limit), a
    rate (``"100/m"``, see :func:`~celery_redislock.core.rate.parse_rate`), or a dict with
    ``rate`` and optionally ``key`` (a template over the call's arguments, or a callable),
    ``scope``, ``max_delay``, ``burst`` and ``cost`` (a number, or a callable of the call's
    arguments); or a list of those, limits taken all or nothing (each with its own ``key``).
    Raises :class:`LockConfigError` naming the task and option.

    >>> parse_rate_option("api", None, "100/m").rate
    Rate(limit=100, per=60.0)
    """
    if value is None or value is False:
        return None
    if isinstance(value, list | tuple):
        return _several(task, signature, value)
    return _one(task, signature, value)


def _several(
    task: str, signature: inspect.Signature | None, value: list[Any] | tuple[Any, ...]
) -> RateOptions:
    """Several limits taken all or nothing: the first carries the rest (``also``) and the
    smallest ``max_delay`` given."""
    if not value:
        raise LockConfigError(
            f"task {task!r}: rate must name at least one rate, got an empty {type(value).__name__}"
        )
    items = []
    for item in value:
        if isinstance(item, list | tuple):
            raise LockConfigError(
                f"task {task!r}: rate: each of several limits must be a rate or a dict, got "
                f"{item!r}"
            )
        items.append(_one(task, signature, item))
    seen = [(i.keying.key, i.keying.scope) for i in items]
    if len(set(map(repr, seen))) != len(seen):
        raise LockConfigError(
            f"task {task!r}: rate: several limits need a key each (two would share one limit), "
            f"got keys {[k for k, _ in seen]!r}"
        )
    delays = [i.max_delay for i in items if i.max_delay is not None]
    first, *rest = items
    return replace(first, max_delay=min(delays) if delays else None, also=tuple(rest))


def _one(task: str, signature: inspect.Signature | None, value: object) -> RateOptions:
    if isinstance(value, str | Rate):
        value = {"rate": value}
    opts: dict[str, Any] = known_options(task, "rate", value, _ALLOWED, "a rate such as '100/m'")
    if "rate" not in opts:
        raise LockConfigError(
            f"task {task!r}: rate option 'rate' is required (e.g. '100/m'), got only "
            f"{', '.join(map(repr, opts)) or 'nothing'}"
        )
    rate = parse_rate(opts["rate"], what=option_what(task, "rate", "rate"))
    # By default one limit for the whole task: its name, as a template without fields.
    opts["key"] = opts.get("key") or task.replace("{", "{{").replace("}", "}}")
    keying = parse_keying(task, signature, opts, "rate")
    max_delay = seconds_or_none(
        opts.get("max_delay"), MAX_DELAY, option_what(task, "max_delay", "rate")
    )
    burst = check_burst(opts.get("burst", 1), option_what(task, "burst", "rate"))
    cost = opts.get("cost", 1.0)
    if not callable(cost):
        cost = check_cost(cost, option_what(task, "cost", "rate"))
    return RateOptions(rate, keying, max_delay, burst, cost)
