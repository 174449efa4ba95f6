"""Unique tasks' specs: what a producer needs to claim a task's key (its options and call
signature), from the task class when this process has it, else from a hash in Redis that each
worker writes as it starts (for beat and producers that send by name)."""

from __future__ import annotations

import inspect
import json
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from celery import Celery

from ...core.keys import registry_key
from ...core.options import LockOptions
from ...core.unique_options import LIFECYCLES, ON_DUPLICATE, UniqueOptions
from ...errors import LockBackendError
from .kind import LockAware, is_locked_task
from .settings import Settings, client_for, settings_for

__all__ = ["Spec", "publish_specs", "spec_for"]

log = logging.getLogger(__name__)

# How long a producer trusts what it read of a task it cannot import.
_REGISTRY_CACHE_S = 30.0


@dataclass(frozen=True, slots=True)
class Spec:
    """What a producer needs to claim a unique task's key: its options and call signature."""

    task: str
    unique: UniqueOptions
    signature: inspect.Signature | None
    expires: float | None
    """The task's own default ``expires`` (seconds), if any."""
    derivable: bool = True
    """False when the key is a callable this process does not have (a task it cannot import)."""

    @classmethod
    def of(cls, task: LockAware) -> Spec | None:
        unique = task.unique_options
        if unique is None or not unique.queued:
            return None
        expires = task.expires if isinstance(task.expires, int | float) else None
        return cls(task.name, unique, task.call_signature, expires)

    def to_json(self) -> str:
        key = self.unique.keying.key
        return json.dumps(
            {
                "lifecycle": self.unique.lifecycle,
                "on_duplicate": self.unique.on_duplicate,
                "allowance": self.unique.allowance,
                "key": key if isinstance(key, str) or key is None else {"callable": True},
                "scope": self.unique.keying.scope,
                "params": _params(self.signature),
                "expires": self.expires,
            }
        )

    @classmethod
    def from_json(cls, task: str, text: str | bytes) -> Spec | None:
        raw = json.loads(text)
        if raw.get("lifecycle") not in LIFECYCLES or raw.get("on_duplicate") not in (
            None,
            *ON_DUPLICATE,
        ):
            return None  # written by another version: do not guess
        key = raw.get("key")
        signature = _signature(raw.get("params"))
        unique = UniqueOptions(
            lifecycle=raw["lifecycle"],
            keying=LockOptions(key=key if isinstance(key, str) else None, scope=raw["scope"]),
            on_duplicate=raw.get("on_duplicate"),
            allowance=raw.get("allowance"),
        )
        derivable = not isinstance(key, dict) and raw.get("params") is not None
        return cls(task, unique, signature, raw.get("expires"), derivable)


def _params(signature: inspect.Signature | None) -> list[list[Any]] | None:
    """The signature as JSON, or None if a default cannot be written as JSON."""
    if signature is None:
        return None
    out: list[list[Any]] = []
    for p in signature.parameters.values():
        entry: list[Any] = [p.name, int(p.kind)]
        if p.default is not inspect.Parameter.empty:
            try:
                json.dumps(p.default)
            except TypeError:
                return None
            entry.append(p.default)
        out.append(entry)
    return out


def _signature(params: list[list[Any]] | None) -> inspect.Signature | None:
    if params is None:
        return None
    # The enum of parameter kinds (its name is private), to read a kind back from its number.
    kind = type(inspect.Parameter("_", inspect.Parameter.POSITIONAL_ONLY).kind)
    return inspect.Signature(
        [
            inspect.Parameter(
                p[0], kind(p[1]), default=p[2] if len(p) > 2 else inspect.Parameter.empty
            )
            for p in params
        ]
    )


# -- the registry: what the workers know of their unique tasks, for producers that cannot
#    import them (beat or a service sending by name) ---------------------------------------------


def publish_specs(app: Celery) -> None:
    """Writes the app's unique tasks to Redis (run as a worker starts)."""
    specs = {
        name: spec.to_json()
        for name, task in app.tasks.items()
        if is_locked_task(task) and (spec := Spec.of(task)) is not None
    }
    if not specs:
        return
    settings = settings_for(app)
    try:
        client_for(app, settings).hset(registry_key(settings.namespace), mapping=specs)
    except Exception as exc:  # the worker still enforces uniqueness when tasks start
        log.warning("could not publish unique task specs to Redis: %s", exc)


class _Registry:
    """Per app: task name -> (read at, spec or None), read from Redis on first use."""

    def __init__(self) -> None:
        self.cache: weakref.WeakKeyDictionary[Celery, dict[str, tuple[float, Spec | None]]] = (
            weakref.WeakKeyDictionary()
        )
        self.guard = threading.Lock()

    def lookup(self, app: Celery, name: str, settings: Settings) -> Spec | None:
        now = time.monotonic()
        with self.guard:
            hit = self.cache.setdefault(app, {}).get(name)
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
        with self.guard:
            self.cache[app][name] = (now, spec)
        return spec


_registry = _Registry()


def spec_for(app: Celery, name: str) -> Spec | None:
    task = app.tasks.get(name)
    if is_locked_task(task):
        spec: Spec | None = task.unique_spec()
        return spec
    if task is not None:
        return None
    settings = settings_for(app)
    try:
        return _registry.lookup(app, name, settings)
    except LockBackendError as exc:
        if settings.on_backend_error != "run":
            raise
        log.error("task %s published WITHOUT checking whether it is unique: %s", name, exc)
        return None
