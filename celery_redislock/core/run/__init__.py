"""The locked run, once for every framework: a task's parsed options and the facts of one
delivery in, a typed outcome out (see :mod:`.run`)."""

from .delivery import Delivery, DuplicateMark, Framework, RunSettings, Signals, TaskSpec
from .outcome import (
    AwaitFirst,
    Fail,
    Finished,
    Held,
    Outcome,
    Parked,
    RetryAfter,
    RunUnlocked,
    Skip,
)
from .run import LockedRun, locks_of_call, make_lock

__all__ = [
    "AwaitFirst",
    "Delivery",
    "DuplicateMark",
    "Fail",
    "Finished",
    "Framework",
    "Held",
    "LockedRun",
    "Outcome",
    "Parked",
    "RetryAfter",
    "RunSettings",
    "RunUnlocked",
    "Signals",
    "Skip",
    "TaskSpec",
    "locks_of_call",
    "make_lock",
]
