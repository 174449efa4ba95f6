"""Soak under chaos: locked tasks on two real workers for N minutes while processes are killed
and lock replies are lost; then every task is accounted for, and every lock checked.

Topology (all on 127.0.0.1, every server and worker started here and stopped at the end):

* the broker (``--broker``): a throwaway ``rabbitmq-server`` (``tests/rabbit.py``; the default
  when Debian's package is installed), or ``main`` (``--broker redis``);
* ``main``: one ``redis-server`` for the result backend and the locks (and the Redis broker);
* ``ledger``: a second ``redis-server`` that the chaos never touches, where every run notes its
  start before its body and its end after it, stamped with the ledger's clock (``TIME``), and
  where the chaos notes each kill (see ``benchmarks/soakapp.py``);
* a fault proxy (``tests/faultproxy.py``) in this process, between the workers' lock client and
  ``main``: the broker and the results are reached directly, and so is this process's producer;
* two ``celery worker`` processes (prefork, ``-c 2``, ``acks_late`` with
  ``task_reject_on_worker_lost``, lease ttl 15 s, lock backend errors retried; with the Redis
  broker, visibility timeout 10 s), each in a process group of its own.

For ``--minutes`` a producer publishes a steady mix: an exclusive lock per key over four keys,
a cap of two, readers and writers of one resource, and a task unique until it finishes over
three keys; every locked task retries on conflict; bodies sleep 0.05-0.5 s. Meanwhile a chaos
loop (seeded: ``--seed``) SIGKILLs pool children (preferably busy ones; the worker's parent
releases their leases) and whole workers (their process group; restarted at once), and makes
the proxy reset the connection after, or swallow the reply of, the next ``EVALSHA``.

Then the chaos stops, the proxy heals, and the workers drain: until every task sent has an
outcome, or nothing is queued nor unacknowledged for 3 s, or 60 s + ttl passed. The verdict
comes from the ledger, the result backend and the worker logs, never from what the producer
expected:

* ``tasks_sent``: messages this process published (a unique call that returned an existing
  copy's result published nothing and is not counted);
* ``tasks_completed``: sent ids with a run that noted its end, or that ended ``SKIPPED``;
* ``tasks_lost``: sent ids that did neither (target 0, with either broker), except the ones
  below, listed with their result state, their runs, the lock conflicts noted for them, the
  worker log lines about them and a likely cause;
* ``broker_lost`` (Redis broker only): sent ids whose message was lost in transit by kombu's
  Redis transport, which takes a message off the queue (``BRPOP``) before it records it as
  unacknowledged, so a worker killed in between loses it. Counted apart from ``tasks_lost``, and
  only when proven: a lost task still ``PENDING`` or ``RETRY`` whose last published message (the
  ledger notes every publish) no worker logged receiving (fewer receipts than publishes, none
  after that publish), that never ran nor met a conflict after it, that is neither queued nor
  unacknowledged in the broker once the workers stopped, and with a whole worker SIGKILLed
  within 1 s after that publish (a kill not over when the publish began counts: their order is
  unknown). RabbitMQ has no such window (it redelivers every unacknowledged message when the
  consumer's connection drops): with it, every loss counts in ``tasks_lost``;
* ``overlaps``: runs that started while their lock did not allow another holder (exclusive: a
  second run; the cap: a third; read/write: a writer beside anyone, a reader beside a writer)
  (target 0). A run killed mid-body ends when its process (or its worker's group) was killed;
  a run with no end and no kill is taken to run until the workers were stopped;
* ``duplicate_runs``: task ids that completed more than once, each with its cause where it can
  be told (a kill after the first run's end and before its acknowledgement, a redelivery after
  the visibility timeout): at-least-once delivery, reported, not a target;
* ``kills`` (``kills_children``, ``kills_workers``), ``reply_faults`` (faults the proxy
  injected) and ``max_recovery_s``: the longest time from a kill to the next start of a run on a
  lock that a killed run held.

With the Redis broker a lost task left in ``tasks_lost`` also gets the broker's own evidence,
which never moves it out: the workers log a message that kombu holds unread in a paused BRPOP
reply (no prefetch credit; ``soakapp.trace_paused_brpop``), and the chaos measures how long
Redis keeps a killed worker's blocked BRPOP (a message pushed meanwhile goes to the dead
connection). Whenever the logs are kept, ``ledger.json`` beside them holds the whole ledger.

Run from the repository root::

    python benchmarks/soak.py [--minutes 5] [--seed N] [--json out.json] [--broker redis]

``--rate``, ``--ttl``, ``--visibility-timeout`` and ``--drain`` change the load and the bounds;
``--keep-logs`` keeps the worker logs of a run that passed; ``--no-proxy`` runs without the
fault proxy (no lost replies; the lock Redis is reached directly).

``--broker`` picks RabbitMQ or Redis (default: RabbitMQ if ``rabbitmq-server`` is installed at
``RabbitServer.binary``, else Redis; the choice is printed).

Exit status 1 when a target is missed (worker logs are then kept and their folder printed),
2 when the soak could not run. Ctrl-C and SIGTERM stop every process started here.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from types import ModuleType
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
sys.path.insert(0, str(HERE))  # common.py and soakapp.py live next to this script
sys.path.insert(1, str(TESTS))  # the fault proxy and the worker helpers are test helpers
from common import Target, print_targets, section, version_of  # noqa: E402

WORKERS = ("w1", "w2")
CONCURRENCY = 2
READY_TIMEOUT_S = 60
QUIET_S = 3.0  # nothing queued nor unacknowledged for this long: the drain is over
LOCK_SOCKET_TIMEOUT_S = 1  # the workers' lock client: a swallowed reply costs 1 s, not 5
# Chaos: every action of a bag is drawn (in a seeded order) before the bag is refilled, so a
# one-minute run sees each kind of fault; one action every 1-3 s.
CHAOS_BAG = ("child",) * 3 + ("worker",) + ("reset",) * 4 + ("drop",)
CHAOS_GAP_S = (1.0, 3.0)
AIM_AT_BUSY = 0.8  # how often a child kill picks a child that is running a task
# The producer's mix: kind -> share of the calls.
MIX = {"exclusive": 0.35, "cap": 0.2, "read": 0.2, "write": 0.07, "unique": 0.18}
EXCLUSIVE_KEYS = 4
UNIQUE_KEYS = 3
RESOURCE = "doc"
LIMITS = {"api": 2}  # holders each lock allows at once (others: 1 writer)
BODY_S = (0.05, 0.5)
SKIPPED = "SKIPPED"
FINAL_STATES = ("SUCCESS", "FAILURE", "REVOKED", SKIPPED)
LOG_LINES_PER_LOST = 8
DETAIL_LIMIT = 50  # entries per detail list in the JSON

_LOG_TIME = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}):")
BROKERS = ("rabbitmq", "redis")
# A message that no worker logged receiving is taken as lost in transit by kombu's Redis
# transport only with a whole-worker kill at most this long after its publish.
TRANSIT_KILL_S = 1.0
LOG_SLACK_US = 1000  # a log line's stamp is its time cut to the millisecond
BROKER_LOSS_WHY = (
    "kombu's Redis transport takes a message off the queue (BRPOP) before it records it as "
    "unacknowledged, so a worker killed in between loses it; RabbitMQ has no such window (it "
    "redelivers every unacknowledged message when the consumer's connection drops)"
)
# A task id in brackets: Celery's and the lock layer's log lines about that task (a line naming
# it as a lock's holder is about another task).
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_SUBJECT = re.compile(rf"\[({_UUID})\]")
# The worker's line for a message it took from the broker: "Task name[id] received" (Celery
# 5.4+), "Received task: name[id]" (before).
_RECEIVED = re.compile(rf"(?:Received task: \S+\[({_UUID})\]|Task \S+\[({_UUID})\] received)")


# -- what happened: runs, kills, sends -----------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One run of a task body, as the ledger noted it (times: ledger µs)."""

    run_id: str
    task_id: str
    kind: str
    lock: str
    mode: str
    pid: int
    ppid: int
    worker: str
    start: int
    end: int | None


@dataclass(frozen=True)
class Kill:
    """A SIGKILL the chaos sent: ``before``/``after`` are ledger µs read around the kill."""

    kind: str  # "child": one pool child; "worker": the worker's whole process group
    worker: str
    group: int  # the worker's main pid (its process group)
    pids: tuple[int, ...]
    before: int
    after: int
    # Redis broker, whole worker: when Redis dropped the dead worker's blocked BRPOP (µs; a
    # message pushed before then went to that dead connection); None: not measured.
    brpop_gone: int | None = None

    def hits(self, run: Run) -> bool:
        if run.pid in self.pids:
            return True
        # A child forked after the group's pids were listed died with its group too.
        return self.kind == "worker" and run.ppid == self.group


@dataclass(frozen=True)
class Sent:
    task_id: str
    kind: str
    lock: str
    at: int = 0  # when it was published, µs of this host's clock (the ledger's too: one host)


@dataclass(frozen=True)
class Publish:
    """A message published for a task (the producer's, or a worker's retry or re-publish): it
    went out between ``before`` and ``after`` (µs, this host's clock, the ledger's too)."""

    task_id: str
    before: int
    after: int
    pid: int = 0
    host: str = ""


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


def _seconds(us: int) -> float:
    return round(us / 1e6, 6)


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


def transit_loss(
    task_id: str,
    state: str,
    publishes: Sequence[Publish],
    receives: Sequence[int],
    kills: Sequence[Kill],
    *,
    broker: str,
    seen: Sequence[int] = (),
    in_broker: Collection[str] | None = None,
) -> tuple[bool, dict[str, Any]]:
    """Whether a lost task is *proven* lost in transit by kombu's Redis transport, with the
    evidence, or with what is missing for that proof (``why``).

    ``publishes``: its messages (ledger); ``receives``: when a worker logged receiving it (µs of
    each "received" line); ``seen``: when the ledger noted a run start or a conflict of it;
    ``in_broker``: task ids still queued or unacknowledged in the broker after the workers
    stopped (``None``: not read). Proven only if every one holds: the broker is Redis; the task
    is still PENDING or RETRY; it has fewer receipts than publishes and none at or after the
    last publish began; nothing of it was noted after then; it is not in the broker; and a whole
    worker was SIGKILLed within ``TRANSIT_KILL_S`` after that publish returned."""
    evidence: dict[str, Any] = {"task_id": task_id, "state": state}

    def no(why: str) -> tuple[bool, dict[str, Any]]:
        return False, {**evidence, "why": why}

    if broker != "redis":
        return no(f"the broker is {broker}: no message is lost in transit there")
    if state not in ("PENDING", "RETRY"):
        return no(f"its state is {state}")
    if not publishes:
        return no("no publish of it was noted")
    last = max(publishes, key=lambda p: p.before)
    evidence.update(
        publishes=len(publishes),
        receives=len(receives),
        last_publish_s=_seconds(last.before),
        last_publish_by=f"pid {last.pid}" + (f" on {last.host}" if last.host else ""),
    )
    if len(receives) >= len(publishes):
        return no(f"{len(publishes)} message(s) published, {len(receives)} received")
    # A line stamped t was written in [t, t + 1 ms): it may be that message's if t + 1 ms > before.
    late = [r for r in receives if r + LOG_SLACK_US > last.before]
    if late:
        return no(f"a worker logged receiving it {(late[0] - last.before) / 1e6:+.3f} s after "
                  "its last publish began")  # fmt: skip
    noted = [t for t in seen if t >= last.before]
    if noted:
        return no("a run or a conflict of it was noted after its last publish")
    if in_broker is None:
        return no("the broker's queues were not read")
    if task_id in in_broker:
        return no("its message is still queued or unacknowledged in the broker")
    # The kill came after the message could be on the queue (the publish had begun) and at most
    # TRANSIT_KILL_S after the publish returned.
    near = [
        k
        for k in sorted(kills, key=lambda k: k.before)
        if k.kind == "worker"
        and k.after >= last.before
        and k.before - last.after <= TRANSIT_KILL_S * 1e6
    ]
    if not near:
        return no(
            f"its last message was never received, but no whole worker was killed within "
            f"{TRANSIT_KILL_S:g} s after it was published"
        )
    kill = near[0]
    lag = (kill.before - last.after) / 1e6
    when = (
        f"{lag:.3f} s after it was published"
        if lag >= 0
        else (
            f"as it was published (the SIGKILL went out within "
            f"{(kill.after - kill.before) / 1e3:.1f} ms from "
            f"{(kill.before - last.before) / 1e3:+.1f} ms of the publish's start; the publish "
            f"took {(last.after - last.before) / 1e3:.1f} ms)"
        )
    )
    evidence.update(
        killed_worker=kill.worker,
        killed_group=kill.group,
        kill_s=_seconds(kill.before),
        kill_after_publish_s=round((kill.before - last.after) / 1e6, 3),
        in_broker=False,
        why=(
            f"its last message ({len(publishes)} published, {len(receives)} received) was "
            f"never received by any worker, is in no queue nor unacknowledged, and worker "
            f"{kill.worker} was SIGKILLed {when}"
        ),
    )
    return True, evidence


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


# -- the ledger ----------------------------------------------------------------------------------


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
    """Task id -> the result backend's record (``{"status": "PENDING"}`` when it has none)."""
    out: dict[str, dict[str, Any]] = {}
    for first in range(0, len(task_ids), 500):
        chunk = task_ids[first : first + 500]
        keys = [app.backend.get_key_for_task(t) for t in chunk]
        for task_id, raw in zip(chunk, main.mget(keys), strict=True):
            out[task_id] = json.loads(raw) if raw else {"status": "PENDING"}
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


# -- workers -------------------------------------------------------------------------------------


class Fleet:
    """The soak's workers by name; each start of one is an incarnation with a log of its own
    (``w1.0.log``, ``w1.1.log``, ...), in a process group of its own."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        from celery_redislock.taskdemo.processes import Children

        self.log_dir = log_dir
        self.children = Children(log_dir, cwd=HERE, env=env)
        self.current: dict[str, str] = {}
        self.incarnations: Counter[str] = Counter()

    @staticmethod
    def command(name: str) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "soakapp", "worker", "-P", "prefork",
            "-c", str(CONCURRENCY), "-n", f"{name}@%h", "-Q", "soak", "-l", "info",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip

    def start(self, name: str) -> None:
        label = f"{name}.{self.incarnations[name]}"
        self.incarnations[name] += 1
        self.children.start(label, self.command(name))
        self.current[name] = label

    def proc(self, name: str) -> subprocess.Popen[bytes]:
        return self.children.procs[self.current[name]]

    def ready(self, name: str) -> bool:
        label = self.current[name]
        return self.proc(name).poll() is None and " ready." in self.children.log(label)

    def wait_ready(self, names: Sequence[str], timeout: float = READY_TIMEOUT_S) -> None:
        self.children.wait_ready([self.current[n] for n in names], timeout)

    def pool(self, name: str) -> list[int]:
        from workers import children_of

        return children_of(self.proc(name).pid)

    def logs(self) -> list[Path]:
        return sorted(self.log_dir.glob("w*.log"))

    def stop(self, grace: float = 10) -> None:
        self.children.stop(grace)


# -- the producer --------------------------------------------------------------------------------


class Producer(threading.Thread):
    """Publishes a steady mix of calls at ``rate`` per second until stopped or ``duration``
    passed; a call counts as sent only if it published a message (``after_task_publish``)."""

    def __init__(
        self, soakapp: ModuleType, ledger: redis.Redis, rng: random.Random, rate: float,
        duration: float,
    ) -> None:  # fmt: skip
        super().__init__(name="soak-producer", daemon=True)
        self.soakapp, self.ledger, self.rng = soakapp, ledger, rng
        self.rate, self.duration = rate, duration
        self.stopping = threading.Event()
        self.sent: list[Sent] = []
        self.calls: Counter[str] = Counter()
        self.errors: list[str] = []
        self._published: list[str] = []

    def note_publish(self, sender: Any = None, headers: Any = None, **_: Any) -> None:
        # Called inside apply_async, in this thread, once per message really published.
        if threading.current_thread() is self and headers and headers.get("id"):
            self._published.append(headers["id"])

    def run(self) -> None:
        period = 1 / self.rate
        began = time.monotonic()
        for i in range(int(self.duration * self.rate) + 1):
            wait = began + i * period - time.monotonic()
            if self.stopping.wait(max(0.0, wait)) or time.monotonic() - began >= self.duration:
                return
            self.call(i)

    def call(self, i: int) -> None:
        app, rng = self.soakapp, self.rng
        kind = rng.choices(list(MIX), weights=list(MIX.values()))[0]
        seconds = round(rng.uniform(*BODY_S), 3)
        args: tuple[Any, ...]
        if kind == "exclusive":
            key = str(rng.randrange(EXCLUSIVE_KEYS))
            task, args, lock = app.exclusive, (key, seconds), f"k:{key}"
        elif kind == "cap":
            task, args, lock = app.capped, (i, seconds), "api"
        elif kind in ("read", "write"):
            task, args, lock = getattr(app, kind), (RESOURCE, seconds), f"rw:{RESOURCE}"
        else:
            n = rng.randrange(UNIQUE_KEYS)
            task, args, lock = app.unique, (n, seconds), f"u:{n}"
        self.calls[kind] += 1
        before = len(self._published)
        try:
            result = task.apply_async(args)
        except Exception as exc:  # counted, never a send: nothing was published
            self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
            return
        if result.id in self._published[before:]:
            self.sent.append(Sent(result.id, kind, lock, time.time_ns() // 1000))
            with contextlib.suppress(redis.RedisError):
                self.ledger.hset("soak:sent", result.id, json.dumps({"kind": kind, "lock": lock}))


# -- the chaos -----------------------------------------------------------------------------------


class Chaos:
    """Kills pool children and whole workers and injects reply faults, one action at a time."""

    def __init__(
        self, fleet: Fleet, ledger: redis.Redis, proxy: Any, rng: random.Random,
        broker_redis: redis.Redis | None = None,
    ) -> None:  # fmt: skip
        self.fleet, self.ledger, self.proxy, self.rng = fleet, ledger, proxy, rng
        self.broker_redis = broker_redis  # the Redis broker, to watch a dead worker's BRPOP
        self.kills: list[Kill] = []
        self.armed: Counter[str] = Counter()
        self.restart_failures: list[str] = []
        self._bag: list[str] = []

    def next_action(self) -> str:
        if not self._bag:
            self._bag = list(
                CHAOS_BAG if self.proxy else [a for a in CHAOS_BAG if a in ("child", "worker")]
            )
            self.rng.shuffle(self._bag)
        return self._bag.pop()

    def run(self, until: float) -> None:
        """Acts until the monotonic time ``until``."""
        while True:
            gap = self.rng.uniform(*CHAOS_GAP_S)
            if time.monotonic() + gap >= until:
                time.sleep(max(0.0, until - time.monotonic()))
                return
            time.sleep(gap)
            self.supervise()
            self.act(self.next_action())

    def supervise(self) -> None:
        """Restarts a worker that exited by itself (not one of our kills): noted as a failure."""
        for name in WORKERS:
            code = self.fleet.proc(name).poll()
            if code is not None:
                self.restart_failures.append(f"{self.fleet.current[name]} exited with {code}")
                self.fleet.start(name)

    def act(self, action: str) -> None:
        ready = [n for n in WORKERS if self.fleet.ready(n)]
        if action == "worker":
            if len(ready) < len(WORKERS):
                if self._bag and self._bag[0] != action:
                    self._bag.insert(0, action)  # last in this bag: both are up again by then
                action = "child"
            else:
                self.kill_worker(self.rng.choice(ready))
                return
        if action == "child":
            if ready:
                self.kill_child(self.rng.choice(ready))
        elif action == "reset":
            self.proxy.reset_after(1, command="EVALSHA")
            self.armed[action] += 1
        elif action == "drop":
            self.proxy.drop_replies(1, command="EVALSHA")
            self.armed[action] += 1

    def kill_child(self, name: str) -> None:
        pool = self.fleet.pool(name)
        if not pool:
            return
        busy = {int(p) for p in self.ledger.hkeys("soak:busy")} & set(pool)
        targets = sorted(busy) if busy and self.rng.random() < AIM_AT_BUSY else pool
        pid = self.rng.choice(targets)
        self._kill("child", name, (pid,), lambda: os.kill(pid, signal.SIGKILL))

    def kill_worker(self, name: str) -> None:
        proc = self.fleet.proc(name)
        pids = (proc.pid, *self.fleet.pool(name))
        brpop: set[int] = set()
        if self.broker_redis is not None:
            with contextlib.suppress(OSError, redis.RedisError):
                brpop = brpop_clients(self.broker_redis, proc.pid)
        self._kill("worker", name, pids, lambda: os.killpg(proc.pid, signal.SIGKILL), brpop)
        proc.wait(10)
        self.fleet.start(name)  # right away, as a supervisor would

    def _kill(
        self, kind: str, name: str, pids: tuple[int, ...], kill: Any, brpop: set[int] = frozenset()
    ) -> None:  # fmt: skip
        group = self.fleet.proc(name).pid
        before = ledger_now(self.ledger)
        try:
            kill()
        except ProcessLookupError:
            return  # it had just exited: nothing was killed
        after = ledger_now(self.ledger)
        gone = None
        if brpop and self.broker_redis is not None:
            with contextlib.suppress(redis.RedisError):
                gone = self._brpop_gone(brpop)
        record = Kill(kind, name, group, pids, before, after, gone)
        self.kills.append(record)
        self.ledger.rpush("soak:kills", json.dumps(asdict(record)))

    def _brpop_gone(self, ids: set[int], bound_s: float = 1.0) -> int | None:
        """When Redis no longer lists any of these (a killed worker's BRPOP) clients."""
        assert self.broker_redis is not None
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            listed = {int(c["id"]) for c in self.broker_redis.client_list()}
            if not ids & listed:
                return ledger_now(self.ledger)
            time.sleep(0.001)
        return None


def _socket_ports(pid: int) -> set[int]:
    """Local TCP ports of the sockets process ``pid`` has open (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def brpop_clients(broker: redis.Redis, pid: int) -> set[int]:
    """Redis client ids of the BRPOP connections of worker process ``pid``."""
    ports = _socket_ports(pid)
    return {
        int(c["id"])
        for c in broker.client_list()
        if c.get("cmd") == "brpop" and int(c["addr"].rsplit(":", 1)[1]) in ports
    }


# -- the broker ----------------------------------------------------------------------------------


class RedisBroker:
    """kombu's Redis transport on ``main``: its queue lists and its ``unacked`` hash."""

    name = "redis"
    QUEUES = ("soak", *(f"soak\x06\x16{p}" for p in (3, 6, 9)))  # kombu's priority steps

    def __init__(self, main: redis.Redis, url: str) -> None:
        self.main, self.url = main, url

    def describe(self, visibility_timeout: float) -> str:
        return f"Redis (main), visibility timeout {visibility_timeout:g} s"

    def backlog(self) -> int | None:
        """Messages queued or delivered but not acknowledged."""
        queued = sum(self.main.llen(q) for q in self.QUEUES)
        return queued + int(self.main.hlen("unacked"))

    def message_ids(self) -> set[str] | None:
        """Task ids of every message queued or unacknowledged."""
        raws = [raw for q in self.QUEUES for raw in self.main.lrange(q, 0, -1)]
        for raw in self.main.hvals("unacked"):
            with contextlib.suppress(ValueError, IndexError, TypeError):
                raws.append(json.dumps(json.loads(raw)[0]))  # [message, exchange, routing key]
        ids = set()
        for raw in raws:
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                ids.add(json.loads(raw)["headers"]["id"])
        return ids


class RabbitBroker:
    """A throwaway ``rabbitmq-server`` (``tests/rabbit.py``), read with ``rabbitmqctl``."""

    name = "rabbitmq"

    def __init__(self, server: Any) -> None:
        self.server, self.url = server, server.url

    def describe(self, visibility_timeout: float) -> str:
        version = "?"
        with contextlib.suppress(Exception):
            from kombu import Connection

            with Connection(self.url, connect_timeout=5) as conn:
                conn.connect()
                version = _text(conn.connection.server_properties.get("version", "?"))
        return f"RabbitMQ {version} (:{self.server.port})"

    def backlog(self) -> int | None:
        """Messages ready or delivered but not acknowledged in the soak's queue (None: unknown)."""
        ctl = Path(self.server.binary).with_name("rabbitmqctl")
        try:
            done = subprocess.run(
                [str(ctl), "-n", f"test{self.server.port}@localhost", "-q", "list_queues",
                 "name", "messages"],
                env={**os.environ, "HOME": str(self.server.dir)},  # its Erlang cookie
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return None
        for line in done.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "soak" and parts[1].isdigit():
                return int(parts[1])
        return None

    def message_ids(self) -> set[str] | None:
        return None  # RabbitMQ lists no message without taking it


# -- draining ------------------------------------------------------------------------------------


def drain(
    broker: RedisBroker | RabbitBroker,
    main: redis.Redis,
    ledger: redis.Redis,
    app: Any,
    sent: Sequence[Sent],
    bound_s: float,
) -> str:
    """Waits until every task sent has an outcome or nothing is left to run; says which."""
    deadline = time.monotonic() + bound_s
    quiet_since: float | None = None
    waiting = {s.task_id for s in sent}
    while time.monotonic() < deadline:
        done = {r.task_id for r in read_runs(ledger) if r.end is not None}
        waiting -= done
        if waiting:
            states = read_states(main, app, sorted(waiting))
            waiting -= {t for t, meta in states.items() if meta.get("status") in FINAL_STATES}
        if not waiting:
            return "every task sent has an outcome"
        if broker.backlog() == 0:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= QUIET_S:
                return f"nothing queued nor unacknowledged for {QUIET_S:g} s"
        else:
            quiet_since = None
        time.sleep(0.5)
    return f"bound of {bound_s:g} s reached"


# -- explaining lost tasks -----------------------------------------------------------------------


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


def _log_time(line: str) -> int | None:
    """The µs timestamp of a worker log line (local time, this host's clock)."""
    found = _LOG_TIME.search(line)
    if found is None:
        return None
    return int(datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1e6)


# -- the report ----------------------------------------------------------------------------------


def print_report(
    verdict: Verdict, producer: Producer, chaos: Chaos, faults: int | None,
    lost: Sequence[dict[str, Any]], drained: str, drain_s: float, broker: str = "redis",
) -> None:  # fmt: skip
    section("Load")
    print(
        f"  {'kind':<10} {'calls':>6} {'sent':>6} {'completed':>10} {'lost':>6} {'broker_lost':>12}"
    )
    for kind in MIX:
        row = verdict.by_kind.get(kind, {"sent": 0, "completed": 0, "lost": 0, "broker_lost": 0})
        print(
            f"  {kind:<10} {producer.calls[kind]:>6} {row['sent']:>6} {row['completed']:>10} "
            f"{row['lost']:>6} {row['broker_lost']:>12}"
        )
    unique_dups = producer.calls["unique"] - verdict.by_kind.get("unique", {}).get("sent", 0)
    print(f"  unique calls answered with the copy already queued or running: {unique_dups}")
    if producer.errors:
        print(f"  publish errors (not sends): {len(producer.errors)}, e.g. {producer.errors[0]}")
    print(
        f"  runs noted: {verdict.runs} ({verdict.runs_killed} killed mid-body, "
        f"{verdict.runs_unfinished} unfinished)"
    )

    section("Chaos")
    print(
        f"  kills: {verdict.kills} ({verdict.kills_children} pool children, "
        f"{verdict.kills_workers} whole workers, each restarted at once)"
    )
    if faults is None:
        print("  reply faults: none (--no-proxy)")
    else:
        print(
            f"  reply faults injected: {faults} (armed: {chaos.armed['reset']} resets after "
            f"EVALSHA, {chaos.armed['drop']} swallowed EVALSHA replies)"
        )
    print(
        f"  max recovery (kill -> next start on a lock a killed run held): "
        f"{verdict.max_recovery_s:.3f} s (child kills {verdict.max_recovery_child_s:.3f} s, "
        f"worker kills {verdict.max_recovery_worker_s:.3f} s)"
    )
    if chaos.restart_failures:
        print(f"  worker restarts that failed: {chaos.restart_failures}")

    section("Outcome")
    print(f"  drained in {drain_s:.1f} s: {drained}")
    print(
        f"  sent {verdict.tasks_sent}, completed {verdict.tasks_completed} "
        f"({verdict.skipped} skipped), lost {verdict.tasks_lost}, lost in transit by the "
        f"broker {verdict.broker_lost}"
    )
    if broker == "redis":
        print(
            f"  broker_lost: {verdict.broker_lost}, kept out of tasks lost: {BROKER_LOSS_WHY}. "
            f"Counted so only when proven: no worker logged receiving its last message, which "
            f"is in no queue, and a whole worker was killed within {TRANSIT_KILL_S:g} s after "
            f"it was published"
        )
    else:
        print(
            "  broker_lost: none by construction: RabbitMQ redelivers every unacknowledged "
            "message when the consumer's connection drops, so every loss counts in tasks lost"
        )
    for entry in verdict.broker_lost_detail[:10]:
        print(f"    {entry['task_id']} {entry['kind']} on {entry['lock']}: {entry['why']}")
    if verdict.messages_published is not None:
        print(
            f"  messages of the tasks sent: {verdict.messages_published} published (the "
            f"producer's, retries, re-publishes), {verdict.messages_received} received "
            f"(worker logs; redeliveries too)"
        )
    print(f"  overlaps: {verdict.overlaps}")
    for overlap in verdict.overlap_detail[:10]:
        beside = ", ".join(f"{b['task_id']} ({b['mode']}, pid {b['pid']})" for b in
                           overlap["beside"])  # fmt: skip
        print(
            f"    {overlap['lock']} (limit {overlap['limit']}): {overlap['run']['task_id']} "
            f"({overlap['mode']}, pid {overlap['run']['pid']}) started beside {beside}"
        )
    print(f"  duplicate runs (task ids that completed more than once): {verdict.duplicate_runs}")
    for cause, count in sorted(verdict.duplicate_causes.items(), key=lambda c: -c[1]):
        print(f"    {count} x {cause}")
    if verdict.success_without_run:
        print(f"  SUCCESS without a completed run in the ledger: {verdict.success_without_run}")
    if lost:
        print(f"  lost tasks ({len(lost)}), by likely cause:")
        for why, count in Counter(entry["why"] for entry in lost).most_common():
            print(f"    {count} x {why}")
        for entry in lost[:10]:
            counts = (
                f", published {entry['publishes']}, received {entry['receives']}"
                if "publishes" in entry
                else ""
            )
            print(
                f"    {entry['task_id']} {entry['kind']} on {entry['lock']}: state "
                f"{entry['state']}, runs {entry['runs'] or 'none'}, conflicts "
                f"{entry['conflicts'] or 'none'}{counts}"
            )
            for line in entry["log"][-3:]:
                print(f"      {line}")


def json_report(
    verdict: Verdict, producer: Producer, chaos: Chaos, faults: int | None,
    lost: Sequence[dict[str, Any]], broker: str = "redis",
) -> dict[str, Any]:  # fmt: skip
    """The figures ``--json`` writes: the seven the issue names first, then the detail."""
    return {
        "tasks_sent": verdict.tasks_sent,
        "tasks_completed": verdict.tasks_completed,
        "tasks_lost": verdict.tasks_lost,
        "overlaps": verdict.overlaps,
        "duplicate_runs": verdict.duplicate_runs,
        "kills": verdict.kills,
        "max_recovery_s": verdict.max_recovery_s,
        "broker": broker,
        "broker_lost": verdict.broker_lost,
        "broker_lost_ids": [e["task_id"] for e in verdict.broker_lost_detail],
        "broker_lost_why": BROKER_LOSS_WHY if broker == "redis" else None,
        "broker_lost_tasks": verdict.broker_lost_detail[:DETAIL_LIMIT],
        "messages_published": verdict.messages_published,
        "messages_received": verdict.messages_received,
        "kills_children": verdict.kills_children,
        "kills_workers": verdict.kills_workers,
        "reply_faults": faults,
        "max_recovery_child_s": verdict.max_recovery_child_s,
        "max_recovery_worker_s": verdict.max_recovery_worker_s,
        "duplicate_causes": verdict.duplicate_causes,
        "skipped": verdict.skipped,
        "runs": verdict.runs,
        "runs_killed": verdict.runs_killed,
        "runs_unfinished": verdict.runs_unfinished,
        "sent_by_kind": verdict.by_kind,
        "calls_by_kind": dict(producer.calls),
        "publish_errors": len(producer.errors),
        "lost_causes": dict(Counter(entry["why"] for entry in lost)),
        "lost_tasks": lost[:DETAIL_LIMIT],
        "overlap_detail": verdict.overlap_detail[:DETAIL_LIMIT],
        "duplicate_detail": verdict.duplicate_detail[:DETAIL_LIMIT],
        "recovery_detail": verdict.recovery_detail[:DETAIL_LIMIT],
        "kill_detail": [
            {**asdict(k), "before_s": _seconds(k.before), "after_s": _seconds(k.after)}
            for k in chaos.kills
        ],
        "success_without_run": verdict.success_without_run,
        "worker_restart_failures": chaos.restart_failures,
    }


# -- main ----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="chaos period (default 5)")
    parser.add_argument("--seed", type=int, help="seeds the chaos and the producer's mix")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results here")
    parser.add_argument("--rate", type=float, default=6.0, help="calls per second (default 6)")
    parser.add_argument("--ttl", type=float, default=15.0, help="lease ttl, s (default 15)")
    parser.add_argument(
        "--broker",
        choices=BROKERS,
        help="the workers' broker (default: rabbitmq if rabbitmq-server is installed, else redis)",
    )
    parser.add_argument(
        "--visibility-timeout",
        type=float,
        default=10.0,
        help="the Redis broker's, s (default 10)",
    )
    parser.add_argument("--drain", type=float, help="longest drain, s (default 60 + ttl)")
    parser.add_argument("--keep-logs", action="store_true", help="keep worker logs on success")
    parser.add_argument(
        "--no-proxy",
        action="store_true",
        help="no fault proxy: workers reach the lock Redis directly, no reply faults",
    )
    args = parser.parse_args(argv)
    if not args.minutes > 0 or not args.rate > 0:
        parser.error("--minutes and --rate must be positive")
    return args


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the blocks that stop every process


@contextlib.contextmanager
def _proxy(enabled: bool, port: int) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    from faultproxy import FaultProxy

    with FaultProxy("127.0.0.1", port) as proxy:
        yield proxy


def rabbit_binary() -> str:
    from rabbit import RabbitServer

    return RabbitServer.binary


def pick_broker(asked: str | None) -> tuple[str, str]:
    """The broker to soak with, and why."""
    binary = rabbit_binary()
    if asked is not None:
        return asked, "--broker"
    if os.path.exists(binary):
        return "rabbitmq", f"the default: {binary} is installed"
    return "redis", f"the default without RabbitMQ: {binary} is not installed"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    began = time.perf_counter()
    log_dir = Path(tempfile.mkdtemp(prefix="soak-"))
    keep_logs = True  # until the verdict says otherwise
    try:
        result = soak(args, seed, log_dir, began)
        keep_logs = args.keep_logs or result != 0
        return result
    except KeyboardInterrupt:
        print("\ninterrupted; every process started here is stopped", flush=True)
        return 130
    finally:
        if keep_logs:
            print(f"worker logs: {log_dir}", flush=True)
        else:
            shutil.rmtree(log_dir, ignore_errors=True)


def soak(args: argparse.Namespace, seed: int, log_dir: Path, began: float) -> int:
    from celery.signals import after_task_publish

    from celery_redislock.server import RedisServer

    broker_name, why = pick_broker(args.broker)
    print(f"broker: {broker_name} ({why})", flush=True)
    if broker_name == "rabbitmq" and not os.path.exists(rabbit_binary()):
        print(f"rabbitmq-server is not installed at {rabbit_binary()}", file=sys.stderr)
        return 2

    with contextlib.ExitStack() as stack:
        rabbit = None
        if broker_name == "rabbitmq":
            from rabbit import RabbitServer

            try:
                rabbit = stack.enter_context(RabbitServer())
            except AssertionError as exc:  # RabbitServer's "did not start", with its log
                print(str(exc)[-3000:], file=sys.stderr)
                return 2
        main_server = stack.enter_context(RedisServer())
        ledger_server = stack.enter_context(RedisServer())
        try:
            proxy = stack.enter_context(_proxy(not args.no_proxy, main_server.port))
        except ImportError:
            print(
                "tests/faultproxy.py is missing: run with --no-proxy to soak without reply faults",
                file=sys.stderr,
            )
            return 2
        lock_url = main_server.url
        if proxy is not None:
            lock_url = (
                f"redis://127.0.0.1:{proxy.port}/0?socket_timeout={LOCK_SOCKET_TIMEOUT_S}"
                f"&socket_connect_timeout={LOCK_SOCKET_TIMEOUT_S}"
            )
        main = redis.Redis.from_url(main_server.url)
        broker: RedisBroker | RabbitBroker = (
            RabbitBroker(rabbit) if rabbit is not None else RedisBroker(main, main_server.url)
        )
        env = {
            "SOAK_MAIN_URL": main_server.url,
            "SOAK_BROKER_URL": broker.url,
            "SOAK_LOCK_URL": lock_url,
            "SOAK_LEDGER_URL": ledger_server.url,
            "SOAK_TTL": repr(args.ttl),
            "SOAK_VT": repr(args.visibility_timeout),
            # Redis broker: the workers log a message held in a BRPOP reply left unread.
            "SOAK_TRACE_BRPOP": "1" if broker.name == "redis" else "0",
        }
        os.environ.update(env)  # read by soakapp as this process imports it
        import soakapp

        # This process publishes: its unique claims go straight to main, never faulted.
        soakapp.app.conf.redislock_url = main_server.url
        worker_env = {
            **os.environ,
            **env,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        ledger = redis.Redis.from_url(ledger_server.url)
        fleet = Fleet(log_dir, worker_env)
        stack.callback(fleet.stop)
        import celery

        print(
            f"Soak: {args.minutes:g} min of chaos, seed {seed}, {args.rate:g} calls/s, "
            f"{len(WORKERS)} workers x prefork -c {CONCURRENCY}, ttl {args.ttl:g} s; broker "
            f"{broker.describe(args.visibility_timeout)}; redis-server "
            f"{main_server.version} (main :{main_server.port}, ledger :{ledger_server.port}), "
            f"lock path {'via fault proxy :' + str(proxy.port) if proxy else 'direct'}; "
            f"Celery {celery.__version__}, kombu {version_of('kombu')}, redis-py "
            f"{redis.__version__}",
            flush=True,
        )
        for name in WORKERS:
            fleet.start(name)
        try:
            fleet.wait_ready(WORKERS)
        except RuntimeError as exc:
            print(f"workers did not start: {exc}", file=sys.stderr)
            return 2

        producer = Producer(soakapp, ledger, random.Random(seed + 1), args.rate, args.minutes * 60)
        after_task_publish.connect(producer.note_publish, weak=False)
        chaos = Chaos(
            fleet, ledger, proxy, random.Random(seed), main if broker.name == "redis" else None
        )
        producer.start()
        try:
            chaos.run(time.monotonic() + args.minutes * 60)
        finally:
            producer.stopping.set()
            producer.join(10)
            if proxy is not None:
                proxy.heal()
        faults = proxy.faults if proxy is not None else None
        print(
            f"chaos over: {len(producer.sent)} tasks sent, {len(chaos.kills)} kills, "
            f"{faults if faults is not None else 0} reply faults; draining",
            flush=True,
        )
        for name in WORKERS:  # one killed at the very end may still be starting
            if not fleet.ready(name):
                try:
                    fleet.wait_ready([name])
                except RuntimeError:
                    chaos.restart_failures.append(fleet.current[name])
        drain_began = time.monotonic()
        bound = args.drain if args.drain is not None else 60 + args.ttl
        drained = drain(broker, main, ledger, soakapp.app, producer.sent, bound)
        drain_s = time.monotonic() - drain_began
        fleet.stop()
        stopped_at = ledger_now(ledger)
        in_broker = broker.message_ids()  # after the stop: a warm shutdown requeues its own

        runs = read_runs(ledger)
        sent = list(producer.sent)
        states = read_states(main, soakapp.app, [s.task_id for s in sent])
        conflicts = read_conflicts(ledger)
        publishes = read_publishes(ledger)
        receives = receive_times(fleet.logs())
        dump_ledger(ledger, log_dir / "ledger.json")  # deleted with the logs if the soak passed
        verdict = judge(
            sent,
            runs,
            chaos.kills,
            {t: m.get("status", "PENDING") for t, m in states.items()},
            stopped_at=stopped_at,
            visibility_timeout_s=args.visibility_timeout,
            broker=broker.name,
            publishes=publishes,
            receives=receives,
            conflicts={t: [int(c["t_s"] * 1e6) for c in cs] for t, cs in conflicts.items()},
            in_broker=in_broker,
        )
        lost = explain_lost(
            verdict,
            sent,
            runs,
            chaos.kills,
            states,
            conflicts,
            log_lines(fleet.logs(), set(verdict.lost_ids)),
            stopped_at,
            broker=broker.name,
            publishes=publishes,
            receives=receives,
            in_broker=in_broker,
        )
    print_report(verdict, producer, chaos, faults, lost, drained, drain_s, broker.name)
    checks = [
        Target("tasks lost (sent, never completed nor skipped)", verdict.tasks_lost, 0),
        Target("overlaps (a run beside holders its lock forbids)", verdict.overlaps, 0),
        Target("kills (pool children and whole workers)", verdict.kills, 1, at_least=True),
    ]
    if faults is not None:
        checks.append(Target("reply faults injected on the lock path", faults, 1, at_least=True))
    print_targets(checks, began)
    passed = all(check.passed for check in checks)
    if args.json:
        report = json_report(verdict, producer, chaos, faults, lost, broker.name)
        report.update(
            drained=drained,
            drain_s=round(drain_s, 1),
            seed=seed,
            minutes=args.minutes,
            rate=args.rate,
            ttl=args.ttl,
            visibility_timeout=args.visibility_timeout if broker.name == "redis" else None,
            proxy=faults is not None,
            log_dir=str(log_dir) if args.keep_logs or not passed else None,  # else deleted
        )
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
