"""``on_conflict="queue"`` for Celery: a task that finds its lock taken parks its message in the
lock's task line (core/line.py) and leaves the worker; whoever frees the lock publishes it
again, and a sweeper thread in each worker's main process hands on what lapsed unseen."""

from __future__ import annotations

import logging
import threading

from celery import Celery

from ...core.line import sweep_lines
from ...core.reach import where
from ...core.repeated import RepeatedFailure
from ...errors import LockBackendError
from .kind import is_locked_task
from .run import handover_for
from .settings import client_for, settings_for

__all__ = ["Sweeper", "start_sweeping", "stop_sweeping", "uses_line"]

log = logging.getLogger(__name__)


class Sweeper:
    """Every ``interval`` seconds, sweeps the app's task lines (a worker's main process runs
    one): hands a lock on when its holder died unseen, publishes what was never published,
    and ends tasks past their wait."""

    def __init__(self, app: Celery, interval: float) -> None:
        self.app = app
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        settings = settings_for(self.app)
        client = client_for(self.app, settings)  # made here, not in the thread (fork safety)
        publish = handover_for(self.app)
        window = settings.line_handover_window
        # Each second while Redis is down: logged once, then summed up.
        failures = RepeatedFailure(log, f"task line sweep on {where(client)}")

        def run() -> None:
            while not self._stop.wait(self.interval):
                try:
                    sweep_lines(client, settings.namespace, publish, handover_window=window)
                except LockBackendError as exc:
                    failures.failed(exc)
                except Exception:
                    log.exception("task lines: sweep failed (tried again)")
                else:
                    failures.worked()

        self._thread = threading.Thread(target=run, name="redislock-line-sweeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def uses_line(app: Celery) -> bool:
    """Whether any of the app's tasks may park (so its workers sweep)."""
    default = settings_for(app).on_conflict
    for task in list(app.tasks.values()):
        options = getattr(task, "lock_options", None) if is_locked_task(task) else None
        if options is not None and (options.on_conflict or default) == "queue":
            return True
    return False


_sweepers: list[Sweeper] = []


def start_sweeping(sender: object = None, **_: object) -> None:
    """``worker_ready`` receiver: a worker whose app has tasks that may park sweeps their
    lines from its main process."""
    app = getattr(getattr(sender, "controller", sender), "app", None)
    if not isinstance(app, Celery) or not uses_line(app):
        return
    settings = settings_for(app)
    if settings.disabled:
        return
    sweeper = Sweeper(app, settings.line_sweep_interval)
    sweeper.start()
    _sweepers.append(sweeper)


def stop_sweeping(**_: object) -> None:
    """``worker_shutdown`` receiver."""
    while _sweepers:
        _sweepers.pop().stop()
