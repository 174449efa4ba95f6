"""The Redis broker's losses in the soak (``benchmarks/soak``): whether a lost task is proven
lost in transit by kombu's Redis transport, so counted in ``broker_lost``, not ``tasks_lost``."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from .records import Kill, Publish, _seconds

# A message that no worker logged receiving is taken as lost in transit by kombu's Redis
# transport only with a whole-worker kill at most this long after its publish.
TRANSIT_KILL_S = 1.0
LOG_SLACK_US = 1000  # a log line's stamp is its time cut to the millisecond
BROKER_LOSS_WHY = (
    "kombu's Redis transport takes a message off the queue (BRPOP) before it records it as "
    "unacknowledged, so a worker killed in between loses it; RabbitMQ has no such window (it "
    "redelivers every unacknowledged message when the consumer's connection drops)"
)


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
