"""The ``unique=`` task option: which copies of a call may be queued or run at once. Parsed and
checked once, when the task is defined; the claim it implies lives in :mod:`.claims`."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Literal, TypedDict, get_args

from ..errors import LockConfigError
from ._validate import one_of
from .durations import ALLOWANCE, seconds_or_none
from .options import (
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

Lifecycle = Literal["until_started", "until_finished", "while_running", "until_and_while_running"]
OnDuplicate = Literal["existing", "raise", "replace"]

LIFECYCLES: tuple[Lifecycle, ...] = get_args(Lifecycle)
ON_DUPLICATE: tuple[OnDuplicate, ...] = get_args(OnDuplicate)
_RUNS_LOCKED = ("until_finished", "while_running", "until_and_while_running")


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

    @property
    def queued(self) -> bool:
        """Whether a copy claims the key while its message is queued (all but while_running)."""
        return self.lifecycle != "while_running"

    @property
    def running_counts(self) -> bool:
        """Whether a running copy makes a new call a duplicate (until_finished)."""
        return self.lifecycle == "until_finished"


def parse_unique_option(
    task: str,
    signature: inspect.Signature | None,
    value: Lifecycle | UniqueOptionDict | Literal[False] | None,
    lock: LockOptions | None,
) -> tuple[UniqueOptions | None, LockOptions | None]:
    """Checks a task's ``unique=`` option and returns it parsed, with the task's execution lock.

    ``value`` is ``None``/``False``, a lifecycle name, or a mapping of ``lifecycle``, ``key``,
    ``scope``, ``on_duplicate`` and ``allowance``. The lifecycles that hold the key while the task
    runs use the task's ``lock=`` as that run lock (it must then be exclusive, and gives the key),
    or imply one with the unique key.

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
    on_duplicate = opts.get("on_duplicate")
    if on_duplicate is not None:
        on_duplicate = one_of(on_duplicate, ON_DUPLICATE, what("on_duplicate"))
    allowance = seconds_or_none(opts.get("allowance"), ALLOWANCE, what("allowance"))
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
        keying = lock
    elif lock is not None and not own:
        keying = LockOptions(key=lock.key, scope=lock.scope, fields=lock.fields)
    else:
        keying = parse_keying(task, signature, opts, "unique")
    if lifecycle in _RUNS_LOCKED and lock is None:
        # The run lock is implied, on the same key. A copy queued while another runs
        # (until_and_while_running) waits its turn by default instead of being skipped.
        retry = lifecycle == "until_and_while_running"
        lock = replace(keying, on_conflict="retry" if retry else None)
    return UniqueOptions(lifecycle, keying, on_duplicate, allowance), lock
