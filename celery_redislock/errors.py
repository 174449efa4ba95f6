"""The exception tree.

Every error the package raises derives from :class:`RedisLockError`::

    RedisLockError                  base; ``.name`` is the lock's name (or None)
    ├── LockConfigError             bad arguments (also a ValueError)
    ├── LockNotAcquired             acquire() gave up: non-blocking, or the timeout passed
    │   └── LineFull                the task line holds its maximum of parked tasks
    ├── LockNotOwned                release/renew of a lease this token does not hold
    │   └── LockLost                a lease held earlier expired or was removed
    ├── LockUpgradeError            an owner holding a read lease asked for write
    ├── LockBackendError            Redis could not be reached or answered with an error
    ├── JobFinished                 acquire(job=...): that job is recorded as finished already
    ├── DuplicateTask               a unique task is already queued or running (not published)
    └── TaskSkipped                 a task run was skipped: its lock was held (not run)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DuplicateTask",
    "JobFinished",
    "LineFull",
    "LockBackendError",
    "LockConfigError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "LockUpgradeError",
    "RedisLockError",
    "TaskSkipped",
]


class RedisLockError(Exception):
    """Root of every error raised by celery_redislock; carries the lock name.

    Every error survives a round trip through pickle with its class and attributes, and can be
    rebuilt from its message alone (the attributes then ``None``): Celery stores a task's
    exception one way or the other, and falls back to a base class it can rebuild otherwise.
    """

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(
    cls: type[RedisLockError], args: tuple[Any, ...], state: dict[str, Any]
) -> RedisLockError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class LockConfigError(RedisLockError, ValueError):
    """An argument is invalid; the message names the argument and what is allowed."""


class LockNotAcquired(RedisLockError):
    """The lock was not acquired: it was held and the call would not (or no longer) wait.

    ``owner_expires_in`` is set (seconds) when the lock was refused because the call's own
    ``owner`` holds a live lease already (``reentrant=False``): that lease's time left.
    ``retry_after`` is set (seconds) when the refusal says when a try could succeed: a rate
    limit's next free slot, past the task's ``max_delay``.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        timeout: float | None = None,
        owner_expires_in: float | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, name=name)
        self.timeout = timeout
        self.owner_expires_in = owner_expires_in
        self.retry_after = retry_after


class LineFull(LockNotAcquired):
    """A task could not park in the lock's task line: it holds ``max_waiting`` parked tasks
    already (``parked``: how many)."""

    def __init__(self, message: str, *, name: str | None = None, parked: int = 0) -> None:
        super().__init__(message, name=name)
        self.parked = parked


class LockNotOwned(RedisLockError):
    """The lease is not held by this token (released, expired, or never held)."""

    def __init__(self, message: str, *, name: str | None = None, token: str | None = None) -> None:
        super().__init__(message, name=name)
        self.token = token


class LockLost(LockNotOwned):
    """A lease that was held has expired or was removed before its holder let go."""


class LockUpgradeError(RedisLockError):
    """The owner holds a read lease and asked for write; upgrades are refused (deadlock-prone)."""


class LockBackendError(RedisLockError):
    """Redis was unreachable or failed; the original redis-py error is the ``__cause__``."""


class JobFinished(RedisLockError):
    """``acquire(job=...)`` was refused: that job was recorded as finished under this lock
    (:meth:`Lock.finish_job`), so another delivery of it must not run again."""

    def __init__(self, message: str, *, name: str | None = None, job: str | None = None) -> None:
        super().__init__(message, name=name)
        self.job = job


class DuplicateTask(RedisLockError):
    """A unique task was not published: a copy with the same key is queued or running (or, for
    ``once_per_period``, started within the period).

    ``task_id`` is the copy's id, ``expires_in`` the seconds its claim on the key has left (for a
    running copy: until its lease lapses unless renewed; ``"started"``: until the period ends),
    ``state`` ``"queued"``, ``"running"`` or ``"started"``.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        task_id: str | None = None,
        expires_in: float | None = None,
        state: str | None = None,
    ) -> None:
        super().__init__(message, name=name)
        self.task_id = task_id
        self.expires_in = expires_in
        self.state = state


class TaskSkipped(RedisLockError):
    """A task run was skipped, not run: its lock was held (``on_conflict="skip"``, ``outcome``
    ``"skipped"``), or a newer copy replaced it under its unique key (``"superseded"``).

    ``holders`` names the task ids that held the lock (the newer copy, when superseded). A
    skipped Celery run ends ``FAILURE`` with this error, so that ``.get()``, groups, chords and
    chains see it at once; Celery logs it at INFO, as an expected outcome. Its attributes are
    part of its ``args``, so that a JSON result backend (which stores ``args``) gives them back.
    """

    def __init__(
        self,
        message: str,
        name: str | None = None,
        holders: list[str] | None = None,
        outcome: str | None = None,
    ) -> None:
        super().__init__(message, name=name)
        self.holders = holders
        self.outcome = outcome
        self.args = (message, name, holders, outcome)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
