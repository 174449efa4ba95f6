"""``on_conflict="queue"`` for Celery: a task that finds its lock taken parks its message in the
lock's task line (core/line.py) and leaves the worker; whoever frees the lock publishes it
again, and a sweeper thread in each worker's main process hands on what lapsed unseen."""

from __future__ import annotations

from celery import Celery

from ...core.sweeper import LineSweeper
from .kind import is_locked_task
from .run import handover_for
from .settings import client_for, settings_for

__all__ = ["start_sweeping", "stop_sweeping", "uses_line"]


def uses_line(app: Celery) -> bool:
    """Whether any of the app's tasks may park (so its workers sweep)."""
    default = settings_for(app).on_conflict
    for task in list(app.tasks.values()):
        options = task.lock_options if is_locked_task(task) else None
        if options is not None and (options.on_conflict or default) == "queue":
            return True
    return False


_sweepers: list[LineSweeper] = []


def start_sweeping(sender: object = None, **_: object) -> None:
    """``worker_ready`` receiver: a worker whose app has tasks that may park sweeps their
    lines from its main process."""
    app = getattr(getattr(sender, "controller", sender), "app", None)
    if not isinstance(app, Celery) or not uses_line(app):
        return
    settings = settings_for(app)
    if settings.disabled:
        return
    client = client_for(app, settings)  # made here, not in the thread (fork safety)
    interval, window = settings.line_sweep_interval, settings.line_handover_window
    sweeper = LineSweeper(client, settings.namespace, handover_for(app), interval, window)
    sweeper.start()
    _sweepers.append(sweeper)


def stop_sweeping(**_: object) -> None:
    """``worker_shutdown`` receiver."""
    while _sweepers:
        _sweepers.pop().stop()
