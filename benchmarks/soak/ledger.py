"""Reading the soak's ledger Redis (written by ``soakapp``) and its result backend: runs,
conflicts, publishes and states; and the whole ledger as JSON."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from .records import SKIPPED, Publish, Run, _seconds


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def ledger_now(ledger: redis.Redis) -> int:
    seconds, micros = ledger.time()
    return int(seconds) * 1_000_000 + int(micros)


def read_runs(ledger: redis.Redis) -> list[Run]:
    starts = ledger.hgetall("soak:start")
    ends = {_text(k): int(v) for k, v in ledger.hgetall("soak:end").items()}
    runs = []
    for key, value in starts.items():
        run_id = _text(key)
        stamp, note = _text(value).split(" ", 1)
        info = json.loads(note)
        runs.append(
            Run(
                run_id=run_id,
                task_id=info["task_id"],
                kind=info["kind"],
                lock=info["lock"],
                mode=info["mode"],
                pid=int(info["pid"]),
                ppid=int(info["ppid"]),
                worker=str(info.get("worker")),
                start=int(stamp),
                end=ends.get(run_id),
            )
        )
    return sorted(runs, key=lambda r: r.start)


def read_conflicts(ledger: redis.Redis) -> dict[str, list[dict[str, Any]]]:
    """Task id -> the lock conflicts its deliveries met, in order."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for raw in ledger.lrange("soak:conflicts", 0, -1):
        stamp, note = _text(raw).split(" ", 1)
        info = json.loads(note)
        out[info["task_id"]].append({**info, "t_s": _seconds(int(stamp))})
    return out


def read_publishes(ledger: redis.Redis) -> dict[str, list[Publish]]:
    """Task id -> the messages published for it, in order (``soakapp``'s publish notes)."""
    out: dict[str, list[Publish]] = defaultdict(list)
    for raw in ledger.lrange("soak:published", 0, -1):
        stamp, note = _text(raw).split(" ", 1)
        info = json.loads(note)
        out[info["task_id"]].append(
            Publish(info["task_id"], int(info["before"]), int(stamp), int(info["pid"]),
                    str(info.get("host", "")))
        )  # fmt: skip
    for publishes in out.values():
        publishes.sort(key=lambda p: p.before)
    return out


def read_states(main: redis.Redis, app: Any, task_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Task id -> the result backend's record (``{"status": "PENDING"}`` when it has none; a
    skipped run's status read as ``SKIPPED``)."""
    out: dict[str, dict[str, Any]] = {}
    for first in range(0, len(task_ids), 500):
        chunk = task_ids[first : first + 500]
        keys = [app.backend.get_key_for_task(t) for t in chunk]
        for task_id, raw in zip(chunk, main.mget(keys), strict=True):
            record = json.loads(raw) if raw else {"status": "PENDING"}
            error = record.get("result")
            failed = record.get("status") == "FAILURE" and isinstance(error, dict)
            if failed and error.get("exc_type") == "TaskSkipped":  # a skipped run
                record["status"] = SKIPPED
            out[task_id] = record
    return out


def dump_ledger(ledger: redis.Redis, path: Path) -> None:
    """Everything the ledger holds, as JSON, for a look at a failed soak afterwards."""
    out: dict[str, Any] = {}
    for key in sorted(_text(k) for k in ledger.keys("soak:*")):
        kind = _text(ledger.type(key))
        if kind == "hash":
            out[key] = {_text(k): _text(v) for k, v in ledger.hgetall(key).items()}
        elif kind == "list":
            out[key] = [_text(v) for v in ledger.lrange(key, 0, -1)]
    path.write_text(json.dumps(out, indent=1))
