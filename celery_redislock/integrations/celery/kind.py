"""What marks a Celery task, and a message, as one of ours: the task class's marker (the modules
that ask, below the task class, ask through it) and the headers our re-publishes carry."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, ClassVar, TypeGuard

if TYPE_CHECKING:
    from ...core.options import LockOptions
    from ...core.rate_options import RateOptions
    from ...core.unique_options import UniqueOptions

__all__ = [
    "CLAIM_HEADER",
    "CONFLICTS_HEADER",
    "DUPLICATE_HEADER",
    "LINE_EXPIRED_HEADER",
    "LINE_HEADER",
    "LINE_SINCE_HEADER",
    "RATE_HEADER",
    "REDELIVERY_HEADER",
    "WORKFLOW_HEADER",
    "WORKFLOW_LEASE_HEADER",
    "LockAware",
    "is_locked_task",
]

# Headers of the same job published again: the conflict retries it had (kept apart from the
# task's own ``retries``); the line hand-over it claims, and whether its wait ended; when it
# first joined a line (time.time()); the request id holding its reserved rate slot; how often a
# delivery finding another delivery of the task holding its lease waited to learn its end.
CONFLICTS_HEADER = "redislock_conflicts"
# On every message of a unique call that claims its key: the claim (``{"namespace": ...,
# "key": ...}``), so that a worker discarding the message unread (an older deploy without the
# task) gives the claim up without the task's definition.
CLAIM_HEADER = "redislock_claim"
LINE_HEADER = "redislock_line"
LINE_EXPIRED_HEADER = "redislock_line_expired"
LINE_SINCE_HEADER = "redislock_line_since"
RATE_HEADER = "redislock_rate"
REDELIVERY_HEADER = "redislock_redelivered"
DUPLICATE_HEADER = "redislock_duplicate"  # a workflow's step published to fail at once
# On every link of a locked workflow (lock_workflow): ``{"lock": <its lock, JSON>, "link": i}``;
# and on each link after the first, the workflow's lease it goes on with (see core.run.workflow).
WORKFLOW_HEADER = "redislock_workflow"
WORKFLOW_LEASE_HEADER = "redislock_workflow_lease"


class LockAware:
    """Mixed into :class:`~celery_redislock.integrations.celery.task.LockedTask`: its options
    as parsed when the task class was made (``None``: not declared)."""

    lock_options: ClassVar[LockOptions | None] = None
    """The execution lock: ``lock=`` as parsed, or the one ``unique=`` implies."""
    unique_options: ClassVar[UniqueOptions | None] = None
    rate_options: ClassVar[RateOptions | None] = None
    """``rate=`` as parsed: a fleet-wide rate limit on the task's starts."""
    call_signature: ClassVar[inspect.Signature | None] = None

    @classmethod
    def declares(cls) -> bool:
        """Whether the task declares ``lock=``, ``unique=`` or ``rate=``."""
        return (cls.lock_options, cls.unique_options, cls.rate_options) != (None, None, None)

    # What the modules below the task class read of a task (Celery's Task has them; declared
    # here for the type checker only, so that nothing below imports the task class).
    if TYPE_CHECKING:
        name: str
        app: Any
        request: Any
        Request: Any
        expires: Any
        acks_late: bool
        time_limit: Any
        ignore_result: bool
        backend: Any

        def signature_from_request(self, *args: Any, **kwargs: Any) -> Any: ...
        def retry(self, *args: Any, **kwargs: Any) -> Any: ...
        def unique_spec(self) -> Any: ...


def is_locked_task(task: object) -> TypeGuard[LockAware]:
    """Whether ``task`` is a task of a :class:`LockedTask` class (declared options or not)."""
    return isinstance(task, LockAware)
