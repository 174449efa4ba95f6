"""``on_conflict="queue"`` for Celery: a task that finds its lock taken parks its message in the
lock's task line (core/line.py) and leaves the worker; whoever frees the lock publishes it
again, and a sweeper thread in each worker's main process hands on what lapsed unseen (and
publishes debounced calls that are due, core/debounce.py)."""

from __future__ import annotations

from celery import Celery

from ...core.sweeper import LineSweeper
from .debounce import debounce_publisher
from .kind import is_locked_task
from .run import handover_for
from .settings import app_state, client_for, settings_for

__all__ = ["start_sweeping", "stop_sweeping", "uses_debounce", "uses_line"]


def uses_line(app: Celery) -> bool:
    """Whether any of the app's tasks may park (so its workers sweep)."""
    default = settings_for(app).on_conflict
    for task in list(app.tasks.values()):
        options = task.lock_options if is_locked_task(task) else None
        if options is not None and (options.on_conflict or default) == "queue":
            return True
    return False


def uses_debounce(app: Celery) -> bool:
    """Whether any of the app's tasks is debounced (its workers publish the calls due)."""
    return any(
        is_locked_task(task) and task.unique_options is not None and task.unique_options.debounced
        for task in list(app.tasks.values())
    )


def _app_of(sender: object) -> Celery | None:
    app = getattr(getattr(sender, "controller", sender), "app", None)
    return app if isinstance(app, Celery) else None


def start_sweeping(sender: object = None, **_: object) -> None:
    """``worker_ready`` receiver: a worker whose app has tasks that may park sweeps their
    lines from its main process, and publishes the debounced calls that are due."""
    app = _app_of(sender)
    if app is None:
        return
    debounced = uses_debounce(app)
    if not (debounced or uses_line(app)):
        return
    settings = settings_for(app)
    state = app_state(app)
    if settings.disabled or state.sweeper is not None:
        return
    client = client_for(app, settings)  # made here, not in the thread (fork safety)
    interval, window = settings.line_sweep_interval, settings.line_handover_window
    pending = debounce_publisher(app) if debounced else None
    sweeper = LineSweeper(client, settings.namespace, handover_for(app), interval, window, pending)
    sweeper.start()
    state.sweeper = sweeper


def stop_sweeping(sender: object = None, **_: object) -> None:
    """``worker_shutdown`` receiver (its sender is the worker)."""
    app = _app_of(sender)
    state = app_state(app) if app is not None else None
    if state is not None and state.sweeper is not None:
        sweeper, state.sweeper = state.sweeper, None
        sweeper.stop()
