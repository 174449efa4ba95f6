"""Unique tasks' specs: what a producer needs to claim a task's key (its options and call
signature), from the task class when this process has it, else from a hash in Redis that each
worker writes as it starts (for beat and producers that send by name)."""

from __future__ import annotations

import logging
import time

from celery import Celery

from ...core.keys import registry_key
from ...core.run.spec import Spec
from ...errors import LockBackendError
from .kind import LockAware, is_locked_task
from .settings import Settings, app_state, client_for, settings_for

__all__ = ["Spec", "publish_specs", "spec_for", "spec_of"]

log = logging.getLogger(__name__)

# How long a producer trusts what it read of a task it cannot import.
_REGISTRY_CACHE_S = 30.0


def spec_of(task: LockAware) -> Spec | None:
    """A unique task's spec (``None``: not unique while queued)."""
    unique = task.unique_options
    if unique is None or not unique.at_send:
        return None
    expires = task.expires if isinstance(task.expires, int | float) else None
    return Spec(task.name, unique, task.call_signature, expires)


def publish_specs(app: Celery) -> None:
    """Writes the app's unique tasks to Redis (run as a worker starts)."""
    specs = {
        name: spec.to_json()
        for name, task in app.tasks.items()
        if is_locked_task(task) and (spec := spec_of(task)) is not None
    }
    if not specs:
        return
    settings = settings_for(app)
    try:
        client_for(app, settings).hset(registry_key(settings.namespace), mapping=specs)
    except Exception as exc:  # the worker still enforces uniqueness when tasks start
        log.warning("could not publish unique task specs to Redis: %s", exc)


def _lookup(app: Celery, name: str, settings: Settings) -> Spec | None:
    now = time.monotonic()
    state = app_state(app)  # (its specs: task name -> (read at, spec or None))
    with state.guard:
        hit = state.specs.get(name)
    if hit is not None and now - hit[0] < _REGISTRY_CACHE_S:
        return hit[1]
    try:
        raw = client_for(app, settings).hget(registry_key(settings.namespace), name)
    except Exception as exc:
        if settings.url is None and settings.client_factory is None:
            return None  # no Redis for locks at all: nothing can be unique here
        raise LockBackendError(
            f"task {name!r}: could not read whether it is unique: {exc}", name=None
        ) from exc
    spec = Spec.from_json(name, raw) if raw else None
    with state.guard:
        state.specs[name] = (now, spec)
    return spec


def spec_for(app: Celery, name: str) -> Spec | None:
    task = app.tasks.get(name)
    if is_locked_task(task):
        spec: Spec | None = task.unique_spec()
        return spec
    if task is not None:
        return None
    settings = settings_for(app)
    try:
        return _lookup(app, name, settings)
    except LockBackendError as exc:
        if settings.on_backend_error != "run":
            raise
        log.error("task %s published WITHOUT checking whether it is unique: %s", name, exc)
        return None
