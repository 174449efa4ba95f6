"""The task base class that reads the ``lock=`` option."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from celery import Task
from celery.signals import task_postrun, worker_init, worker_process_shutdown

from ..lock import Lease
from . import runtime, settings
from .enqueue import Spec, wrap_send_task
from .options import LockOptions, call_signature, parse_lock_option
from .unique import UniqueOptions, parse_unique_option

__all__ = ["LockedTask"]


class LockedTask(Task):  # type: ignore[misc]
    """Base class for tasks that declare ``lock=``: use it as the app's ``task_cls`` (or call
    :func:`celery_redislock.install`).

    The lease is taken in :meth:`before_start` (where Celery honours ``Ignore`` and ``Retry``),
    renewed by the process's renewer while the task runs, and released when the run ends; a
    worker's parent process releases what a killed child held (see :class:`LockRequest`).

    >>> app = Celery("proj", task_cls="celery_redislock:LockedTask")    # doctest: +SKIP
    >>> @app.task(lock={"key": "sync:{customer_id}", "on_conflict": "retry"})
    ... def sync_customer(customer_id): ...
    """

    Request = "celery_redislock.tasklock.request:LockRequest"

    lock: Any = None
    """The ``lock=`` option as declared: True, a key template, or a dict of options."""
    unique: Any = None
    """The ``unique=`` option as declared: a lifecycle name, or a dict of options."""
    lock_options: ClassVar[LockOptions | None] = None
    """The execution lock: ``lock=`` as parsed, or the one ``unique=`` implies."""
    unique_options: ClassVar[UniqueOptions | None] = None
    call_signature: ClassVar[inspect.Signature | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not {"lock", "unique", "run"} & cls.__dict__.keys():
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
        cls._unique_spec = None

    @classmethod
    def bind(cls, app: Any) -> Any:
        bound = super().bind(app)
        if cls.unique_options is not None and cls.unique_options.queued:
            wrap_send_task(app)  # also for apps that set task_cls= without install()
        return bound

    _unique_spec: ClassVar[Spec | None] = None

    def unique_spec(self) -> Spec | None:
        """What a producer needs to check a call of this task for duplicates (None: not
        unique while queued)."""
        spec = type(self)._unique_spec
        if spec is None and self.unique_options is not None:
            spec = type(self)._unique_spec = Spec.of(self)
        return spec

    @property
    def lease(self) -> Lease | None:
        """The lease the current run holds (``None`` outside a locked run). ``lease.check()``
        raises :class:`LockLost` if the renewer found it lost."""
        return runtime.held_lease(self)

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        if self.lock_options is not None or self.unique_options is not None:
            runtime.acquire_for(self, task_id, args, kwargs)
        super().before_start(task_id, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.request.called_directly:
            return super().__call__(*args, **kwargs)  # a plain function call: no lock
        # Run by the worker (the request is already pushed): release as the body ends, before
        # the result is stored, so whoever waits on the result finds the lock free (an
        # acks_late delivery: just after, with the record that it finished; see end_run).
        try:
            return self.run(*args, **kwargs)
        finally:
            runtime.release_at_body_end(self)

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        # Give the lock back before the retry is published, so the retried run cannot find it
        # still held by this very run and be skipped as a duplicate. A job unique until it
        # finishes first claims its key as queued, so no other copy slips in between.
        runtime.keep_claim_for_retry(self)
        runtime.release_held(self)
        return super().retry(*args, **kwargs)


def _release_after_run(
    sender: Any = None, task_id: Any = None, args: Any = (), kwargs: Any = None, **info: Any
) -> None:
    # Normally released already (__call__); this covers a run whose body never started, and
    # an acks_late delivery, released here with the record that it finished.
    # task_postrun fires for every ending, RETRY, IGNORED and REJECTED included (after_return
    # does not), in the process that ran the task, while its request is still current.
    if isinstance(sender, LockedTask):
        runtime.end_run(sender, info.get("state"))
        if info.get("state") in ("FAILURE", "REJECTED"):
            # The job is over (it may have failed before it started): its queued claim goes.
            runtime.end_claim(sender, task_id, args, kwargs or {})


def _release_at_shutdown(**_: Any) -> None:
    runtime.release_all_held()


task_postrun.connect(_release_after_run, weak=False)
worker_process_shutdown.connect(_release_at_shutdown, weak=False)


def _freeze_settings(sender: Any = None, **_: Any) -> None:
    # A worker's configuration is final once it starts (pool children inherit this). Not so
    # for a worker started inside a test process, whose tests may go on changing app.conf.
    if type(sender).__name__ != "TestWorkController":
        settings.freeze()


worker_init.connect(_freeze_settings, weak=False)
