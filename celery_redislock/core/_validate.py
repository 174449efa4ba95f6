"""The checks of the values the package is given (arguments, task options, settings), each
written once, so one kind of value is refused in the same words wherever it is given:
``"{what} must be {allowed}, got {value!r}"`` (:class:`~celery_redislock.LockConfigError`),
``what`` opening it (``"setting redislock_ttl"``, ``"task 'x': lock option 'limit':"``) and
``name`` the lock name the error carries, if any.
"""

from __future__ import annotations

import math
import numbers
from typing import TypeVar

from ..errors import LockConfigError

__all__ = ["finite_real", "int_at_least", "non_empty_string", "one_of", "refuse", "true_or_false"]

T = TypeVar("T")


def refuse(what: str, allowed: str, value: object, *, name: str | None = None) -> LockConfigError:
    """The error for ``value``, which is not ``allowed`` (raise it)."""
    return LockConfigError(f"{what} must be {allowed}, got {value!r}", name=name)


def finite_real(value: object) -> float | None:
    """``value`` as a float if it is a finite real number, else ``None``. A ``bool`` is not a
    number here (``True`` seconds or holders is a mistake), nor is NaN or an infinity.

    >>> finite_real(2), finite_real(True), finite_real(float("nan")), finite_real("1")
    (2.0, None, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def int_at_least(
    value: object, low: int, what: str, *, or_none: bool = False, name: str | None = None
) -> int | None:
    """``value`` if it is an ``int`` (not a ``bool``) of at least ``low``; ``None`` passes when
    ``or_none``.

    >>> int_at_least(0, 1, "limit", or_none=True)
    Traceback (most recent call last):
    ...
    celery_redislock.errors.LockConfigError: limit must be an integer >= 1 or None, got 0
    """
    if value is None and or_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise refuse(what, f"an integer >= {low}{' or None' if or_none else ''}", value, name=name)
    return value


def one_of(value: object, allowed: tuple[T, ...], what: str, *, listed: str | None = None) -> T:
    """The choice of ``allowed`` that ``value`` is; ``listed`` words them in the error (by
    default ``one of 'a', 'b'``).

    >>> one_of("host", ("global", "host"), "scope")
    'host'
    """
    for choice in allowed:
        if value == choice:
            return choice
    raise refuse(what, listed or f"one of {', '.join(map(repr, allowed))}", value)


def true_or_false(value: object, what: str) -> bool:
    """``value`` if it is a ``bool`` (``1`` is refused: it is not a flag's spelling)."""
    if not isinstance(value, bool):
        raise refuse(what, "True or False", value)
    return value


def non_empty_string(
    value: object, what: str, *, name: str | None = None, without: str = ""
) -> str:
    """``value`` if it is a non-empty ``str`` holding none of the characters ``without``."""
    if not isinstance(value, str) or not value or any(c in value for c in without):
        allowed = "a non-empty string"
        if without:
            allowed += f" without {' or '.join(map(repr, without))}"
        raise refuse(what, allowed, value, name=name)
    return value
