"""Every use of Celery internals, in one place, each checked on Celery 5.3.6 (the lowest
supported) to 5.7.0 (both tested in CI): an upgrade that breaks one breaks the test named here."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

from celery.worker import control
from celery.worker import state as worker_state

__all__ = [
    "TRACE_LOGGER",
    "SettingLookups",
    "chain_links",
    "embedded_beat_parent",
    "forget_beat_heap",
    "forget_task_base",
    "held_request",
    "ignored_line_of",
    "is_test_worker",
    "names_locked_task",
    "set_last_run",
    "setting_lookups",
    "wrap_revoke_command",
]

SettingLookups = dict[str, tuple[str, ...]]


def names_locked_task(task_cls: object) -> bool:
    """Whether an app's ``task_cls`` is a string naming a LockedTask class (Celery resolves it
    lazily: "proj.base:LockedTask" is all we see before the app builds its Task).
    (tests/celery/test_celery_options.py)"""
    return isinstance(task_cls, str) and task_cls.endswith(":LockedTask")


def chain_links(canvas: object) -> list[Any] | None:
    """The members of a chain, in order (``None``: ``canvas`` is no chain). ``chain(...)``
    makes a private ``_chain``, the class to ask. (tests/celery/test_celery_workflow_options.py)"""
    from celery.canvas import _chain

    return list(canvas.tasks) if isinstance(canvas, _chain) else None


def forget_task_base(app: Any) -> None:
    """Drops the app's cached task base (``app.Task``, a cached property in the instance
    ``__dict__``), so that a new ``task_cls`` takes effect. (tests/celery/test_celery_options.py)"""
    app.__dict__.pop("Task", None)


TRACE_LOGGER = "celery.app.trace"
"""The logger of Celery's tracer, which says how each task ended."""


def ignored_line_of(record: logging.LogRecord) -> str | None:
    """The task id of Celery's "Task NAME[ID] ignored" line (the tracer's, for a task that
    raised ``Ignore``: ``logger.log(level, LOG_IGNORED, context)``), ``None`` for any other
    line. (tests/core/test_worker_logs.py: the ignored line)"""
    context = record.args
    if record.msg != "Task %(name)s[%(id)s] %(description)s" or not isinstance(context, dict):
        return None
    if context.get("description") != "ignored":
        return None
    task_id = context.get("id")
    return task_id if isinstance(task_id, str) else None


def is_test_worker(worker: object) -> bool:
    """Whether ``worker`` was started by ``celery.contrib.testing.worker.start_worker`` (its
    class TestWorkController), in a test process whose tests may go on changing ``app.conf``.
    (tests/contrib/test_testing_plugin.py)"""
    return type(worker).__name__ == "TestWorkController"


def held_request(state: Any, task_id: str) -> Any:
    """The request of a message this worker holds: reserved (``worker_state.requests``), or
    waiting for its ETA (on the consumer's timer, an entry whose last item is a partial over
    the request). (tests/celery/test_celery_unique.py: the revoke tests)"""
    request = worker_state.requests.get(task_id)
    if request is not None:
        return request
    timer = getattr(getattr(state, "consumer", None), "timer", None)
    for item in getattr(timer, "queue", ()):
        for arg in getattr(item[-1], "args", ()):
            if getattr(arg, "id", None) == task_id and hasattr(arg, "task"):
                return arg
    return None


def wrap_revoke_command(after: Callable[[Any, str], None]) -> None:
    """Replaces the worker's ``revoke`` remote control command (``control.Panel.data``) with
    one that runs Celery's, then ``after(state, task_id)`` for each id. Idempotent.
    (tests/celery/test_celery_unique.py: the revoke tests)"""
    revoke = control.Panel.data.get("revoke")
    if revoke is None or getattr(revoke, "_redislock", False):
        return

    @functools.wraps(revoke)
    def revoke_and_release(state: Any, task_id: Any, *args: Any, **kwargs: Any) -> Any:
        reply = revoke(state, task_id, *args, **kwargs)
        for one in [task_id] if isinstance(task_id, str) else list(task_id or ()):
            after(state, one)
        return reply

    revoke_and_release._redislock = True  # type: ignore[attr-defined]
    control.Panel.data["revoke"] = revoke_and_release


class _Probe:
    """A map holding nothing that records the keys asked of it."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __getitem__(self, key: str) -> object:
        self.asked.append(key)
        raise KeyError(key)


def setting_lookups(conf: Any, names: Iterable[str]) -> SettingLookups | None:
    """Setting name -> the keys ``app.conf.get`` reads for it, in order (the namespace prefix
    applied, old names). ``None`` unless ``conf`` is Celery's ChainMap-like ``Settings``, whose
    ``copy()`` keeps the prefix rules and whose ``maps`` can be swapped.
    (tests/celery/test_settings_namespace.py)"""
    try:
        # A view with the same prefix and old-name rules, over a probe instead of maps, made as
        # Celery 5.7's ConfigurationView.copy() makes it: 5.3's copy() is ChainMap's, which
        # loses the prefix (tests/celery/test_settings_namespace.py on the lowest versions).
        view = type(conf)(conf.changes.copy(), conf.defaults, conf._keys, conf.prefix)
        probe = _Probe()
        view.maps[:] = [probe]
        found: SettingLookups = {}
        for name in names:
            probe.asked.clear()
            view.get(name)
            found[name] = tuple(dict.fromkeys(probe.asked))
    except Exception:
        return None
    return found if all(found.values()) else None


def forget_beat_heap(scheduler: Any) -> None:
    """Makes Celery's base ``Scheduler.tick`` rebuild its heap of due times (``_heap``) at its
    next call, after entries' last runs changed under it; a scheduler with a ``tick`` of its own
    (RedBeat) has none, and reads its entries again at each tick. (tests/celery/test_beat.py)"""
    if hasattr(scheduler, "_heap"):
        scheduler._heap = None


def set_last_run(entry: Any, moment: Any) -> None:
    """Sets a schedule entry's last run: the entry's ``last_run_at``, and the model's under
    django-celery-beat's ``ModelEntry`` (its ``next()`` and ``save()`` read the model's).
    (tests/celery/test_beat.py)"""
    entry.last_run_at = moment
    model = getattr(entry, "model", None)
    if model is not None and hasattr(model, "last_run_at"):
        model.last_run_at = moment


def embedded_beat_parent() -> int | None:
    """In the beat process that ``celery worker --beat`` forks (a billiard process named
    ``Beat``, celery.beat._Process), the pid of its worker; else ``None``.
    (tests/celery/test_celery_beat.py)"""
    from billiard.process import current_process

    return os.getppid() if current_process().name == "Beat" else None
