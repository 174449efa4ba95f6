"""The ``lock=`` of a workflow (a chain of tasks): a task's ``lock=`` taken by the first link, its
name made from the first link's arguments, plus ``max_gap``, how long the lease may wait in the
queue between two links. Parsed and checked once, when the workflow is declared."""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..errors import LockConfigError
from .durations import MAX_WAIT, seconds
from .options import (
    LockOptionDict,
    LockOptions,
    known_options,
    option_what,
    parse_lock_option,
)

__all__ = [
    "DEFAULT_MAX_GAP",
    "WorkflowOptions",
    "options_from_message",
    "parse_workflow_option",
]

DEFAULT_MAX_GAP = 3600.0
_ALLOWED = (*LockOptionDict.__annotations__, "max_gap")
# Made from the call's arguments in the first link's worker: a callable cannot travel there in
# a message, a template can.
_TEMPLATES = ("key", "tenant", "priority")


@dataclass(frozen=True, slots=True)
class WorkflowOptions:
    """A workflow's lock as parsed: the first link takes ``lock``; between two links the lease
    is kept at most ``max_gap`` seconds. ``declared``: the option as given, as JSON, which the
    workflow's messages carry (each worker parses it again, once)."""

    lock: LockOptions
    max_gap: float
    declared: str


def parse_workflow_option(
    task: str, signature: inspect.Signature | None, value: object
) -> WorkflowOptions:
    """Checks a workflow's ``lock=`` against its first link, the task ``task`` (``signature``:
    its call signature) and returns it parsed. ``value`` is a key template string or a dict of
    a task's lock options (one lock: not a list) plus ``max_gap``. Raises
    :class:`LockConfigError` naming the task and the option.

    >>> parse_workflow_option("etl.fetch", None, "etl:{tenant}").lock.key
    'etl:{tenant}'
    """
    if isinstance(value, str):
        value = {"key": value}
    if isinstance(value, Sequence) and not isinstance(value, str):
        raise LockConfigError(
            f"task {task!r}: workflow lock option 'lock': a workflow takes one lock, not a list"
        )
    opts = known_options(task, "workflow lock", value, _ALLOWED, "a key template string")
    for name in _TEMPLATES:
        if callable(opts.get(name)):
            raise LockConfigError(
                f"{option_what(task, name, 'workflow lock')} must be a template string, not a "
                "callable: the first link's worker makes the name, from the lock the workflow's "
                "messages carry"
            )
    max_gap = seconds(
        opts.pop("max_gap", DEFAULT_MAX_GAP),
        MAX_WAIT,
        option_what(task, "max_gap", "workflow lock"),
    )
    try:
        declared = json.dumps({**opts, "max_gap": max_gap}, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise LockConfigError(
            f"task {task!r}: workflow lock: its options must be JSON values (they travel in the "
            f"workflow's messages): {exc}"
        ) from exc
    lock = parse_lock_option(task, signature, cast(LockOptionDict, opts))
    assert lock is not None  # (a mapping always makes one)
    return WorkflowOptions(lock, max_gap, declared)


def options_from_message(
    task: str, signature: inspect.Signature | None, declared: object
) -> WorkflowOptions:
    """The workflow's lock a message carries (the JSON :class:`WorkflowOptions` ``declared``)."""
    if not isinstance(declared, str):
        raise LockConfigError(f"task {task!r}: the workflow lock in its message is not JSON")
    value: Mapping[str, Any] = json.loads(declared)
    return parse_workflow_option(task, signature, dict(value))
