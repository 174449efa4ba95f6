"""The receivers of Celery's signals that locked tasks need, connected once (``dispatch_uid``)
by :func:`~celery_redislock.install` or when the first locked task is bound to an app, never
at import: importing the package changes nothing in Celery."""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery
from celery.signals import (
    beat_init,
    before_task_publish,
    celeryd_after_setup,
    task_postrun,
    task_rejected,
    task_revoked,
    task_unknown,
    worker_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from celery.utils.imports import symbol_by_name

from ...core.reach import check_at_start
from ...errors import LockConfigError
from . import settings
from ._compat import is_test_worker, names_locked_task
from .events import enable_at_worker_start
from .guard import check_cancel_pool, refuse_to_start, unlocked_message, unlocked_tasks
from .kind import LockAware, is_locked_task
from .line import start_sweeping, stop_sweeping, uses_line
from .parent import LockRequest
from .publish import wrap_send_task
from .registry import publish_specs, spec_of
from .revoke import release_discarded, release_revoked, wrap_revoke
from .run import end_run, release_all_held
from .settings import check_app
from .workflow import pass_lease, release_revoked_link

__all__ = ["check_request_class", "check_tasks", "check_worker_app", "connect_receivers"]

log = logging.getLogger(__name__)

LOCK_REQUEST = "celery_redislock.integrations.celery.parent:LockRequest"


def check_request_class(name: str, request: Any, *, final: bool) -> None:
    """Raises :class:`LockConfigError` if ``request``, the ``Request`` class of the locked task
    ``name``, does not derive from :class:`LockRequest` (no parent-side release of a killed
    child's lease). A class named by a string not importable yet is checked at ``final=True``."""
    if request == LOCK_REQUEST:
        return
    if isinstance(request, str):
        try:
            request = symbol_by_name(request)
        except (ImportError, AttributeError, ValueError) as exc:
            if not final:
                return
            raise LockConfigError(
                f"task {name!r}: its Request class {request!r} cannot be imported: {exc}"
            ) from exc
    if not (isinstance(request, type) and issubclass(request, LockRequest)):
        raise LockConfigError(
            f"task {name!r}: its Request class {request!r} does not derive from "
            "celery_redislock.LockRequest, so the worker's parent could not release the lease "
            "of a child killed while running it; derive it from celery_redislock.LockRequest"
        )


_connected = threading.Event()
_connecting = threading.Lock()


def connect_receivers() -> None:
    """Connects every receiver (idempotent; cheap after the first call)."""
    if _connected.is_set():
        return
    with _connecting:
        if _connected.is_set():
            return
        for signal, receiver in (
            (task_postrun, _release_after_run),
            (worker_process_shutdown, release_all_held),
            (worker_init, _freeze_settings),
            (worker_init, _check_at_worker_start),
            (celeryd_after_setup, _check_lock_redis),
            (worker_init, wrap_revoke),
            (worker_init, enable_at_worker_start),
            (worker_ready, start_sweeping),
            (worker_shutdown, stop_sweeping),
            (beat_init, _beat_publishes_unique),
            (task_revoked, release_revoked),
            (task_revoked, release_revoked_link),
            (before_task_publish, pass_lease),
            (task_unknown, release_discarded),
            (task_rejected, release_discarded),
        ):
            uid = f"celery_redislock.{receiver.__name__}"
            signal.connect(receiver, weak=False, dispatch_uid=uid)
        _connected.set()


def _release_after_run(
    sender: Any = None, task_id: Any = None, args: Any = (), kwargs: Any = None, **info: Any
) -> None:
    # Released here: a run whose body never started, and an acks_late delivery (with its finish
    # record). task_postrun fires for every ending, RETRY, IGNORED and REJECTED included
    # (after_return does not), where the task ran, while its request is still current.
    if is_locked_task(sender):
        end_run(sender, task_id, args, kwargs or {}, info.get("state"))


def _freeze_settings(sender: Any = None, **_: Any) -> None:
    # A worker's configuration is final once it starts (pool children inherit this). Not so
    # for a worker started inside a test process, whose tests may go on changing app.conf.
    if not is_test_worker(sender):
        settings.freeze()


def check_tasks(app: Celery) -> None:
    """Raises :class:`LockConfigError` naming the tasks of ``app`` that declare ``lock=`` or
    ``unique=`` but are not LockedTasks (the option would be ignored), or whose ``Request``
    class does not derive from :class:`~celery_redislock.LockRequest`."""
    unlocked = unlocked_tasks(app)
    if unlocked:
        raise LockConfigError(unlocked_message(unlocked))
    for task in app.tasks.values():
        if is_locked_task(task) and task.lock_options is not None:
            check_request_class(task.name, task.Request, final=True)


def _locked_base(app: Celery) -> bool:
    """Whether ``app`` is installed, or its task base is a LockedTask."""
    task_cls = getattr(app, "task_cls", None)
    return (
        getattr(app, "_redislock_installed", False)
        or (isinstance(task_cls, type) and issubclass(task_cls, LockAware))
        or names_locked_task(task_cls)
    )


def _uses_locks(app: Celery) -> bool:
    """Whether ``app`` is one of ours: a locked task base, or a locked task."""
    return _locked_base(app) or any(is_locked_task(task) for task in app.tasks.values())


def check_worker_app(app: Celery, pool: Any = None) -> None:
    """What a worker checks as it starts: no ``lock=``/``unique=`` that would be ignored, no
    ``on_duplicate="cancel"`` on a ``pool`` that cannot terminate a task, every
    ``redislock_*`` setting, and a Redis client for locks if any task needs one. Raises
    :class:`LockConfigError` naming the task or the setting."""
    check_tasks(app)
    check_cancel_pool(app, pool or app.conf.worker_pool)
    if not _uses_locks(app):
        return
    needs_redis = any(is_locked_task(task) and task.declares() for task in app.tasks.values())
    for warning in check_app(app, needs_redis=needs_redis):
        log.warning("%s", warning)
    if settings.settings_for(app).redlock_urls and uses_line(app):
        raise LockConfigError(
            "setting redislock_redlock_urls: the task line (on_conflict='queue') is not "
            "available over RedLock masters; use 'retry' or 'wait' for those tasks"
        )


def _check_at_worker_start(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if not isinstance(app, Celery):
        return
    try:
        check_worker_app(app, getattr(sender, "pool_cls", None))
    except LockConfigError as exc:
        refuse_to_start(exc)
    if is_test_worker(sender):
        # (no celeryd_after_setup for a worker inside a test process: see _check_lock_redis)
        publish_specs(app)


def _check_lock_redis(sender: Any = None, instance: Any = None, **_: Any) -> None:
    # celeryd_after_setup: in the main process, once its logging is set up (not yet at
    # worker_init) and before its pool starts.
    app = getattr(instance, "app", None)
    if not isinstance(app, Celery) or not _uses_locks(app):
        return
    conf = settings.settings_for(app)
    if conf.disabled:
        return  # (said at worker_init)
    try:
        client = settings.client_for(app, conf)
    except Exception:  # no Redis for locks: check_worker_app refused or warned already
        return
    unique = any(is_locked_task(t) and spec_of(t) is not None for t in app.tasks.values())
    also = (
        "; the unique tasks' options are not published for producers that send them by name "
        "(beat), which publish them unchecked until a worker starts with it answering"
        if unique
        else ""
    )
    answered = check_at_start(
        client, policy=conf.on_backend_error, setting="redislock_on_backend_error", also=also
    )
    if answered:
        publish_specs(app)  # for producers that cannot import a unique task (beat)


def _beat_publishes_unique(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if isinstance(app, Celery) and _locked_base(app):
        wrap_send_task(app)
