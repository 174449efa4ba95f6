"""The task base class that reads the ``lock=`` option."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, Literal

from celery import Task

from ...core.lease import Lease
from ...core.options import LockOption, call_signature, parse_lock_option
from ...core.rate_options import RateOptionDict, parse_rate_option
from ...core.unique_options import Lifecycle, UniqueOptionDict, parse_unique_option
from ...errors import DuplicateTask, TaskSkipped
from .guard import check_cancel_pool
from .kind import LockAware
from .publish import wrap_send_task
from .receivers import LOCK_REQUEST, check_request_class, connect_receivers
from .registry import Spec, spec_of
from .run import current_run, release_at_body_end, release_for_retry, start, workflow_declared

__all__ = ["LockedTask"]


class LockedTask(Task, LockAware):  # type: ignore[misc]
    """Base class for tasks that declare ``lock=``: use it as the app's ``task_cls`` (or call
    :func:`celery_redislock.install`).

    The lease is taken in :meth:`before_start` (where Celery honours ``Ignore`` and ``Retry``),
    renewed by the process's heartbeat while the task runs, and released when the run ends; a
    worker's parent process releases what a killed child held (see :class:`LockRequest`).

    >>> app = Celery("proj", task_cls="celery_redislock:LockedTask")    # doctest: +SKIP
    >>> @app.task(lock={"key": "sync:{customer_id}", "on_conflict": "retry"})  # doctest: +SKIP
    ... def sync_customer(customer_id): ...
    """

    Request = LOCK_REQUEST

    lock: LockOption = None
    """The ``lock=`` option as declared: True, a key template, or a dict of options."""
    unique: Lifecycle | UniqueOptionDict | Literal[False] | None = None
    """The ``unique=`` option as declared: a lifecycle name, or a dict of options."""
    rate: str | RateOptionDict | None = None
    """The ``rate=`` option as declared: a rate (``"100/m"``), or a dict of options."""
    call_signature: ClassVar[inspect.Signature | None] = None
    throws: ClassVar[tuple[type[BaseException], ...]] = (TaskSkipped, DuplicateTask)
    """Errors Celery logs at INFO without a traceback: a run skipped, or a duplicate in a
    workflow, is an expected outcome (a task's own ``throws=`` is kept, these added)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        throws = tuple(cls.throws or ())
        cls.throws = throws + tuple(e for e in (TaskSkipped, DuplicateTask) if e not in throws)
        if not {"lock", "unique", "rate", "run"} & cls.__dict__.keys():
            return  # an abstract base Celery derives: nothing declared here
        run = cls.__dict__.get("run", getattr(cls, "run", None))
        bound = not isinstance(run, staticmethod)  # Celery stores unbound runs as staticmethods
        fun = run.__func__ if isinstance(run, staticmethod) else run
        name = cls.__dict__.get("name") or cls.__name__
        cls.call_signature = call_signature(fun, bound) if callable(fun) else None
        lock = parse_lock_option(name, cls.call_signature, cls.lock)
        cls.unique_options, cls.lock_options = parse_unique_option(
            name, cls.call_signature, cls.unique, lock
        )
        cls.rate_options = parse_rate_option(name, cls.call_signature, cls.rate)
        cls._unique_spec = None

    @classmethod
    def bind(cls, app: Any) -> Any:
        if cls.lock_options is not None:  # the final Request: class body or task options
            check_request_class(cls.name, cls.Request, final=False)
        bound = super().bind(app)
        if cls.unique_options is not None and cls.unique_options.on_duplicate == "cancel":
            # (as configured; the worker checks the pool it runs, -P included, as it starts)
            check_cancel_pool(app, app.conf.worker_pool, [cls.name])
        connect_receivers()  # the first locked task bound (or install()) connects them
        if cls.unique_options is not None and cls.unique_options.at_send:
            wrap_send_task(app)  # also for apps that set task_cls= without install()
        return bound

    _unique_spec: ClassVar[Spec | None] = None

    def unique_spec(self) -> Spec | None:
        """What a producer needs to check a call of this task for duplicates (None: not
        unique while queued)."""
        spec = type(self)._unique_spec
        if spec is None and self.unique_options is not None:
            spec = type(self)._unique_spec = spec_of(self)
        return spec

    @property
    def lease(self) -> Lease | None:
        """The lease the current run holds (``None`` outside a locked run). ``lease.check()``
        raises :class:`LockLost` if the heartbeat found it lost."""
        run = current_run(self)
        return run.lease if run is not None else None

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        if self.declares() or workflow_declared(self.request):
            start(self, task_id, args, kwargs)
        super().before_start(task_id, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            return super().__call__(*args, **kwargs)  # a plain function call: no lock
        # Run by the worker (the request is already pushed): released as the body ends.
        try:
            return self.run(*args, **kwargs)
        finally:
            release_at_body_end(self, request)

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        # The lock goes back before the retry is published (see release_for_retry).
        release_for_retry(self)
        return super().retry(*args, **kwargs)
