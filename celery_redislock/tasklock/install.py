"""``install(app)``: make an app's tasks lock-aware, checking ``lock=`` as tasks are declared."""

from __future__ import annotations

import functools
import logging
from typing import Any

from celery import Celery
from celery.signals import beat_init, worker_init
from celery.utils.imports import gen_task_name

from ..errors import LockConfigError
from .enqueue import publish_specs, wrap_send_task
from .options import call_signature, parse_lock_option
from .settings import check_app
from .task import LockedTask
from .unique import parse_unique_option

__all__ = ["check_worker_app", "install"]

log = logging.getLogger("celery_redislock")


def install(app: Celery) -> Celery:
    """Makes :class:`LockedTask` the app's task base and checks every ``lock=`` option when its
    ``@app.task`` decorator runs (at import time), not when the worker first runs the task.

    Call it before declaring tasks. Returns the app.

    >>> app = install(Celery("proj"))              # doctest: +SKIP
    >>> @app.task(lock="report:{day}")             # doctest: +SKIP
    ... def report(day): ...
    """
    if getattr(app, "_redislock_installed", False):
        return app
    current = app.task_cls
    if not (isinstance(current, type) and issubclass(current, LockedTask)):
        if current not in ("celery.app.task:Task", "celery_redislock:LockedTask") and not (
            isinstance(current, str) and current.endswith(":LockedTask")
        ):
            raise LockConfigError(
                f"install(app): the app's task_cls is {current!r}; derive it from "
                "celery_redislock.LockedTask instead"
            )
        app.task_cls = LockedTask
        app.__dict__.pop("Task", None)  # the cached base class, if already made
    if app.finalized:
        _check_tasks(app)
    app.task = _checking(app, app.task)
    wrap_send_task(app)  # every publish, by any producer in this process, passes here
    app._redislock_installed = True
    return app


def _checking(app: Celery, decorator: Any) -> Any:
    @functools.wraps(decorator)
    def task(*args: Any, **opts: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not opts:
            return decorator(*args)  # bare @app.task: no options to check
        if opts.get("lock") in (None, False) and opts.get("unique") in (None, False):
            return decorator(*args, **opts)

        def declare(fun: Any) -> Any:
            _check_declaration(app, fun, opts)
            return decorator(*args, **opts)(fun)

        return declare

    return task


def _check_declaration(app: Celery, fun: Any, opts: dict[str, Any]) -> None:
    name = opts.get("name") or gen_task_name(app, fun.__name__, fun.__module__)
    base = opts.get("base")
    if base is not None and not (isinstance(base, type) and issubclass(base, LockedTask)):
        raise LockConfigError(
            f"task {name!r}: lock= and unique= need a base class derived from "
            f"celery_redislock.LockedTask, got base={base!r}"
        )
    signature = call_signature(fun, bool(opts.get("bind")))
    lock = parse_lock_option(name, signature, opts.get("lock"))
    parse_unique_option(name, signature, opts.get("unique"), lock)


def _check_tasks(app: Celery) -> None:
    unlocked = sorted(
        name
        for name, task in app.tasks.items()
        if not isinstance(task, LockedTask)
        and any(getattr(task, option, None) not in (None, False) for option in ("lock", "unique"))
    )
    if unlocked:
        raise LockConfigError(
            f"task(s) {', '.join(unlocked)} declare lock= or unique= but do not derive from "
            "celery_redislock.LockedTask: it would be ignored. Create the app with "
            "task_cls='celery_redislock:LockedTask' or call install(app) before declaring tasks"
        )


def _uses_locks(app: Celery) -> bool:
    """Whether ``app`` is one of ours: installed, or its task base (or a task) is a LockedTask."""
    task_cls = getattr(app, "task_cls", None)
    return (
        getattr(app, "_redislock_installed", False)
        or (isinstance(task_cls, type) and issubclass(task_cls, LockedTask))
        or (isinstance(task_cls, str) and task_cls.endswith(":LockedTask"))
        or any(isinstance(task, LockedTask) for task in app.tasks.values())
    )


def check_worker_app(app: Celery) -> None:
    """What a worker checks as it starts: no ``lock=``/``unique=`` that would be ignored, every
    ``redislock_*`` setting, and a Redis client for locks if any task needs one. Raises
    :class:`LockConfigError` naming the task or the setting."""
    _check_tasks(app)
    if not _uses_locks(app):
        return
    needs_redis = any(
        isinstance(task, LockedTask)
        and (task.lock_options is not None or task.unique_options is not None)
        for task in app.tasks.values()
    )
    for warning in check_app(app, needs_redis=needs_redis):
        log.warning("%s", warning)


def _check_at_worker_start(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if not isinstance(app, Celery):
        return
    try:
        check_worker_app(app)
    except LockConfigError as exc:
        # Signal.send catches and only logs an Exception a receiver raises, so raising it would
        # let the worker start and fail (or run unlocked) at every task. SystemExit is not an
        # Exception: it ends the worker before it consumes anything.
        log.critical("celery_redislock: the worker refuses to start: %s", exc)
        raise SystemExit(1) from exc
    # Producers that cannot import a unique task (beat, services sending by name) read its
    # options from Redis: publish them.
    publish_specs(app)


def _beat_publishes_unique(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    task_cls = getattr(app, "task_cls", None)
    if isinstance(app, Celery) and (
        getattr(app, "_redislock_installed", False)
        or (isinstance(task_cls, type) and issubclass(task_cls, LockedTask))
        or (isinstance(task_cls, str) and task_cls.endswith(":LockedTask"))
    ):
        wrap_send_task(app)


worker_init.connect(_check_at_worker_start, weak=False)
beat_init.connect(_beat_publishes_unique, weak=False)
