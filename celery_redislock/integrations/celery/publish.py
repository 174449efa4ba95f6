"""The producer's side of ``unique=``: every message an app publishes passes ``app.send_task``
(``delay``, ``apply_async``, ``send_task`` by name, beat, canvas, retries), so that is where a
unique task claims its key, or is found to be a duplicate and is not published."""

from __future__ import annotations

import datetime
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery import Celery
from celery.utils import uuid

from ...core.claims import Claim, ClaimKind, publish_claimed
from ...core.naming import lock_name
from ...errors import DuplicateTask, LockBackendError
from .kind import CONFLICTS_HEADER, LINE_HEADER, RATE_HEADER, REDELIVERY_HEADER
from .registry import Spec, spec_for
from .settings import Settings, client_for, settings_for
from .signals import lock_conflict

__all__ = [
    "CONFLICTS_HEADER",
    "LINE_HEADER",
    "RATE_HEADER",
    "REDELIVERY_HEADER",
    "wrap_send_task",
]

log = logging.getLogger(__name__)

_MAX_CLAIM_S = 365 * 86400.0

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
        or LINE_HEADER in headers
        or RATE_HEADER in headers
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
    if settings.disabled:  # the kill switch
        return send(spec.task, args, kwargs, **options)
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
    kind = (
        ClaimKind.REPUBLISH
        if _is_republish(options)
        else ClaimKind.REPLACE
        if action == "replace"
        else ClaimKind.NEW
    )
    client = client_for(app, settings)
    what = f"task {spec.task}[{task_id}]"
    try:
        found, result = publish_claimed(
            client,
            settings.namespace,
            name,
            task_id=task_id,
            lifetime=life,
            kind=kind,
            running_counts=spec.unique.running_counts,
            window=settings.unique_publish_window,
            publish=lambda: send(spec.task, args, kwargs, **options),
            what=what,
        )
    except LockBackendError as exc:
        if settings.on_backend_error != "run":
            raise
        # Published under this id: a claim the call may have written names this very message.
        log.error("%s published WITHOUT unique key %r: %s", what, name, exc)
        return send(spec.task, args, kwargs, **options)
    if found.duplicate:
        return _duplicate(app, spec, name, task_id, found, action, options)
    if found.replaced:
        log.info("%s replaces %s under unique key %r", what, found.holder, name)
        _signal(app, spec, task_id, name, "replace", found)
        app.control.revoke(found.holder)
    return result


def _signal(app: Celery, spec: Spec, task_id: str, name: str, action: str, found: Claim) -> None:
    sender = app.tasks.get(spec.task) or spec.task
    lock_conflict.send(
        sender=sender,
        task_id=task_id,
        lock=name,
        action=action,
        holders=[found.holder],
        stage="publish",
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
