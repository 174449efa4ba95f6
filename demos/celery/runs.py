"""What the tasks noted: each run of a task, as a span in time, and the conflicts counted."""

from __future__ import annotations

import redis

from .._common.runs import TaskRun, by_key, load_runs, spans
from .app import ACTIONS, INTERVALS

__all__ = ["TaskRun", "actions", "by_key", "load", "spans"]


def load(client: redis.Redis) -> list[TaskRun]:
    return load_runs(client, INTERVALS)


def actions(client: redis.Redis) -> dict[str, int]:
    """``"<case>:<action>"`` -> how many times a conflict ended so."""
    raw = client.hgetall(ACTIONS)
    return {(k.decode() if isinstance(k, bytes) else str(k)): int(v) for k, v in raw.items()}
