"""The ``unique=`` task option: which copies of a call may be queued or run at once. Parsed and
checked once, when the task is defined; the claim it implies lives in :mod:`.claims`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, TypedDict, get_args

from ..errors import LockConfigError
from ._validate import one_of
from .durations import ALLOWANCE, PERIOD, seconds_or_none
from .options import (
    ConflictAction,
    KeyFunction,
    LockOptions,
    Scope,
    known_options,
    option_what,
    parse_keying,
)

__all__ = [
    "LIFECYCLES",
    "ON_DUPLICATE",
    "Lifecycle",
    "OnDuplicate",
    "UniqueOptionDict",
    "UniqueOptions",
    "parse_unique_option",
]

Lifecycle = Literal[
    "until_started",
    "until_finished",
    "while_running",
    "until_and_while_running",
    "keep_last",
    "once_per_period",
    "debounce",
]
OnDuplicate = Literal["existing", "raise", "replace", "cancel"]

LIFECYCLES: tuple[Lifecycle, ...] = get_args(Lifecycle)
ON_DUPLICATE: tuple[OnDuplicate, ...] = get_args(OnDuplicate)
_RUNS_LOCKED = ("until_finished", "while_running", "until_and_while_running", "keep_last")
# keep_last: the pending call must wait its turn, never be dropped.
_KEEP_LAST_CONFLICT = ("queue", "retry", "wait")


class UniqueOptionDict(TypedDict, total=False):
    """The dict form of a task's ``unique=`` option; every key may be left out (the lifecycle
    is then ``until_finished``; ``None`` values take the app's settings).

    >>> opts: UniqueOptionDict = {"lifecycle": "until_started", "key": "report:{day}"}
    """

    lifecycle: Lifecycle
    key: str | KeyFunction | None
    scope: Scope
    on_duplicate: OnDuplicate | None
    allowance: float | None
    period: float | None
    max_wait: float | None


# The option names, in the order errors list them: the dict form's keys, so they cannot drift.
_ALLOWED = tuple(UniqueOptionDict.__annotations__)


@dataclass(frozen=True, slots=True)
class UniqueOptions:
    """A task's ``unique=`` option, parsed (``None`` fields take the app's settings)."""

    lifecycle: Lifecycle
    keying: LockOptions
    """Where the key comes from (``key`` and ``scope``): the same derivation as ``lock=``."""
    on_duplicate: OnDuplicate | None = None
    allowance: float | None = None
    """Seconds a queued claim lasts beyond the message's countdown/ETA."""
    period: float | None = None
    """once_per_period: seconds the key stays taken from a run's start, whatever its outcome;
    debounce: the quiet period after the latest call before the pending call is published."""
    max_wait: float | None = None
    """debounce: seconds after the pending call's first at which it is published however
    often calls keep coming (``None``: no bound)."""

    @property
    def queued(self) -> bool:
        """Whether a copy claims the key while its message is queued (all but while_running
        and debounce, whose calls are kept in Redis until they are published)."""
        return self.lifecycle not in ("while_running", "debounce")

    @property
    def at_send(self) -> bool:
        """Whether a call is checked as it is sent (all but while_running)."""
        return self.lifecycle != "while_running"

    @property
    def debounced(self) -> bool:
        return self.lifecycle == "debounce"

    @property
    def running_counts(self) -> bool:
        """Whether a running copy makes a new call a duplicate (until_finished)."""
        return self.lifecycle == "until_finished"

    @property
    def kept_after_start(self) -> float | None:
        """Seconds the key stays taken from a run's start (once_per_period), else ``None``: it
        is given up as the run starts."""
        return self.period if self.lifecycle == "once_per_period" else None


def parse_unique_option(
    task: str,
    signature: inspect.Signature | None,
    value: Lifecycle | UniqueOptionDict | Literal[False] | None,
    lock: LockOptions | None,
) -> tuple[UniqueOptions | None, LockOptions | None]:
    """Checks a task's ``unique=`` option and returns it parsed, with the task's execution lock.

    ``value`` is ``None``/``False``, a lifecycle name, or a mapping of ``lifecycle``, ``key``,
    ``scope``, ``on_duplicate``, ``allowance`` and ``period``. The lifecycles that hold the key
    while the task runs use the task's ``lock=`` as that run lock (it must then be exclusive,
    and gives the key), or imply one with the unique key.

    >>> u, lock = parse_unique_option("report", None, "until_finished", None)
    >>> u.lifecycle, lock is not None
    ('until_finished', True)
    """
    if value is None or value is False:
        return None, lock
    if isinstance(value, str):
        value = {"lifecycle": value}
    shape = f"a lifecycle ({', '.join(LIFECYCLES)})"
    opts = known_options(task, "unique", value, _ALLOWED, shape)

    def what(option: str) -> str:
        return option_what(task, option, "unique")

    lifecycle = one_of(opts.get("lifecycle", "until_finished"), LIFECYCLES, what("lifecycle"))
    on_duplicate: OnDuplicate | None = opts.get("on_duplicate")
    if on_duplicate is not None:
        on_duplicate = one_of(on_duplicate, ON_DUPLICATE, what("on_duplicate"))
    allowance = seconds_or_none(opts.get("allowance"), ALLOWANCE, what("allowance"))
    period = seconds_or_none(opts.get("period"), PERIOD, what("period"))
    max_wait = seconds_or_none(opts.get("max_wait"), PERIOD, what("max_wait"))
    _check_times(lifecycle, period, max_wait, what)
    if lifecycle == "debounce" and on_duplicate is not None:
        raise LockConfigError(
            f"{what('on_duplicate')} lifecycle 'debounce' folds every call into the pending "
            f"one (there is no duplicate to answer), got {on_duplicate!r}"
        )
    if on_duplicate == "cancel" and lifecycle != "until_finished":
        raise LockConfigError(
            f"{what('on_duplicate')} 'cancel' stops a running copy, which only lifecycle "
            f"'until_finished' counts as a duplicate; got lifecycle {lifecycle!r}"
        )
    if lifecycle == "keep_last":
        if on_duplicate not in (None, "replace"):
            raise LockConfigError(
                f"{what('on_duplicate')} lifecycle 'keep_last' replaces the pending call with "
                f"the latest (on_duplicate 'replace'), got {on_duplicate!r}"
            )
        on_duplicate = "replace"
    # The key: lock='s for a lifecycle that runs under it, else the option's own or lock='s.
    own = [k for k in ("key", "scope") if k in opts]
    if lock is not None and lifecycle in _RUNS_LOCKED:
        if own:
            raise LockConfigError(
                f"{what(own[0])} lifecycle {lifecycle!r} holds the task's lock= while it runs, "
                "so the key comes from lock=; set key and scope there"
            )
        if lock.mode != "write" or (lock.limit or 1) > 1:
            raise LockConfigError(
                f"task {task!r}: unique lifecycle {lifecycle!r} needs an exclusive lock= "
                f"(mode 'write', no limit), got mode {lock.mode!r}, limit {lock.limit!r}"
            )
        if lifecycle == "keep_last":
            lock = _waits_its_turn(task, lock)
        keying = lock
    elif lock is not None and not own:
        keying = LockOptions(key=lock.key, scope=lock.scope, fields=lock.fields)
    else:
        keying = parse_keying(task, signature, opts, "unique")
    if lifecycle in _RUNS_LOCKED and lock is None:
        # The run lock is implied, on the same key. A copy queued while another runs
        # (until_and_while_running) waits its turn by default instead of being skipped; the
        # pending call of keep_last waits in the task line, to start as the running one ends.
        implied: dict[str, ConflictAction] = {
            "until_and_while_running": "retry",
            "keep_last": "queue",
        }
        lock = replace(keying, on_conflict=implied.get(lifecycle))
    return UniqueOptions(lifecycle, keying, on_duplicate, allowance, period, max_wait), lock


def _check_times(
    lifecycle: str, period: float | None, max_wait: float | None, what: Callable[[str], str]
) -> None:
    timed = ("once_per_period", "debounce")
    if lifecycle in timed and period is None:
        meaning = (
            "the seconds the key stays taken from a run's start"
            if lifecycle == "once_per_period"
            else "the quiet seconds after the latest call before it is published"
        )
        raise LockConfigError(
            f"{what('period')} lifecycle {lifecycle!r} needs a period: {meaning} "
            f"({PERIOD.allowed()})"
        )
    if lifecycle not in timed and period is not None:
        raise LockConfigError(
            f"{what('period')} only lifecycles 'once_per_period' and 'debounce' take a "
            f"period, not {lifecycle!r}"
        )
    if max_wait is not None and lifecycle != "debounce":
        raise LockConfigError(
            f"{what('max_wait')} only lifecycle 'debounce' takes a max_wait, not {lifecycle!r}"
        )
    if max_wait is not None and period is not None and max_wait < period:
        raise LockConfigError(
            f"{what('max_wait')} {max_wait:g}s is shorter than the period ({period:g}s): a "
            "debounced call would be published before it was ever quiet; make it at least "
            "the period"
        )


def _waits_its_turn(task: str, lock: LockOptions) -> LockOptions:
    """keep_last's run lock: a pending call that meets the running one waits (the task line
    unless lock= says otherwise); skipping or raising would lose the latest call."""
    if lock.on_conflict is None:
        return replace(lock, on_conflict="queue")
    if lock.on_conflict not in _KEEP_LAST_CONFLICT:
        raise LockConfigError(
            f"task {task!r}: unique lifecycle 'keep_last' needs its lock= to wait its turn "
            f"(on_conflict one of {', '.join(_KEEP_LAST_CONFLICT)}), got "
            f"{lock.on_conflict!r}: the pending call would be lost"
        )
    return lock
