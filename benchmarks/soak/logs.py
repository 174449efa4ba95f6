"""Reading the soak's worker logs (``benchmarks/soak``): the lines about a task, and when a
worker received each of its messages."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

_LOG_TIME = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}):")
# A task id in brackets: Celery's and the lock layer's log lines about that task (a line naming
# it as a lock's holder is about another task).
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_SUBJECT = re.compile(rf"\[({_UUID})\]")
# The worker's line for a message it took from the broker: "Task name[id] received" (Celery
# 5.4+), "Received task: name[id]" (before).
_RECEIVED = re.compile(rf"(?:Received task: \S+\[({_UUID})\]|Task \S+\[({_UUID})\] received)")


def log_lines(paths: Iterable[Path], task_ids: set[str]) -> dict[str, list[str]]:
    """Task id -> the worker log lines about it (``file: line``), by time across files."""
    found: dict[str, list[tuple[str, str]]] = defaultdict(list)
    if not task_ids:
        return {}
    for path in paths:
        with open(path, errors="replace") as log:
            for line in log:
                for task_id in set(_SUBJECT.findall(line)) & task_ids:
                    found[task_id].append((line.rstrip()[:300], path.name))
    # Every line starts "[YYYY-MM-DD HH:MM:SS,mmm: ...": sorted as text, sorted by time.
    return {t: [f"{name}: {line}" for line, name in sorted(lines)] for t, lines in found.items()}


def receive_times(paths: Iterable[Path]) -> dict[str, list[int]]:
    """Task id -> when a worker logged taking a message of it from the broker (µs)."""
    out: dict[str, list[int]] = defaultdict(list)
    for path in paths:
        with open(path, errors="replace") as log:
            for line in log:
                found = _RECEIVED.search(line)
                if found is None:
                    continue
                at = _log_time(line)
                if at is not None:
                    out[found.group(1) or found.group(2)].append(at)
    for times in out.values():
        times.sort()
    return out


def _log_time(line: str) -> int | None:
    """The µs timestamp of a worker log line (local time, this host's clock)."""
    found = _LOG_TIME.search(line)
    if found is None:
        return None
    return int(datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1e6)
