"""The soak's verdict (``benchmarks/soak``): lost tasks, overlaps, duplicate runs with their
causes and the recovery after kills, from the ledger, the result backend and the worker logs."""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from .records import SKIPPED, Kill, Publish, Run, Sent, _seconds
from .transit import transit_loss

LIMITS = {"api": 2}  # holders each lock allows at once (others: 1 writer)


@dataclass
class Verdict:
    """The judgement of one soak, from the ledger and the result backend alone."""

    tasks_sent: int
    tasks_completed: int
    tasks_lost: int
    overlaps: int
    duplicate_runs: int
    kills: int
    kills_children: int
    kills_workers: int
    max_recovery_s: float
    max_recovery_child_s: float
    max_recovery_worker_s: float
    runs: int
    runs_killed: int
    runs_unfinished: int
    skipped: int
    lost_ids: list[str]
    overlap_detail: list[dict[str, Any]]
    duplicate_detail: list[dict[str, Any]]
    duplicate_causes: dict[str, int]
    recovery_detail: list[dict[str, Any]]
    by_kind: dict[str, dict[str, int]]
    success_without_run: list[str] = field(default_factory=list)
    # Lost in transit by kombu's Redis transport, proven (see transit_loss); not in tasks_lost.
    broker_lost: int = 0
    broker_lost_detail: list[dict[str, Any]] = field(default_factory=list)
    # Of the tasks sent: messages published (ledger) and received (worker logs); None: not read.
    messages_published: int | None = None
    messages_received: int | None = None


def _run_brief(run: Run, end: int | None = None) -> dict[str, Any]:
    return {
        "task_id": run.task_id,
        "kind": run.kind,
        "pid": run.pid,
        "worker": run.worker,
        "start_s": _seconds(run.start),
        "end_s": None if end is None else _seconds(end),
    }


def effective_ends(
    runs: Iterable[Run], kills: Sequence[Kill], stopped_at: int
) -> dict[str, tuple[int, str, Kill | None]]:
    """Run id -> (when the body stopped, how: ended/killed/unfinished, the kill if killed).

    A body runs until it noted its end; one killed in between stops when its process was killed.
    The time read just *before* the kill is taken: the process died after it, and the lease
    outlives the process (released by the parent once the death is seen, or lapsing), so no
    legitimate holder can start between that time and the death. A run with neither is taken to
    run until the workers were stopped."""
    ordered = sorted(kills, key=lambda k: k.before)
    out: dict[str, tuple[int, str, Kill | None]] = {}
    for run in runs:
        if run.end is not None:
            out[run.run_id] = (run.end, "ended", None)
            continue
        # ``after``: a start noted in the instant between the reading and the kill died of it.
        kill = next((k for k in ordered if k.after >= run.start and k.hits(run)), None)
        if kill is not None:
            out[run.run_id] = (max(kill.before, run.start), "killed", kill)
        else:
            out[run.run_id] = (max(stopped_at, run.start), "unfinished", None)
    return out


def find_overlaps(
    runs: Sequence[Run], ends: Mapping[str, tuple[int, str, Kill | None]], limits: Mapping[str, int]
) -> list[dict[str, Any]]:
    """Runs that started while their lock did not allow one more holder, each with the holders
    it started beside. At equal times an end comes before a start (one clock, µs)."""
    by_lock: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_lock[run.lock].append(run)
    found: list[dict[str, Any]] = []
    for lock, lock_runs in sorted(by_lock.items()):
        limit = limits.get(lock, 1)
        events: list[tuple[int, int, str]] = []
        by_id = {run.run_id: run for run in lock_runs}
        for run in lock_runs:
            events.append((run.start, 1, run.run_id))
            events.append((ends[run.run_id][0], 0, run.run_id))
        events.sort()
        holding: dict[str, Run] = {}
        over: set[str] = set()  # a run killed as it started ends at its start: seen end first
        for _, is_start, run_id in events:
            run = by_id[run_id]
            if not is_start:
                if holding.pop(run_id, None) is None:
                    over.add(run_id)
                continue
            writers = [h for h in holding.values() if h.mode == "write"]
            readers = [h for h in holding.values() if h.mode == "read"]
            if run.mode == "read":
                beside = writers
            else:
                beside = readers + (writers if len(writers) >= limit else [])
            if beside:
                found.append(
                    {
                        "lock": lock,
                        "limit": limit,
                        "run": _run_brief(run, ends[run_id][0]),
                        "mode": run.mode,
                        "beside": [
                            {**_run_brief(h, ends[h.run_id][0]), "mode": h.mode} for h in beside
                        ],
                    }
                )
            if run_id not in over:
                holding[run_id] = run
    return found


def duplicate_cause(
    prev: Run, nxt: Run, kills: Sequence[Kill], visibility_timeout_s: float, broker: str = "redis"
) -> str:
    """Why a task that had completed ran again."""
    assert prev.end is not None
    if nxt.start < prev.end:
        return "two deliveries ran at once (counted as an overlap too)"
    for kill in kills:
        if kill.hits(prev) and kill.after >= prev.end and kill.before <= nxt.start:
            if kill.kind == "worker" and broker == "rabbitmq":
                return (
                    "whole worker killed after the body ended, before the ack: RabbitMQ "
                    "redelivered the message as the worker's connection dropped"
                )
            if kill.kind == "worker":
                return (
                    "whole worker killed after the body ended, before the ack: redelivered "
                    "after the visibility timeout"
                )
            return "pool child killed after the body ended, before the ack: requeued"
    if broker == "redis" and (nxt.start - prev.start) / 1e6 >= visibility_timeout_s:
        return (
            "no kill: redelivered after the visibility timeout (unacknowledged for longer, "
            "e.g. waiting for a free pool process)"
        )
    return "unexplained"


def judge(
    sent: Sequence[Sent],
    runs: Sequence[Run],
    kills: Sequence[Kill],
    states: Mapping[str, str],
    *,
    stopped_at: int,
    visibility_timeout_s: float,
    limits: Mapping[str, int] = LIMITS,
    broker: str = "redis",
    publishes: Mapping[str, Sequence[Publish]] | None = None,
    receives: Mapping[str, Sequence[int]] | None = None,
    conflicts: Mapping[str, Sequence[int]] | None = None,
    in_broker: Collection[str] | None = None,
) -> Verdict:
    """The verdict on what the ledger, the result backend and the worker logs say happened.

    A lost task is counted apart (``broker_lost``), not in ``tasks_lost``, only when
    :func:`transit_loss` proves it from ``publishes``, ``receives`` (the worker logs),
    ``conflicts`` (ledger µs of the conflicts noted per task id) and ``in_broker``; without
    them, every loss is in ``tasks_lost``."""
    ends = effective_ends(runs, kills, stopped_at)
    completed_runs: dict[str, list[Run]] = defaultdict(list)
    starts_of: dict[str, list[int]] = defaultdict(list)
    for run in runs:
        starts_of[run.task_id].append(run.start)
        if run.end is not None:
            completed_runs[run.task_id].append(run)
    sent_ids = {s.task_id for s in sent}
    completed = {t for t in sent_ids if completed_runs.get(t) or states.get(t) == SKIPPED}
    transit: list[dict[str, Any]] = []
    if publishes is not None and receives is not None:
        for task_id in sorted(sent_ids - completed):
            proven, evidence = transit_loss(
                task_id,
                states.get(task_id, "PENDING"),
                publishes.get(task_id, ()),
                receives.get(task_id, ()),
                kills,
                broker=broker,
                seen=[*starts_of.get(task_id, ()), *(conflicts or {}).get(task_id, ())],
                in_broker=in_broker,
            )
            if proven:
                its = next(s for s in sent if s.task_id == task_id)
                transit.append({**evidence, "kind": its.kind, "lock": its.lock})
    in_transit = {e["task_id"] for e in transit}
    lost = sorted(sent_ids - completed - in_transit)

    overlaps = find_overlaps(runs, ends, limits)

    duplicates: list[dict[str, Any]] = []
    causes: Counter[str] = Counter()
    for task_id, done in sorted(completed_runs.items()):
        if len(done) < 2:
            continue
        done.sort(key=lambda r: r.start)
        why = [
            duplicate_cause(a, b, kills, visibility_timeout_s, broker) for a, b in pairwise(done)
        ]
        causes.update(why)
        duplicates.append(
            {
                "task_id": task_id,
                "kind": done[0].kind,
                "runs": [_run_brief(r, r.end) for r in done],
                "causes": why,
            }
        )

    runs_by_lock: dict[str, list[int]] = defaultdict(list)
    for run in runs:
        runs_by_lock[run.lock].append(run.start)
    for starts in runs_by_lock.values():
        starts.sort()
    recovery: list[dict[str, Any]] = []
    for run in runs:
        _, how, kill = ends[run.run_id]
        if how != "killed" or kill is None:
            continue
        starts = runs_by_lock[run.lock]
        after = bisect.bisect_right(starts, kill.before)
        nxt = next((s for s in starts[after:] if s != run.start), None)
        if nxt is None:
            continue  # nothing ran on that lock afterwards
        recovery.append(
            {
                "kill": kill.kind,
                "pid": run.pid,
                "lock": run.lock,
                "task_id": run.task_id,
                "killed_s": _seconds(kill.before),
                "recovery_s": round((nxt - kill.before) / 1e6, 3),
            }
        )

    def worst(kind: str | None) -> float:
        return max(
            (r["recovery_s"] for r in recovery if kind is None or r["kill"] == kind), default=0.0
        )

    by_kind: dict[str, dict[str, int]] = {}
    for s in sent:
        row = by_kind.setdefault(s.kind, {"sent": 0, "completed": 0, "lost": 0, "broker_lost": 0})
        row["sent"] += 1
        if s.task_id in completed:
            row["completed"] += 1
        else:
            row["broker_lost" if s.task_id in in_transit else "lost"] += 1
    how_runs = Counter(how for _, how, _ in ends.values())
    return Verdict(
        tasks_sent=len(sent_ids),
        tasks_completed=len(completed),
        tasks_lost=len(lost),
        overlaps=len(overlaps),
        duplicate_runs=len(duplicates),
        kills=len(kills),
        kills_children=sum(k.kind == "child" for k in kills),
        kills_workers=sum(k.kind == "worker" for k in kills),
        max_recovery_s=worst(None),
        max_recovery_child_s=worst("child"),
        max_recovery_worker_s=worst("worker"),
        runs=len(runs),
        runs_killed=how_runs["killed"],
        runs_unfinished=how_runs["unfinished"],
        skipped=sum(states.get(t) == SKIPPED for t in sent_ids),
        lost_ids=lost,
        overlap_detail=overlaps,
        duplicate_detail=duplicates,
        duplicate_causes=dict(causes),
        recovery_detail=sorted(recovery, key=lambda r: -r["recovery_s"]),
        by_kind=by_kind,
        success_without_run=sorted(
            t for t in sent_ids if states.get(t) == "SUCCESS" and not completed_runs.get(t)
        ),
        broker_lost=len(transit),
        broker_lost_detail=transit,
        messages_published=(
            None if publishes is None else sum(len(publishes.get(t, ())) for t in sent_ids)
        ),
        messages_received=(
            None if receives is None else sum(len(receives.get(t, ())) for t in sent_ids)
        ),
    )
