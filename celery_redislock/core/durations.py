"""Every duration the package takes, and the finite range it must lie in (docs/celery.md).

A duration is checked where it is given and refused there naming it, the value and the range, so
that a value that cannot work never surfaces later as an ``OverflowError``, a Redis error that
blames the backend (``1e300`` s is no Redis integer of ms), or a lease lost as it is taken.
Numbers are ``int`` or ``float``; NaN, infinities, ``bool`` and strings are refused everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._validate import finite_real, refuse

__all__ = [
    "ALLOWANCE",
    "COUNTDOWN",
    "MAX_HOLD",
    "MAX_WAIT",
    "OTHER",
    "PERIOD",
    "TIMEOUT",
    "TTL",
    "Duration",
    "by_name",
    "seconds",
    "seconds_or_none",
]

_DAY = 86400.0


@dataclass(frozen=True, slots=True)
class Duration:
    """The range, in seconds, bounds included, that one kind of duration must lie in."""

    low: float
    high: float

    def allowed(self) -> str:
        """The range in words, as error messages give it."""
        days = self.high / _DAY
        span = f" ({_number(days)} day{'' if days == 1 else 's'})" if days >= 1 else ""
        return f"a number of seconds from {_number(self.low)} to {_number(self.high)}{span}"

    def check(self, value: object) -> float | None:
        """``value`` as a float if it lies in the range, else ``None``."""
        seconds = finite_real(value)
        return seconds if seconds is not None and self.low <= seconds <= self.high else None


# The heartbeat renews every ttl/3: under 0.1 s (33 ms) one scheduling hiccup loses a live
# lease; past a week a dead holder's lease blocks its name longer than anyone would wait.
TTL = Duration(0.1, 7 * _DAY)
# How long acquire waits (0: one try); over a day is a hang.
TIMEOUT = Duration(0.0, _DAY)
# A conflict retry's first delay: under 10 ms copies spin through the broker; past a day it is
# a schedule, not a retry.
COUNTDOWN = Duration(0.01, _DAY)
# When renewal stops: under the shortest ttl it stops before the first renewal.
MAX_HOLD = Duration(0.1, 30 * _DAY)
# How long a queued claim outlives its countdown/ETA: under 0.1 s it lapses before delivery;
# past a month the message is surely lost.
ALLOWANCE = Duration(0.1, 30 * _DAY)
# A once-per-period key's period: under 0.1 s it keeps nothing apart; past a year it is a
# one-off, which wants no key that lapses.
PERIOD = Duration(0.1, 365 * _DAY)
# A parked task's wait: under a second it would expire before a sweep sees it.
MAX_WAIT = Duration(1.0, 7 * _DAY)
# A pause of a rate limit or a lock (after an upstream 429): at most 30 days.
MAX_PAUSE = 30 * _DAY
# Any other duration (the fence mark's keep): at least a millisecond, as Redis counts them.
OTHER = Duration(0.001, 365 * _DAY)

_BY_NAME = {
    "ttl": TTL,
    "timeout": TIMEOUT,
    "countdown": COUNTDOWN,
    "max_hold": MAX_HOLD,
    "allowance": ALLOWANCE,
    "period": PERIOD,
    "max_wait": MAX_WAIT,
}


def by_name(name: str) -> Duration:
    """The range of the duration called ``name`` (``"ttl"``, ...); :data:`OTHER` if unknown."""
    return _BY_NAME.get(name, OTHER)


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def seconds(value: object, duration: Duration, what: str, *, name: str | None = None) -> float:
    """``value`` in seconds, checked against ``duration`` (``what``, ``name``: :mod:`._validate`).

    >>> seconds(float("inf"), TTL, "ttl")
    Traceback (most recent call last):
    ...
    celery_redislock.errors.LockConfigError: ttl must be a number of seconds from 0.1 to 604800 (7 days), got inf
    """  # noqa: E501
    if (checked := duration.check(value)) is None:
        raise refuse(what, duration.allowed(), value, name=name)
    return checked


def seconds_or_none(
    value: object, duration: Duration, what: str, *, name: str | None = None
) -> float | None:
    """As :func:`seconds`, but ``None`` is allowed (and returned)."""
    if value is None:
        return None
    if (checked := duration.check(value)) is None:
        raise refuse(what, f"{duration.allowed()} or None", value, name=name)
    return checked
