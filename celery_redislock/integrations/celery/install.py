"""``install(app)``: make an app's tasks lock-aware, checking ``lock=`` as tasks are declared."""

from __future__ import annotations

import functools
from typing import Any

from celery import Celery
from celery.utils.imports import gen_task_name

from ...core.options import call_signature, parse_lock_option
from ...core.rate_options import parse_rate_option
from ...core.unique_options import parse_unique_option
from ...errors import LockConfigError
from ._compat import forget_task_base, names_locked_task
from .guard import check_cancel_pool
from .kind import LockAware
from .publish import wrap_send_task
from .receivers import check_request_class, check_tasks, connect_receivers

# By name: the task class sits beside this module, not below it (Celery imports it when the
# app first makes its task base).
_LOCKED_TASK = "celery_redislock.integrations.celery.task:LockedTask"

__all__ = ["install"]


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
    if not (isinstance(current, type) and issubclass(current, LockAware)):
        if current not in ("celery.app.task:Task", "celery_redislock:LockedTask") and not (
            names_locked_task(current)
        ):
            raise LockConfigError(
                f"install(app): the app's task_cls is {current!r}; derive it from "
                "celery_redislock.LockedTask instead"
            )
        app.task_cls = _LOCKED_TASK
        forget_task_base(app)
    if app.finalized:
        check_tasks(app)
    app.task = _checking(app, app.task)
    wrap_send_task(app)  # every publish, by any producer in this process, passes here
    connect_receivers()
    app._redislock_installed = True
    return app


def _checking(app: Celery, decorator: Any) -> Any:
    @functools.wraps(decorator)
    def task(*args: Any, **opts: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not opts:
            return decorator(*args)  # bare @app.task: no options to check
        if all(opts.get(option) in (None, False) for option in ("lock", "unique", "rate")):
            return decorator(*args, **opts)

        def declare(fun: Any) -> Any:
            _check_declaration(app, fun, opts)
            return decorator(*args, **opts)(fun)

        return declare

    return task


def _check_declaration(app: Celery, fun: Any, opts: dict[str, Any]) -> None:
    name = opts.get("name") or gen_task_name(app, fun.__name__, fun.__module__)
    base = opts.get("base")
    if base is not None and not (isinstance(base, type) and issubclass(base, LockAware)):
        raise LockConfigError(
            f"task {name!r}: lock=, unique= and rate= need a base class derived from "
            f"celery_redislock.LockedTask, got base={base!r}"
        )
    signature = call_signature(fun, bool(opts.get("bind")))
    lock = parse_lock_option(name, signature, opts.get("lock"))
    parse_rate_option(name, signature, opts.get("rate"))
    unique, lock = parse_unique_option(name, signature, opts.get("unique"), lock)
    if unique is not None and unique.on_duplicate == "cancel":
        check_cancel_pool(app, app.conf.worker_pool, [name])
    if lock is not None:  # a killed child's lease is released by the parent's LockRequest
        request = opts.get("Request", (base or app.Task).Request)
        check_request_class(name, request, final=False)
