"""The ``rate=`` task option (Celery tasks and RQ jobs alike), parsed and checked once, when the
task is defined; and a rate, ``"100/m"``: at most ``limit`` starts per ``per`` seconds, refused
early with an error naming the value and the forms allowed."""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass
from typing import Any, TypedDict

from ..errors import LockConfigError
from ._validate import finite_real, refuse
from .durations import Duration, seconds_or_none
from .options import KeyFunction, LockOptions, Scope, known_options, option_what, parse_keying

__all__ = [
    "MAX_DELAY",
    "MAX_LIMIT",
    "MAX_PER",
    "MIN_PER",
    "Rate",
    "RateOptionDict",
    "RateOptions",
    "parse_rate",
    "parse_rate_option",
]

MAX_DELAY = Duration(0.0, 30 * 86400.0)
"""The range of ``max_delay``: 0 (start now or not at all) to 30 days."""
MAX_LIMIT = 100_000
"""The largest ``limit``: the window keeps one entry (the request id) per start in it."""
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
            f"{what}: the limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}"
            f"{_in(limit, value)}: the window keeps one entry per start, so its memory and cost "
            f"grow with the limit; give a large quota over a shorter period ('1000/36s' rather "
            f"than '100000/h')",
            name=name,
        )
    seconds = finite_real(per)
    if seconds is None or not MIN_PER <= seconds <= MAX_PER:
        raise LockConfigError(
            f"{what}: the period must be a number of seconds from {MIN_PER:g} to {MAX_PER:g} "
            f"(7 days), got {per!r}{_in(per, value)}",
            name=name,
        )


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


class RateOptionDict(TypedDict, total=False):
    """The dict form of a task's ``rate=`` option (``rate`` is required).

    >>> opts: RateOptionDict = {"rate": "100/m", "key": "partner:{account}"}
    """

    rate: str | Rate
    key: str | KeyFunction | None
    scope: Scope
    max_delay: float | None


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

    @property
    def slack(self) -> float:
        """Seconds a start may lag its slot (a delayed message delivered a little late): the
        limit is kept over ``per + slack`` windows so that the starts, not only the slots,
        keep the rate. 5% of ``per``, from 0.1 s to 1 s (never more than ``per``)."""
        return min(self.rate.per, max(0.1, min(1.0, 0.05 * self.rate.per)))

    @property
    def reserved(self) -> Rate:
        """The rate slots are reserved at: ``per`` widened by :attr:`slack`."""
        return Rate(self.rate.limit, self.rate.per + self.slack)


def parse_rate_option(
    task: str, signature: inspect.Signature | None, value: object
) -> RateOptions | None:
    """Checks a task's ``rate=`` option and returns it parsed: ``None``/``False`` (no limit), a
    rate (``"100/m"``, see :func:`~celery_redislock.core.rate.parse_rate`), or a dict with
    ``rate`` and optionally ``key`` (a template over the call's arguments, or a callable),
    ``scope`` and ``max_delay``. Raises :class:`LockConfigError` naming the task and option.

    >>> parse_rate_option("api", None, "100/m").rate
    Rate(limit=100, per=60.0)
    """
    if value is None or value is False:
        return None
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
    return RateOptions(rate, keying, max_delay)
