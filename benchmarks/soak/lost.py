"""Explaining the soak's lost tasks (``benchmarks/soak``): what is known of each, and its
likely cause."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from .judge import Verdict, effective_ends
from .logs import _RECEIVED, _log_time
from .records import Kill, Publish, Run, Sent, _seconds
from .transit import transit_loss

LOG_LINES_PER_LOST = 8


def explain_lost(
    verdict: Verdict,
    sent: Sequence[Sent],
    runs: Sequence[Run],
    kills: Sequence[Kill],
    states: Mapping[str, dict[str, Any]],
    conflicts: Mapping[str, list[dict[str, Any]]],
    logs: Mapping[str, list[str]],
    stopped_at: int,
    *,
    broker: str = "redis",
    publishes: Mapping[str, Sequence[Publish]] | None = None,
    receives: Mapping[str, Sequence[int]] | None = None,
    in_broker: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    """What is known of each lost task (``verdict.lost_ids``, not the ones lost in transit by
    the broker): state, runs, conflicts, publishes and receipts, log lines, the likely why."""
    by_id = {s.task_id: s for s in sent}
    ends = effective_ends(runs, kills, stopped_at)
    runs_of: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        runs_of[run.task_id].append(run)
    out = []
    for task_id in verdict.lost_ids:
        meta = states.get(task_id, {"status": "PENDING"})
        its_runs = runs_of.get(task_id, [])
        hows = []
        for its_run in its_runs:
            _, how, kill = ends[its_run.run_id]
            hows.append(f"{how} ({kill.kind})" if kill else how)
        actions = [c["action"] for c in conflicts.get(task_id, [])]
        lines = logs.get(task_id, [])
        why = []
        if "drop" in actions:
            why.append("a delivery was dropped as 'this delivery already ran to its end'")
        if any(h == "killed (worker)" for h in hows):
            why.append("its run died with its whole worker")
        elif any(h.startswith("killed") for h in hows):
            why.append("its run died with its pool child")
        if any("Redis for lock" in line or "LockBackendError" in line for line in lines):
            why.append("a lock call failed (lost reply)")
        if meta.get("status") == "FAILURE":
            why.append(f"failed: {str(meta.get('result'))[:200]}")
        explained = bool(why)
        # Evidence of the Redis broker's own ways to lose a message (said, never counted apart).
        notes = [_held_in_paused_brpop(task_id, lines, kills)]
        entry: dict[str, Any] = {
            "task_id": task_id,
            "kind": by_id[task_id].kind,
            "lock": by_id[task_id].lock,
            "state": meta.get("status"),
            "runs": hows,
            "conflicts": actions,
        }
        if publishes is not None and receives is not None:
            its_publishes = publishes.get(task_id, ())
            its_receives = receives.get(task_id, ())
            entry["publishes"] = len(its_publishes)
            entry["receives"] = len(its_receives)
            if its_publishes:
                last = max(its_publishes, key=lambda p: p.before)
                entry["last_publish_s"] = _seconds(last.before)
                entry["last_publish_by"] = f"pid {last.pid}"
                near = [
                    k
                    for k in sorted(kills, key=lambda k: k.before)
                    if k.kind == "worker" and abs(k.before - last.before) <= 5e6
                ]
                entry["worker_kills_near"] = [
                    {
                        "worker": k.worker,
                        "kill_from_publish_s": round((k.before - last.before) / 1e6, 3),
                        "brpop_gone_from_publish_s": (
                            None
                            if k.brpop_gone is None
                            else round((k.brpop_gone - last.before) / 1e6, 3)
                        ),
                    }
                    for k in near
                ]
                dead = [
                    k
                    for k in near
                    if k.brpop_gone is not None and k.after < last.before <= k.brpop_gone
                ]
                if dead:
                    k = dead[0]
                    notes.append(
                        f"it was published {(last.before - k.before) / 1e6:.3f} s after worker "
                        f"{k.worker} was SIGKILLed, while Redis still listed that dead worker's "
                        f"blocked BRPOP (dropped {(k.brpop_gone - k.before) / 1e6:.3f} s after "
                        "the kill): Redis handed the message to the dead connection"
                    )
            if not explained:
                # Not proven lost in transit (judge counts those apart): say what is missing.
                _, evidence = transit_loss(
                    task_id,
                    str(meta.get("status")),
                    its_publishes,
                    its_receives,
                    kills,
                    broker=broker,
                    seen=[
                        *(r.start for r in its_runs),
                        *(int(c["t_s"] * 1e6) for c in conflicts.get(task_id, [])),
                    ],
                    in_broker=in_broker,
                )
                why.append(f"not a proven loss in transit: {evidence['why']}")
        why.extend(note for note in notes if note)
        out.append(
            {**entry, "why": "; ".join(why) or "unknown", "log": lines[-LOG_LINES_PER_LOST:]}
        )
    return out


_HELD = re.compile(r"^(w\d+)\.\d+\.log: .*paused BRPOP reply \(no prefetch credit\) holds task")


def _held_in_paused_brpop(task_id: str, lines: Sequence[str], kills: Sequence[Kill]) -> str:
    """What the Redis broker's BRPOP trace (``soakapp.trace_paused_brpop``) says of a lost task:
    its message held, unread, by a worker that was killed before it read it. "" if nothing."""
    last_held = None
    for i, line in enumerate(lines):
        if _HELD.search(line):
            last_held = i
    if last_held is None:
        return ""
    line = lines[last_held]
    worker = line.split(".", 1)[0]
    resumed = any("BRPOP reading resumed" in later for later in lines[last_held + 1 :])
    received = any(_RECEIVED.search(later) for later in lines[last_held + 1 :])
    at = _log_time(line)
    if at is None or resumed or received:
        return ""
    kill = next(
        (
            k
            for k in sorted(kills, key=lambda k: k.before)
            if k.kind == "worker" and k.worker == worker and k.after >= at
        ),
        None,
    )
    if kill is None:
        return ""
    return (
        f"its message was popped from the queue by worker {worker}'s pending BRPOP, whose "
        f"reply kombu left unread while the worker had no prefetch credit (held at "
        f"{datetime.fromtimestamp(at / 1e6).time()}, never resumed); {worker} was SIGKILLed "
        f"{(kill.before - at) / 1e6:.3f} s later with the message in its socket"
    )
