"""The ``rate=`` task option: a fleet-wide rate limit on a task's starts, by key, parsed and
checked once, when the task is defined (Celery tasks and RQ jobs alike)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, TypedDict

from ..errors import LockConfigError
from .durations import seconds_or_none
from .options import KeyFunction, LockOptions, Scope, known_options, option_what, parse_keying
from .rate import MAX_DELAY, Rate, parse_rate

__all__ = ["RateOptionDict", "RateOptions", "parse_rate_option"]


class RateOptionDict(TypedDict, total=False):
    """The dict form of a task's ``rate=`` option (``rate`` is required).

    >>> from celery_redislock.core.rate_options import RateOptionDict
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

    >>> from celery_redislock.core.rate_options import parse_rate_option
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
