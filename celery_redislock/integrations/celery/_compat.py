"""Every use of Celery internals, in one place, each with the versions it was checked on.

Checked on Celery 5.3.6 (the lowest supported, tested in CI) and 5.7.0 (the newest at the time
of writing, tested in CI). A Celery upgrade that breaks one of these breaks a test named here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from celery.worker import control
from celery.worker import state as worker_state

__all__ = [
    "SettingLookups",
    "forget_task_base",
    "held_request",
    "is_test_worker",
    "names_locked_task",
    "setting_lookups",
    "wrap_revoke_command",
]

# Our task base named as a string in `task_cls`: Celery resolves it lazily with
# symbol_by_name, so a string that names it ("celery_redislock:LockedTask", or a user's
# subclass "proj.base:LockedTask") is all we can see before the app builds its Task.
_LOCKED_TASK_SUFFIX = ":LockedTask"

SettingLookups = dict[str, tuple[str, ...]]


def names_locked_task(task_cls: object) -> bool:
    """Whether an app's ``task_cls`` setting is a string that names a LockedTask class.
    (tests/test_celery_options.py: test_a_worker_with_good_settings_starts)"""
    return isinstance(task_cls, str) and task_cls.endswith(_LOCKED_TASK_SUFFIX)


def forget_task_base(app: Any) -> None:
    """Drops the app's cached task base class (``app.Task`` is a cached property, kept in the
    instance ``__dict__`` in 5.3 to 5.7), so that a new ``task_cls`` takes effect for tasks
    made after this. (tests/test_celery_options.py: install on an app already used)"""
    app.__dict__.pop("Task", None)


def is_test_worker(worker: object) -> bool:
    """Whether ``worker`` was started by ``celery.contrib.testing.worker.start_worker`` (the
    class is made there, named TestWorkController in 5.3 to 5.7). Such a worker runs inside a
    test process whose tests may go on changing ``app.conf``.
    (tests/test_testing_plugin.py: the in-process worker tests)"""
    return type(worker).__name__ == "TestWorkController"


def held_request(state: Any, task_id: str) -> Any:
    """The request of a message this worker holds: reserved (``worker_state.requests``), or
    waiting for its ETA (kept on the consumer's timer as an entry whose last item is a
    callable partial over the request; Celery 5.7 also lists those in
    ``scheduled_requests``). (tests/test_celery_unique.py: the revoke tests)"""
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
    (tests/test_celery_unique.py: test_revoke_of_a_message_still_in_the_broker_...)"""
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
    """Setting name -> the keys Celery's lookup (``app.conf.get``) reads for it, in its order:
    the app's namespace prefix applied (a Django project's ``CELERY_REDISLOCK_TTL``) and old
    names. ``None`` if ``conf`` is not what this expects: Celery's ``Settings``, a
    ChainMap-like view whose ``copy()`` keeps the prefix rules and whose ``maps`` list can be
    swapped (5.3 to 5.7). (tests/test_settings_namespace.py)"""
    try:
        view = conf.copy()  # the same prefix and old-name rules, over a probe instead of maps
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
