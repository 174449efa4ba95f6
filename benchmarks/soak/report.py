"""The soak's report (``benchmarks/soak``): what it prints, and the figures ``--json``
writes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from common import section

from .chaos import Chaos
from .judge import Verdict
from .producer import MIX, Producer
from .records import _seconds
from .transit import BROKER_LOSS_WHY, TRANSIT_KILL_S

DETAIL_LIMIT = 50  # entries per detail list in the JSON


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
