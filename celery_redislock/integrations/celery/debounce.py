"""Debounced Celery tasks (``unique={"lifecycle": "debounce", ...}``, core/debounce.py): a call
is kept in Redis as kombu's JSON of its name, arguments and routing options, and a worker's
sweeper publishes it once it is due, under the id its callers were handed."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery import Celery
from kombu.utils import json as kombu_json

from ...errors import LockConfigError

__all__ = ["debounce_publisher", "payload"]

log = logging.getLogger(__name__)


# What a debounced call's message keeps of its options when a sweeper publishes it (its id is
# the pending call's; its countdown or ETA is the debounce's own).
_KEPT_OPTIONS = (
    "queue",
    "routing_key",
    "exchange",
    "priority",
    "headers",
    "expires",
    "time_limit",
    "soft_time_limit",
    "serializer",
    "compression",
    "shadow",
    "ignore_result",
)


def payload(
    task: str,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    options: Mapping[str, Any],
) -> str:
    """A debounced call as a sweeper publishes it: kombu's JSON of its name, arguments and
    routing options."""
    kept = {name: options[name] for name in _KEPT_OPTIONS if options.get(name) is not None}
    if "queue" in kept and not isinstance(kept["queue"], str):
        kept["queue"] = getattr(kept["queue"], "name", str(kept["queue"]))
    call = {"task": task, "args": list(args or ()), "kwargs": dict(kwargs or {}), "options": kept}
    try:
        return str(kombu_json.dumps(call))  # type: ignore[no-untyped-call]
    except TypeError as exc:
        raise LockConfigError(
            f"task {task}: a debounced call is kept in Redis as JSON until it is published, "
            f"so its arguments and options must be JSON-serializable: {exc}"
        ) from exc


def debounce_publisher(app: Celery) -> Callable[[str, str], None]:
    """Publishes a debounced call that is due (a sweeper's), under the id its callers were
    handed, past the unique check (it is the pending call itself)."""

    def publish_pending(call_id: str, payload: str) -> None:
        call = kombu_json.loads(payload)  # type: ignore[no-untyped-call]
        send = getattr(app.send_task, "__wrapped__", app.send_task)
        send(call["task"], call["args"], call["kwargs"], task_id=call_id, **call["options"])
        log.info("task %s[%s]: debounced call published", call["task"], call_id)

    return publish_pending
