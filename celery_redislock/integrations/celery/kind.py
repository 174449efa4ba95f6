"""What marks a Celery task as one of ours. The modules that ask (publish, execution, the
receivers) sit below the task class, which imports them; they ask through this marker."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, TypeGuard

if TYPE_CHECKING:
    from ...core.options import LockOptions
    from ...core.rate_options import RateOptions
    from ...core.unique_options import UniqueOptions
    from .task import LockedTask

__all__ = ["LockAware", "is_locked_task"]


class LockAware:
    """Mixed into :class:`~celery_redislock.integrations.celery.task.LockedTask`: its options
    as parsed when the task class was made (``None``: not declared)."""

    lock_options: ClassVar[LockOptions | None] = None
    """The execution lock: ``lock=`` as parsed, or the one ``unique=`` implies."""
    unique_options: ClassVar[UniqueOptions | None] = None
    rate_options: ClassVar[RateOptions | None] = None
    """``rate=`` as parsed: a fleet-wide rate limit on the task's starts."""


def is_locked_task(task: object) -> TypeGuard[LockedTask]:
    """Whether ``task`` is a task of a :class:`LockedTask` class (declared options or not)."""
    return isinstance(task, LockAware)
