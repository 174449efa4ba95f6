"""What :meth:`LockedRun.take <celery_redislock.core.run.run.LockedRun.take>` answers, one value
per way a delivery goes on (already logged and signalled): an adapter turns it into its
framework's answer (Celery's ``Ignore``, ``Retry``, ``Reject``; RQ's return value or ``Retry``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ...errors import TaskSkipped
from .. import outcomes
from ..lease import Lease
from ..line import Parked as Place

__all__ = [
    "AwaitFirst",
    "Fail",
    "Finished",
    "Held",
    "Outcome",
    "Parked",
    "RetryAfter",
    "RunUnlocked",
    "Skip",
]


@dataclass(frozen=True, slots=True)
class Held:
    """Run the body: ``lease`` is the lease taken (``None``: the options ask for none, only a
    rate slot or a unique claim)."""

    lease: Lease | None


@dataclass(frozen=True, slots=True)
class RunUnlocked:
    """Run the body without the lock: the lock Redis failed under ``on_backend_error="run"``."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class Skip:
    """Not run, not failed: ``on_conflict="skip"`` (``kind="skipped"``), or a copy replaced or
    outlived under its unique key (``kind="superseded"``)."""

    kind: Literal["skipped", "superseded"]
    lock: str
    holders: list[str]

    def error(self, who: str) -> TaskSkipped:
        """The error a framework whose callers wait for an answer ends the run with (``who``:
        the run, e.g. ``task add[id]``)."""
        if self.kind == "superseded":
            why = f"superseded by {', '.join(self.holders)} under unique key {self.lock!r}"
        else:
            why = f"lock {self.lock!r} is held by {outcomes.held_by(self.holders)}"
        return TaskSkipped(
            f"{who} skipped: {why}", name=self.lock, holders=list(self.holders), outcome=self.kind
        )


@dataclass(frozen=True, slots=True)
class Finished:
    """A copy of a job recorded as finished (a redelivery after a lost ack): dropped."""

    lock: str
    holders: list[str]


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """Come back in ``delay`` seconds as the same job: a conflict retry, the lock Redis failing
    under ``on_backend_error="retry"``, or a rate slot ahead (``cause``). ``conflicts``: the
    conflict retries before this one. ``own``: the framework's own retry, counted against the
    task's ``max_retries`` (``count_retries=True``), failing with ``error`` past it."""

    delay: float
    cause: Literal["conflict", "backend", "rate"]
    why: str
    conflicts: int = 0
    own: bool = False
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class AwaitFirst:
    """Another delivery of this very job holds the lease: look again in ``delay`` seconds
    (``waits``: the looks before this one)."""

    delay: float
    waits: int


@dataclass(frozen=True, slots=True)
class Parked:
    """Waits in the lock's task line (``on_conflict="queue"``) at ``place``."""

    place: Place
    lock: str
    holders: list[str]
    max_wait: float


@dataclass(frozen=True, slots=True)
class Fail:
    """Fails with ``error`` without running (``raise``, ``wait`` past its timeout, retries
    given up, the line full or its wait over, the lock Redis failing under ``fail``).
    ``mark``: what RQ records in the job's meta (``"expired"``, ``"full"``), if anything."""

    error: BaseException
    mark: str | None = None
    lock: str = ""
    holders: list[str] = field(default_factory=list)


Outcome = Held | RunUnlocked | Skip | Finished | RetryAfter | AwaitFirst | Parked | Fail
"""Every answer of :meth:`LockedRun.take`."""
