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

from ...core.run.delivery import DuplicateMark, TaskSpec
from ...core.run.send import Duplicate, Sender, send_unique
from ...errors import LockConfigError
from .debounce import payload
from .kind import (
    CLAIM_HEADER,
    CONFLICTS_HEADER,
    DUPLICATE_HEADER,
    LINE_HEADER,
    RATE_HEADER,
    REDELIVERY_HEADER,
)
from .registry import Spec, spec_for
from .settings import client_for, settings_for
from .signals import lock_conflict

__all__ = ["CONFLICTS_HEADER", "wrap_send_task"]  # (the header: tests read it here)

log = logging.getLogger(__name__)


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


def _expires_in(app: Celery, spec: Spec, options: Mapping[str, Any]) -> float | None:
    """Seconds until the message expires (the worker then discards it unrun)."""
    expires = options.get("expires")
    if isinstance(expires, int | float) and not isinstance(expires, bool):
        return float(expires)
    if isinstance(expires, str | datetime.datetime):
        return _seconds_until(app, expires)
    return spec.expires  # not given (None, or Celery's marker for it): the task's own default


def _delay(app: Celery, options: Mapping[str, Any]) -> float:
    countdown = options.get("countdown")
    if countdown is None:
        return max(0.0, _seconds_until(app, options.get("eta")) or 0.0)
    return float(countdown) if isinstance(countdown, int | float) else 0.0


def publish(
    app: Celery,
    send: Callable[..., Any],
    spec: Spec,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    options: dict[str, Any],
) -> Any:
    """Claims the key of a unique task's call and publishes it, or handles the duplicate
    (:func:`~celery_redislock.core.run.send.send_unique`)."""
    settings = settings_for(app)
    if settings.disabled:  # the kill switch
        return send(spec.task, args, kwargs, **options)
    if not spec.derivable:
        log.warning(
            "task %s: its unique key is a callable this process cannot import; "
            "published unchecked (the worker checks it when the task starts)",
            spec.task,
        )
        return send(spec.task, args, kwargs, **options)
    # An id given in advance to a call made inside a run is a workflow's (a chord's body, which
    # Celery 5.3's result backend publishes with no other sign): it must be answered under it.
    fixed_id = bool(options.get("task_id")) and app.current_worker_task is not None
    task_id = options["task_id"] = options.get("task_id") or uuid()
    # Celery itself names the parent when its worker publishes a workflow's next step (a
    # chain's next link, a link callback or errback, a group inside a chain) from the run
    # that just ended: an error raised there would break that run's ending. Callers leave it
    # to Celery (a call from inside a task gets its parent after this point).
    from_run = bool(options.get("parent_id"))

    def publish_marked(mark: DuplicateMark) -> Any:
        headers = {**(options.get("headers") or {}), DUPLICATE_HEADER: mark.encode()}
        return send(spec.task, args, kwargs, **{**options, "headers": headers})

    task_spec = TaskSpec(spec.task, None, spec.unique, None, spec.signature)
    try:  # (once per call: the claim and the message's header both name it)
        name: str | None = task_spec.name_of(spec.unique.keying, args or (), kwargs or {})
    except LockConfigError:
        name = None  # send_unique raises it again where it must; otherwise the worker says why

    def claimed() -> Any:
        # The claim rides on the message: a worker that discards it unrun gives it up.
        if spec.unique.debounced or name is None:  # (a pending call is no queued claim)
            return send(spec.task, args, kwargs, **options)
        claim = {"namespace": settings.namespace, "key": name}
        headers = {**(options.get("headers") or {}), CLAIM_HEADER: claim}
        return send(spec.task, args, kwargs, **{**options, "headers": headers})

    sent = send_unique(
        task_spec,
        spec.unique,
        task_id,
        (args or (), kwargs or {}),
        delay=_delay(app, options),
        expires_in=_expires_in(app, spec, options),
        republish=_is_republish(options),
        # A step of a workflow has its id fixed in advance (a group's result, a chord's count,
        # a chain's next link), or callbacks that would be lost with it: handing back another
        # id would leave the workflow waiting for ever, so it raises (or, from_run, fails).
        in_canvas=bool(
            options.get("group_id")
            or options.get("chord")
            or "chain" in options
            or options.get("link")
            or options.get("link_error")
            or from_run
            or fixed_id
        ),
        from_run=from_run,
        publish_marked=publish_marked,
        settings=settings,
        client=client_for(app, settings),
        by=Sender(
            "task", "published", "publish", lock_conflict, app.tasks.get(spec.task) or spec.task
        ),
        publish=claimed,
        cancel=app.control.revoke,
        # on_duplicate="cancel": the pool child running it is sent SIGTERM (prefork).
        stop=lambda task_id: app.control.revoke(task_id, terminate=True, signal="SIGTERM"),
        encode=lambda: payload(spec.task, args, kwargs, options),
        name=name,
    )
    if isinstance(sent, Duplicate):
        result_cls = options.get("result_cls") or app.AsyncResult
        return result_cls(sent.holder)
    return sent.result
