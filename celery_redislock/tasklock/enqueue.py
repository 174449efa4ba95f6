"""The producer's side of ``unique=``: every message an app publishes passes ``app.send_task``
(``delay``, ``apply_async``, ``send_task`` by name, beat, canvas, retries), so that is where a
unique task claims its key, or is found to be a duplicate and is not published."""

from __future__ import annotations

import datetime
import functools
import inspect
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from celery import Celery
from celery.utils import uuid

from ..errors import DuplicateTask, LockBackendError
from .keyname import lock_name
from .options import LockOptions
from .settings import Settings, client_for, settings_for
from .signals import lock_conflict
from .unique import LIFECYCLES, ON_DUPLICATE, Claim, UniqueOptions, claim, release_claim

if TYPE_CHECKING:
    from .task import LockedTask

__all__ = ["Spec", "publish_specs", "wrap_send_task"]

log = logging.getLogger("celery_redislock")

# Message header counting conflict retries (kept apart from the task's own ``retries``); such a
# re-publish is the same job.
CONFLICTS_HEADER = "redislock_conflicts"
# Message header counting re-publishes of a delivery that found another delivery of the same
# task holding its lease (it waits to learn whether that one finished); the same job too.
REDELIVERY_HEADER = "redislock_redelivered"
_MAX_CLAIM_S = 365 * 86400.0
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
    def of(cls, task: LockedTask) -> Spec | None:
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
    return inspect.Signature(
        [
            inspect.Parameter(
                p[0], inspect._ParameterKind(p[1]), default=p[2] if len(p) > 2 else inspect._empty
            )
            for p in params
        ]
    )


# -- the registry: what the workers know of their unique tasks, for producers that cannot
#    import them (beat or a service sending by name) ---------------------------------------------


def registry_key(namespace: str) -> str:
    return f"{namespace}:{{unique-tasks}}"


def publish_specs(app: Celery) -> None:
    """Writes the app's unique tasks to Redis (run as a worker starts)."""
    from .task import LockedTask

    specs = {
        name: spec.to_json()
        for name, task in app.tasks.items()
        if isinstance(task, LockedTask) and (spec := Spec.of(task)) is not None
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
    from .task import LockedTask

    task = app.tasks.get(name)
    if isinstance(task, LockedTask):
        return task.unique_spec()
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


# -- publishing ---------------------------------------------------------------------------------

SendTask = Callable[..., Any]


def wrap_send_task(app: Celery) -> None:
    """Routes the app's publishes through :func:`publish` (idempotent)."""
    send = app.send_task
    if getattr(send, "_redislock", False):
        return

    @functools.wraps(send)
    def send_task(name: str, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        spec = spec_for(app, name)
        if spec is None:
            return send(name, args, kwargs, **options)
        return publish(app, send, spec, args, kwargs, options)

    send_task._redislock = True  # type: ignore[attr-defined]
    app.send_task = send_task


def _is_republish(options: Mapping[str, Any]) -> bool:
    # Task.retry() and our conflict retry re-publish the same task id: the same job.
    headers = options.get("headers") or {}
    return (
        int(options.get("retries") or 0) > 0
        or CONFLICTS_HEADER in headers
        or REDELIVERY_HEADER in headers
    )


def _seconds_until(app: Celery, value: Any) -> float | None:
    if isinstance(value, str):
        value = datetime.datetime.fromisoformat(value)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=app.timezone)
        return float((value - app.now()).total_seconds())
    return None


def lifetime(app: Celery, spec: Spec, settings: Settings, options: Mapping[str, Any]) -> float:
    """How long a claim lasts: countdown/ETA plus the allowance, cut at ``expires`` (a message
    that expired is discarded by the worker, so its claim must not outlive it). <= 0: expired."""
    countdown = options.get("countdown")
    delay = float(countdown) if isinstance(countdown, int | float) else 0.0
    if countdown is None:
        delay = max(0.0, _seconds_until(app, options.get("eta")) or 0.0)
    life = delay + (spec.unique.allowance or settings.queue_allowance)
    expires = options.get("expires")
    if isinstance(expires, int | float) and not isinstance(expires, bool):
        expires_in: float | None = float(expires)
    elif isinstance(expires, str | datetime.datetime):
        expires_in = _seconds_until(app, expires)
    else:  # not given (None, or Celery's marker for it): the task's own default
        expires_in = spec.expires
    # Past a year it is no claim but a mistake (countdown=1e300): Celery's own publish refuses
    # it, and the claim is given up then; it must not reach Redis as a number it cannot take.
    life = min(life, _MAX_CLAIM_S)
    return life if expires_in is None else min(life, expires_in)


def publish(
    app: Celery,
    send: SendTask,
    spec: Spec,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    options: dict[str, Any],
) -> Any:
    """Claims the key of a unique task's call and publishes it, or handles the duplicate."""
    settings = settings_for(app)
    life = lifetime(app, spec, settings, options)
    if life <= 0 or not spec.derivable:
        if not spec.derivable:
            log.warning(
                "task %s: its unique key is a callable this process cannot import; "
                "published unchecked (the worker checks it when the task starts)",
                spec.task,
            )
        return send(spec.task, args, kwargs, **options)
    task_id = options["task_id"] = options.get("task_id") or uuid()
    name = lock_name(spec.task, spec.unique.keying, spec.signature, args or (), kwargs or {})
    action = spec.unique.on_duplicate or settings.on_duplicate
    kind: Literal["n", "x", "r"] = (
        "r" if _is_republish(options) else "x" if action == "replace" else "n"
    )
    client = client_for(app, settings)
    try:
        found = claim(
            client, settings.namespace, name, task_id, life, kind, spec.unique.running_counts
        )
    except LockBackendError as exc:
        if settings.on_backend_error != "run":
            # The claim may have been written before its reply was lost: give it up, or every
            # later call would be handed the result of a task that was never published.
            _give_up_claim(client, settings.namespace, name, task_id, "its claim failed")
            raise
        # Published under this id: a claim the call may have written names this very message.
        log.error("task %s[%s] published WITHOUT unique key %r: %s", spec.task, task_id, name, exc)
        return send(spec.task, args, kwargs, **options)
    if found.duplicate:
        return _duplicate(app, spec, name, task_id, found, action, options)
    try:
        result = send(spec.task, args, kwargs, **options)
    except BaseException:
        # Not published: the key must not stay claimed by a message that does not exist.
        _give_up_claim(client, settings.namespace, name, task_id, "a failed publish")
        raise
    if found.status == 2:
        log.info(
            "task %s[%s] replaces %s under unique key %r", spec.task, task_id, found.holder, name
        )
        _signal(app, spec, task_id, name, "replace", found)
        app.control.revoke(found.holder)
    return result


def _give_up_claim(client: Any, namespace: str, name: str, task_id: str, after: str) -> None:
    try:
        release_claim(client, namespace, name, task_id)
    except LockBackendError as exc:
        log.warning(
            "unique key %r: could not give up the claim of %s after %s (it lapses with its "
            "lifetime): %s",
            name,
            task_id,
            after,
            exc,
        )


def _signal(app: Celery, spec: Spec, task_id: str, name: str, action: str, found: Claim) -> None:
    sender = app.tasks.get(spec.task) or spec.task
    lock_conflict.send(
        sender=sender, task_id=task_id, lock=name, action=action, holders=[found.holder]
    )


def _duplicate(
    app: Celery,
    spec: Spec,
    name: str,
    task_id: str,
    found: Claim,
    action: str,
    options: Mapping[str, Any],
) -> Any:
    state = "running" if found.running else "queued"
    # A member of a group or chord has its id fixed in the group's result and the chord's
    # count: handing back another id would leave them waiting forever, so it raises.
    in_canvas = bool(options.get("group_id") or options.get("chord"))
    raising = action == "raise" or in_canvas
    log.info(
        "task %s[%s] not published: %s is %s under unique key %r",
        spec.task,
        task_id,
        found.holder,
        state,
        name,
    )
    _signal(app, spec, task_id, name, "raise" if raising else "existing", found)
    if raising:
        raise DuplicateTask(
            f"task {spec.task}: a copy ({found.holder}) is already {state} under unique key "
            f"{name!r}" + (" (inside a group or chord)" if in_canvas and action != "raise" else ""),
            name=name,
            task_id=found.holder,
            expires_in=found.ms_left / 1000,
            state=state,
        )
    result_cls = options.get("result_cls") or app.AsyncResult
    return result_cls(found.holder)
