"""The guard against a forgotten ``install(app)``: Celery accepts unknown task options, so such an
app's worker would run tasks declaring ``lock=``, ``unique=`` or ``rate=`` with no lock at all. It
refuses to start instead. The receiver is connected when Celery loads the ``celery redislock``
command (an entry point every ``celery`` command loads): it guards every worker."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from celery import Celery

from ...core.options import parse_lock_option
from ...core.rate_options import parse_rate_option
from ...core.unique_options import parse_unique_option
from ...errors import LockConfigError
from .kind import is_locked_task

__all__ = [
    "check_cancel_pool",
    "refuse_to_start",
    "refuse_unlocked_tasks",
    "unlocked_message",
    "unlocked_tasks",
]

log = logging.getLogger(__name__)

_PARSERS: dict[str, Any] = {
    "lock": lambda name, value: parse_lock_option(name, None, value),
    "unique": lambda name, value: parse_unique_option(name, None, value, None),
    "rate": lambda name, value: parse_rate_option(name, None, value),
}


def _declares(name: str, option: str, value: object) -> bool:
    """Whether ``value`` reads as our ``option`` (not so an unrelated attribute: a lock, say)."""
    if value is None or value is False or callable(getattr(value, "acquire", None)):
        return False
    try:
        _PARSERS[option](name, value)
    except Exception:
        return False
    return True


def unlocked_tasks(app: Celery) -> list[str]:
    """The app's tasks that declare ``lock=``, ``unique=`` or ``rate=`` but are not of a
    :class:`LockedTask` class: nothing would enforce their options.

    >>> unlocked_tasks(app)   # doctest: +SKIP
    ['proj.nightly_report']
    """
    return [
        name
        for name, task in sorted(app.tasks.items())
        if not is_locked_task(task)
        and any(_declares(name, option, getattr(task, option, None)) for option in _PARSERS)
    ]


def _terminates(pool: Any) -> bool:
    """Whether a worker pool (a class, or its name as ``-P`` takes it) can terminate a running
    task: prefork (its child gets the signal), eventlet and gevent; not solo nor threads."""
    from celery.concurrency import get_implementation
    from celery.concurrency.base import BasePool
    from celery.concurrency.prefork import TaskPool as Prefork

    try:
        cls = get_implementation(pool) if isinstance(pool, str) else pool
    except Exception:  # (a pool this Celery does not know: its worker will say so)
        return True
    if not isinstance(cls, type) or not issubclass(cls, BasePool):
        return True
    own = getattr(cls, "terminate_job", None)
    return issubclass(cls, Prefork) or own is not BasePool.terminate_job


def check_cancel_pool(app: Celery, pool: Any, tasks: list[str] | None = None) -> None:
    """Refuses tasks with ``unique={"on_duplicate": "cancel"}`` (the app's, or those named in
    ``tasks``) on a pool that cannot stop a running task (``pool``: the worker's pool class or
    name): the newest call would wait for the running copy instead of stopping it."""
    if _terminates(pool):
        return
    names = tasks if tasks is not None else _cancelling(app)
    if names:
        label = pool if isinstance(pool, str) else f"{pool.__module__}.{pool.__qualname__}"
        raise LockConfigError(
            f"task{'s' if len(names) > 1 else ''} {', '.join(names)}: unique option "
            f"'on_duplicate': 'cancel' stops the running copy, which worker pool {label!r} "
            "cannot do (it cannot terminate a task); use the prefork, eventlet or gevent pool"
        )


def _cancelling(app: Celery) -> list[str]:
    return sorted(
        name
        for name, task in app.tasks.items()
        if is_locked_task(task)
        and task.unique_options is not None
        and task.unique_options.on_duplicate == "cancel"
    )


def unlocked_message(names: list[str]) -> str:
    """What a worker says of :func:`unlocked_tasks` as it refuses to start."""
    plural = len(names) > 1
    return (
        f"task{'s' if plural else ''} {', '.join(names)} declare{'' if plural else 's'} lock=, "
        "unique= or rate=, but the app's task class is not celery_redislock's, so nothing would "
        "enforce them and they would run with no lock. Call celery_redislock.install(app) right "
        "after creating the app (before declaring tasks), or create it with "
        'Celery(..., task_cls="celery_redislock:LockedTask")'
    )


def refuse_unlocked_tasks(sender: Any = None, **_: Any) -> None:
    """``worker_init`` receiver: ends the worker before it consumes anything if a task would
    run unlocked."""
    app = getattr(sender, "app", None)
    if not isinstance(app, Celery):
        return
    names = unlocked_tasks(app)
    if names:
        refuse_to_start(unlocked_message(names))


def refuse_to_start(why: object) -> NoReturn:
    """Ends a starting worker (from a ``worker_init`` receiver), saying why at CRITICAL."""
    log.critical("celery_redislock: the worker refuses to start: %s", why)
    # Signal.send catches and only logs an Exception a receiver raises, so raising one would
    # let the worker start and fail (or run unlocked) at every task. SystemExit is not an
    # Exception: it ends the worker before it consumes anything.
    raise SystemExit(1)
