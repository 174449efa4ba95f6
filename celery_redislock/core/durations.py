"""Every duration the package takes, and the finite range it must lie in.

A duration is checked where it is given (``Lock(...)``, ``Lock.acquire(timeout=)``, the
``lock=`` and ``unique=`` task options, the ``redislock_ttl`` and ``redislock_queue_allowance``
settings) and refused there with a :class:`~celery_redislock.LockConfigError` naming it, the
value and the range. A value that cannot work must not surface later as an ``OverflowError``,
as a Redis error that blames the backend (``1e300`` seconds is not a Redis integer of
milliseconds), or as a lease lost the moment it is taken.

============  =====================  ======================================================
duration      allowed, in seconds    why these bounds
============  =====================  ======================================================
ttl           0.1 .. 604800          The heartbeat renews every ttl/3. Below 0.1 s that is
              (7 days)               under 33 ms, the order of one scheduling hiccup (GC, a
                                     busy host) plus a round trip, so a live holder would
                                     lose its lease. Above 7 days a lease left by a dead
                                     holder blocks its name longer than anyone would wait.
timeout       0 .. 86400 (1 day),    How long ``acquire`` waits (0: one try). A wait of more
              or None                than a day is a hang; ``None`` (``Lock.acquire`` only)
                                     says "no limit" on purpose.
countdown     0.01 .. 86400          The first delay before a task that met a held lock is
              (1 day)                retried (doubled per conflict, with jitter). Below
                                     10 ms the copies spin through the broker; past a day it
                                     is a schedule, not a retry.
max_hold      0.1 .. 2592000         When renewal stops. Less than the shortest ttl is a
              (30 days)              mistake (it stops before the first renewal); more than
                                     a month is no bound at all.
allowance     0.1 .. 2592000         How long a unique task's queued claim outlives its
              (30 days)              countdown/ETA. Below 0.1 s the claim lapses before the
                                     message can be delivered; past a month the message is
                                     surely lost, and its key must not stay claimed.
max_wait      1 .. 604800 (7 days)   How long a parked task waits in its lock's task line
                                     before it ends as expired. Below a second it would
                                     expire before a sweep sees it; past a week the caller
                                     has long stopped waiting for it.
(other)       0.001 .. 31536000      Any other duration (e.g. the fence mark's keep): at
              (365 days)             least one millisecond, as Redis counts them.
============  =====================  ======================================================

Numbers are ``int`` or ``float`` (any real number but ``bool``). NaN, infinities, ``bool``,
strings and other types are refused everywhere.
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
        if seconds is None or not self.low <= seconds <= self.high:
            return None
        return seconds


TTL = Duration(0.1, 7 * _DAY)
TIMEOUT = Duration(0.0, _DAY)
COUNTDOWN = Duration(0.01, _DAY)
MAX_HOLD = Duration(0.1, 30 * _DAY)
ALLOWANCE = Duration(0.1, 30 * _DAY)
MAX_WAIT = Duration(1.0, 7 * _DAY)
OTHER = Duration(0.001, 365 * _DAY)

_BY_NAME = {
    "ttl": TTL,
    "timeout": TIMEOUT,
    "countdown": COUNTDOWN,
    "max_hold": MAX_HOLD,
    "allowance": ALLOWANCE,
    "max_wait": MAX_WAIT,
}


def by_name(name: str) -> Duration:
    """The range of the duration called ``name`` (``"ttl"``, ...); :data:`OTHER` if unknown."""
    return _BY_NAME.get(name, OTHER)


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def seconds(value: object, duration: Duration, what: str, *, name: str | None = None) -> float:
    """``value`` in seconds, checked against ``duration``; ``what`` opens the error message
    (``"ttl"``, ``"setting redislock_ttl"``, ``"task 'x': lock option 'ttl':"``) and ``name``
    is the lock name the error carries.

    >>> seconds(30, TTL, "ttl")
    30.0
    >>> seconds(float("inf"), TTL, "ttl")
    Traceback (most recent call last):
    ...
    celery_redislock.errors.LockConfigError: ttl must be a number of seconds from 0.1 to 604800 (7 days), got inf
    """  # noqa: E501
    checked = duration.check(value)
    if checked is None:
        raise refuse(what, duration.allowed(), value, name=name)
    return checked


def seconds_or_none(
    value: object, duration: Duration, what: str, *, name: str | None = None
) -> float | None:
    """As :func:`seconds`, but ``None`` is allowed (and returned)."""
    if value is None:
        return None
    checked = duration.check(value)
    if checked is None:
        raise refuse(what, f"{duration.allowed()} or None", value, name=name)
    return checked
