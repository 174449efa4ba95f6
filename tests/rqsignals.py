"""Receivers of the RQ integration's signals for the tests: each notes what it got in the
Redis of the job that sent it (``signals`` list), so a test reads what the horse saw."""

from __future__ import annotations

import json
from typing import Any

from rq import get_current_job

from celery_redislock.integrations.rq import (
    lock_acquired,
    lock_backend_error,
    lock_conflict,
    lock_released,
)


def _note(signal: str, **fields: Any) -> None:
    job = get_current_job()
    if job is None:
        return
    job.connection.rpush("signals", json.dumps({"signal": signal, **fields}))


@lock_acquired.connect
def _acquired(sender: str, task_id: str, lock: str, waited: float, **_: Any) -> None:
    _note("acquired", task=sender, job=task_id, lock=lock, waited=waited)


@lock_released.connect
def _released(sender: str, task_id: str, lock: str, held: float, **_: Any) -> None:
    _note("released", task=sender, job=task_id, lock=lock, held=held)


@lock_conflict.connect
def _conflict(
    sender: str, task_id: str, lock: str, action: str, holders: list[str], **_: Any
) -> None:
    _note("conflict", task=sender, job=task_id, lock=lock, action=action, holders=holders)


@lock_backend_error.connect
def _backend_error(sender: str, task_id: str, lock: str, policy: str, **_: Any) -> None:
    _note("backend_error", task=sender, job=task_id, lock=lock, policy=policy)
