"""What a :class:`~celery_redislock.core.run.run.LockedRun` is built from, filled in by the
adapters: a task's parsed options, one delivery's facts, its framework's rules, the settings
it reads and the signals it sends."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ...errors import DuplicateTask
from ..lock import Lock
from ..naming import lock_name, tenant_of
from ..options import LockOptions
from ..rate_options import RateOptions
from ..unique_options import UniqueOptions

__all__ = [
    "Delivery",
    "DuplicateMark",
    "Framework",
    "RunSettings",
    "SignalLike",
    "Signals",
    "TaskSpec",
]


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task's ``lock=``, ``unique=`` and ``rate=`` as parsed (``None``: not declared)."""

    name: str
    lock: LockOptions | None
    unique: UniqueOptions | None
    rate: RateOptions | None
    signature: inspect.Signature | None

    def name_of(self, keying: LockOptions, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The name a call takes under ``keying`` (the lock's, the unique key's, the rate's)."""
        return lock_name(self.name, keying, self.signature, args, kwargs)

    def tenant_of(
        self, options: LockOptions, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[str, int] | None:
        """A call's tenant and priority in the task line (``None``: the lock has no tenant)."""
        return tenant_of(self.name, options, self.signature, args, kwargs)


@dataclass(frozen=True, slots=True)
class Framework:
    """How a framework differs, as values (one per adapter)."""

    word: str
    """What a run is called in error messages: ``"task"`` (Celery), ``"job"`` (RQ)."""
    republish_claims: bool
    """A run that comes back is published again through the producer's side, which keeps its
    unique claim (Celery); otherwise the run keeps it itself (RQ)."""
    own_retries: bool
    """``count_retries=True`` retries through the framework's own retry (Celery's
    ``task.retry``); otherwise a conflict fails the run and the framework's retry policy
    decides (RQ's ``retry=``)."""
    whole_seconds: bool
    """Delays are whole seconds, at least 1 (RQ's scheduler)."""
    rate_wait_in_place: float
    """A rate slot at most this far ahead is waited for in the process."""
    rate_back_early: float = 0.0
    """A run sent back for its rate slot comes back this early (and waits the rest in place)."""


@dataclass(frozen=True, slots=True)
class DuplicateMark:
    """What a duplicate published on purpose carries: a workflow's step (its id fixed in
    advance) that the framework publishes from a run that just ended, where an error would
    break that run's own ending. Its run fails at once with :class:`DuplicateTask`, so that
    the workflow sees the answer (``holder``: the copy holding unique key ``name``, ``state``
    ``"queued"``, ``"running"`` or ``"started"``)."""

    holder: str
    name: str
    state: str

    def encode(self) -> dict[str, str]:
        return {"holder": self.holder, "name": self.name, "state": self.state}

    @classmethod
    def decode(cls, value: object) -> DuplicateMark | None:
        """The mark a message carries (``None``: none, or not one of ours)."""
        if not isinstance(value, Mapping):
            return None
        holder, name, state = value.get("holder"), value.get("name"), value.get("state")
        if isinstance(holder, str) and isinstance(name, str) and isinstance(state, str):
            return cls(holder, name, state)
        return None

    def error(self, who: str, expires_in: float | None = None) -> DuplicateTask:
        return DuplicateTask(
            f"{who}: a copy ({self.holder}) is already {self.state} under unique key "
            f"{self.name!r} (a step of a workflow, whose id is fixed: not run)",
            name=self.name,
            task_id=self.holder,
            expires_in=expires_in,
            state=self.state,
        )


@dataclass(frozen=True, slots=True)
class Delivery:
    """The facts of one delivery of a task."""

    id: str
    """The task id (RQ: the job id)."""
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    queued: bool = True
    """Delivered by a worker (not an eager call, not a direct call): it can come back later and
    its unique claim is its own."""
    finish_job: str | None = None
    """The job a finished run is recorded under, so that a copy of it delivered again is
    dropped (``None``: no copy can come, no record)."""
    conflicts: int = 0
    """Conflict retries (and backend-error retries) before this delivery."""
    waits: int = 0
    """Looks for a first delivery of the same job before this one."""
    republished: bool = False
    """A retry of an earlier run (a newer copy queued meanwhile does not supersede it)."""
    line_token: str | None = None
    """Its entry in the lock's task line (parked before, or handed the lock)."""
    line_ended: bool = False
    """Its wait in the task line is over without the lock: it fails, not run."""
    line_waited: float = 0.0
    """Seconds it waited in the task line before this delivery."""
    payload: Callable[[Lock, str], str] | None = None
    """Its task line entry (what is published again when the lock is handed to it), given the
    lock and the entry's token."""
    rate_request: str = ""
    """The id its rate slot is reserved under."""
    rate_came_back: bool = False
    """Sent back for its rate slot before: it waits the rest in place."""
    max_hold: float | None = None
    """The framework's longest hold of a lease (its time limit), unless ``max_hold=`` says."""
    duplicate: DuplicateMark | None = None
    """Published as a duplicate on purpose (a workflow's step): it fails at once, not run."""


class RunSettings(Protocol):
    """The settings a run reads (Celery's and RQ's ``Settings`` both have them)."""

    @property
    def namespace(self) -> str: ...
    @property
    def ttl(self) -> float: ...
    @property
    def on_conflict(self) -> str: ...
    @property
    def on_backend_error(self) -> str: ...
    @property
    def queue_allowance(self) -> float: ...
    @property
    def completion_ttl(self) -> float: ...
    @property
    def fence_keep(self) -> float: ...
    @property
    def line_handover_window(self) -> float: ...
    @property
    def redlock_urls(self) -> tuple[str, ...] | None: ...


class SignalLike(Protocol):
    """Celery's ``Signal`` and :class:`celery_redislock.core.signal.Signal` alike."""

    @property
    def receivers(self) -> Any: ...
    def send(self, sender: Any, **named: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class Signals:
    """The five signals a run sends, and the ``sender`` they name (Celery: the task object;
    RQ: the job function's name)."""

    acquired: SignalLike
    released: SignalLike
    conflict: SignalLike
    lost: SignalLike
    backend_error: SignalLike
    sender: Any
