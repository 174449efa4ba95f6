"""The soak (``benchmarks/soak``): its verdict on made-up ledgers, then one real minute of it.

The first tests feed the judge hand-made runs and kills, so that a soak that reports "0 lost,
0 overlaps" is known to see a lost task or an overlap when there is one, and counts a loss as
the Redis broker's (kept out of ``tasks_lost``) only when that is proven. The last one runs the
soak itself for a minute (two workers, kills, lost replies) with RabbitMQ as the broker and
asserts on its JSON; it is marked ``soak``, so ``-m "not soak"`` leaves it out. Without Debian's
``rabbitmq-server`` it falls back to the Redis broker, unless REDISLOCK_REQUIRE_RABBITMQ=1 (CI)
makes that a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "soak"  # run as a script
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # tests/rabbit.py's RabbitServer.binary

# The soak package lives in benchmarks/. Appended: the tests' own modules (topologies.py, ...)
# stay before benchmarks/'s of the same name.
sys.path.append(str(SCRIPT.parent))
from soak import brokers as soak_brokers  # noqa: E402
from soak import judge as soak_judge  # noqa: E402
from soak import logs as soak_logs  # noqa: E402
from soak import lost as soak_lost  # noqa: E402
from soak import records as soak_records  # noqa: E402

S = 1_000_000  # ledger times are µs
VT = 10.0


def run(
    run_id: str,
    task_id: str,
    lock: str,
    start: float,
    end: float | None,
    *,
    mode: str = "write",
    pid: int = 100,
    ppid: int = 10,
) -> Any:
    return soak_records.Run(
        run_id=run_id,
        task_id=task_id,
        kind="read" if mode == "read" else "exclusive",
        lock=lock,
        mode=mode,
        pid=pid,
        ppid=ppid,
        worker="w1@host",
        start=int(start * S),
        end=None if end is None else int(end * S),
    )


def kill(at: float, pids: tuple[int, ...], kind: str = "child", group: int = 10) -> Any:
    return soak_records.Kill(kind, "w1", group, pids, int(at * S), int(at * S) + 50)


def sent(*task_ids: str, lock: str = "k:0") -> list[Any]:
    return [soak_records.Sent(t, "exclusive", lock) for t in task_ids]


def judge(sent_: list[Any], runs: list[Any], kills: Sequence[Any] = (), **states: str) -> Any:
    return soak_judge.judge(
        sent_, runs, list(kills), states, stopped_at=1000 * S, visibility_timeout_s=VT
    )


def test_one_holder_after_another_is_no_overlap_and_nothing_is_lost() -> None:
    verdict = judge(
        sent("a", "b"), [run("1", "a", "k:0", 1.0, 2.0), run("2", "b", "k:0", 2.0, 3.0)]
    )
    assert (verdict.tasks_sent, verdict.tasks_completed, verdict.tasks_lost) == (2, 2, 0)
    assert verdict.overlaps == 0  # an end and a start at the same instant do not overlap
    assert verdict.duplicate_runs == 0


def test_two_holders_at_once_of_an_exclusive_lock_is_an_overlap() -> None:
    verdict = judge(
        sent("a", "b"), [run("1", "a", "k:0", 1.0, 2.0), run("2", "b", "k:0", 1.5, 3.0)]
    )
    assert verdict.overlaps == 1
    [found] = verdict.overlap_detail
    assert found["run"]["task_id"] == "b" and [h["task_id"] for h in found["beside"]] == ["a"]


def test_a_killed_run_ends_at_its_kill_and_its_task_is_lost_unless_rerun() -> None:
    runs = [run("1", "a", "k:0", 1.0, None, pid=101), run("2", "b", "k:0", 2.5, 3.0)]
    verdict = judge(sent("a", "b"), runs, [kill(2.0, (101,))])
    assert verdict.overlaps == 0  # b started after a's process was killed
    assert verdict.lost_ids == ["a"] and verdict.runs_killed == 1
    assert verdict.max_recovery_s == pytest.approx(0.5)
    # Without the kill, a's run would still hold the lock when b started.
    assert judge(sent("a", "b"), runs).overlaps == 1


def test_a_run_killed_as_it_started_holds_nothing_afterwards() -> None:
    runs = [run("1", "a", "k:0", 2.0, None, pid=101), run("2", "b", "k:0", 3.0, 4.0)]
    verdict = judge(sent("a", "b"), runs, [kill(1.99999, (101,))])  # its start: the kill's µs
    assert verdict.runs_killed == 1 and verdict.overlaps == 0


def test_a_whole_worker_kill_ends_every_run_of_its_group() -> None:
    runs = [run("1", "a", "k:0", 1.0, None, pid=999, ppid=10), run("2", "b", "k:0", 18.0, 18.2)]
    verdict = judge(sent("a", "b"), runs, [kill(2.0, (10, 101), kind="worker", group=10)])
    assert verdict.overlaps == 0 and verdict.runs_killed == 1
    assert verdict.kills_workers == 1 and verdict.max_recovery_worker_s == pytest.approx(16.0)


def test_a_cap_of_two_allows_two_and_not_three() -> None:
    two = [run("1", "a", "api", 1.0, 3.0), run("2", "b", "api", 1.5, 3.0)]
    assert judge(sent("a", "b", lock="api"), two).overlaps == 0
    three = [*two, run("3", "c", "api", 2.0, 2.5)]
    assert judge(sent("a", "b", "c", lock="api"), three).overlaps == 1


def test_readers_share_and_a_writer_is_alone() -> None:
    readers = [
        run("1", "a", "rw:doc", 1.0, 3.0, mode="read"),
        run("2", "b", "rw:doc", 1.5, 3.0, mode="read"),
    ]
    assert judge(sent("a", "b", lock="rw:doc"), readers).overlaps == 0
    writer = run("3", "c", "rw:doc", 2.0, 2.5)
    assert judge(sent("a", "b", "c", lock="rw:doc"), [*readers, writer]).overlaps == 1
    late_reader = run("4", "d", "rw:doc", 2.2, 2.4, mode="read")
    assert judge(sent("c", "d", lock="rw:doc"), [writer, late_reader]).overlaps == 1


def test_skipped_counts_as_completed_and_pending_as_lost() -> None:
    verdict = judge(sent("a", "b", "c"), [run("1", "a", "k:0", 1.0, 2.0)], b="SKIPPED", c="RETRY")
    assert verdict.tasks_completed == 2 and verdict.lost_ids == ["c"]


def test_duplicate_runs_are_reported_with_their_cause() -> None:
    runs = [
        run("1", "a", "k:0", 1.0, 2.0, pid=101),
        run("2", "a", "k:0", 3.0, 4.0, pid=102),  # child killed after a's end: requeued
        run("3", "b", "k:1", 1.0, 2.0, pid=201, ppid=20),
        run("4", "b", "k:1", 13.0, 14.0, pid=301, ppid=30),  # its worker killed: redelivered
        run("5", "c", "k:2", 1.0, 2.0, pid=401),
        run("6", "c", "k:2", 12.0, 12.5, pid=402),  # no kill, past the visibility timeout
    ]
    kills = [kill(2.5, (101,)), kill(2.5, (20, 201), kind="worker", group=20)]
    verdict = judge(sent("a", "b", "c"), runs, kills)
    assert verdict.tasks_lost == 0 and verdict.duplicate_runs == 3
    causes = {d["task_id"]: d["causes"][0] for d in verdict.duplicate_detail}
    assert causes["a"].startswith("pool child killed after the body ended")
    assert causes["b"].startswith("whole worker killed after the body ended")
    assert causes["c"].startswith("no kill: redelivered after the visibility timeout")


def publish(task_id: str, at: float, took: float = 0.001) -> Any:
    return soak_records.Publish(task_id, int(at * S), int((at + took) * S), pid=1)


def judge_transit(
    publishes: list[Any],
    receives: list[float],
    kills: Sequence[Any],
    *,
    broker: str = "redis",
    in_broker: set[str] | None = None,
    runs: Sequence[Any] = (),
    conflicts: Sequence[float] = (),
    **states: str,
) -> Any:
    """The verdict on task "a" (sent, never completed) from its publishes and receipts."""
    return soak_judge.judge(
        sent("a"),
        list(runs),
        list(kills),
        states,
        stopped_at=1000 * S,
        visibility_timeout_s=VT,
        broker=broker,
        publishes={"a": publishes},
        receives={"a": [int(t * S) for t in receives]},
        conflicts={"a": [int(t * S) for t in conflicts]},
        in_broker=set() if in_broker is None else in_broker,
    )


def test_a_loss_in_transit_by_the_redis_broker_is_counted_apart_only_when_proven() -> None:
    """Counted as ``broker_lost`` (out of ``tasks_lost``) only when the task's last message was
    published, never logged as received, is in no queue, and a whole worker was killed within
    1 s after that publish; any doubt leaves it in ``tasks_lost``."""
    worker_killed = [kill(5.3, (10, 101), kind="worker")]
    proven = judge_transit([publish("a", 5.0)], [], worker_killed)
    assert (proven.tasks_lost, proven.broker_lost, proven.lost_ids) == (0, 1, [])
    [evidence] = proven.broker_lost_detail
    assert evidence["task_id"] == "a" and evidence["killed_worker"] == "w1"
    assert evidence["publishes"] == 1 and evidence["receives"] == 0
    assert evidence["kill_after_publish_s"] == pytest.approx(0.299)
    assert proven.by_kind["exclusive"] == {"sent": 1, "completed": 0, "lost": 0, "broker_lost": 1}
    # A retry's message lost: the first message was received, its retry's never.
    retried = judge_transit(
        [publish("a", 1.0), publish("a", 5.0)], [1.01], worker_killed, a="RETRY"
    )
    assert (retried.tasks_lost, retried.broker_lost) == (0, 1)
    # A kill not over when the publish began (the two overlap) may have come after it.
    overlapping = judge_transit([publish("a", 5.0)], [], [kill(4.99996, (10,), kind="worker")])
    assert (overlapping.tasks_lost, overlapping.broker_lost) == (0, 1)
    assert "as it was published" in overlapping.broker_lost_detail[0]["why"]

    not_proven = {
        "no whole-worker kill": judge_transit([publish("a", 5.0)], [], []),
        "only a pool child killed": judge_transit([publish("a", 5.0)], [], [kill(5.3, (101,))]),
        "the kill 1.5 s after the publish": judge_transit(
            [publish("a", 5.0)], [], [kill(6.5, (10,), kind="worker")]
        ),
        "the kill over 30 ms before the publish": judge_transit(
            [publish("a", 5.0)], [], [kill(4.97, (10,), kind="worker")]
        ),
        "its message received": judge_transit([publish("a", 5.0)], [5.002], worker_killed),
        "received after its last publish": judge_transit(
            [publish("a", 1.0), publish("a", 5.0)], [5.01], worker_killed
        ),
        "still queued in the broker": judge_transit(
            [publish("a", 5.0)], [], worker_killed, in_broker={"a"}
        ),
        "the broker's queues not read": soak_judge.judge(
            sent("a"),
            [],
            worker_killed,
            {},
            stopped_at=1000 * S,
            visibility_timeout_s=VT,
            publishes={"a": [publish("a", 5.0)]},
            receives={},
            in_broker=None,
        ),
        "a run after its last publish": judge_transit(
            [publish("a", 5.0)], [], worker_killed, runs=[run("1", "a", "k:0", 5.2, None)]
        ),
        "a conflict noted after its last publish": judge_transit(
            [publish("a", 5.0)], [], worker_killed, conflicts=[5.1]
        ),
        "it failed": judge_transit([publish("a", 5.0)], [], worker_killed, a="FAILURE"),
        "no publish noted": judge_transit([], [], worker_killed),
        "RabbitMQ as the broker": judge_transit(
            [publish("a", 5.0)], [], worker_killed, broker="rabbitmq"
        ),
        "no publishes nor receipts given": judge(sent("a"), [], worker_killed),
    }
    for case, verdict in not_proven.items():
        assert (verdict.tasks_lost, verdict.broker_lost) == (1, 0), case

    # A loss left in tasks_lost says what the proof lacks.
    verdict = not_proven["no whole-worker kill"]
    [why] = soak_lost.explain_lost(
        verdict, sent("a"), [], [], {}, {}, {}, 1000 * S,
        publishes={"a": [publish("a", 5.0)]}, receives={}, in_broker=set(),
    )  # fmt: skip
    assert why["state"] == "PENDING" and (why["publishes"], why["receives"]) == (1, 0)
    assert why["why"].startswith("not a proven loss in transit")
    assert "no whole worker was killed within 1 s" in why["why"]
    # Published after a kill, while Redis still listed the dead worker's BRPOP: said, not
    # counted apart.
    dead = soak_records.Kill(
        "worker", "w2", 10, (10,), int(4.97 * S), int(4.971 * S), int(5.02 * S)
    )
    verdict = judge_transit([publish("a", 5.0)], [], [dead])
    assert (verdict.tasks_lost, verdict.broker_lost) == (1, 0)
    [why] = soak_lost.explain_lost(
        verdict, sent("a"), [], [dead], {}, {}, {}, 1000 * S,
        publishes={"a": [publish("a", 5.0)]}, receives={}, in_broker=set(),
    )  # fmt: skip
    assert why["why"].startswith("not a proven loss in transit")
    assert "while Redis still listed that dead worker's blocked BRPOP" in why["why"]


def test_receipts_are_read_from_the_worker_logs(tmp_path: Path) -> None:
    task_id = "0d9ad09b-1c52-4b1f-aa42-6edfe79baba7"
    (tmp_path / "w1.0.log").write_text(
        f"[2026-11-22 15:37:16,000: INFO/MainProcess] Task soakapp.capped[{task_id}] received\n"
        f"[2026-11-22 15:37:16,100: INFO/ForkPoolWorker-1] Task soakapp.capped[{task_id}] retry: "
        "lock 'api' is held by 11111111-2222-3333-4444-555555555555\n"
    )
    (tmp_path / "w2.0.log").write_text(  # Celery before 5.4
        f"[2026-11-22 15:37:17,250: INFO/MainProcess] Received task: soakapp.capped[{task_id}]\n"
    )
    times = soak_logs.receive_times(sorted(tmp_path.glob("*.log")))
    assert list(times) == [task_id] and len(times[task_id]) == 2
    assert times[task_id][1] - times[task_id][0] == 1_250_000


def _broker() -> str:
    """RabbitMQ when installed (required in CI), else the Redis broker."""
    if os.path.exists(RABBITMQ_SERVER):
        return "rabbitmq"
    if os.environ.get("REDISLOCK_REQUIRE_RABBITMQ") == "1":
        pytest.fail(
            f"rabbitmq-server is required (REDISLOCK_REQUIRE_RABBITMQ=1): {RABBITMQ_SERVER}"
        )
    return "redis"


def test_the_soak_knows_where_rabbitmq_is() -> None:
    sys.path.insert(0, str(SCRIPT.parent.parent / "tests"))
    from rabbit import RabbitServer

    assert RabbitServer.binary == RABBITMQ_SERVER == soak_brokers.rabbit_binary()


@pytest.mark.soak
@pytest.mark.faults  # chaos: workers killed, replies lost
@pytest.mark.timeout(240)
def test_one_minute_soak_loses_nothing_and_never_overlaps(tmp_path: Path) -> None:
    broker = _broker()
    out = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--minutes", "1", "--drain", "60", "--broker", broker,
         "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=220,
    )  # fmt: skip
    said = f"soak exited {done.returncode}:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert out.exists(), said
    report = json.loads(out.read_text())
    assert report["broker"] == broker, said
    # 6 calls/s for 60 s (360), minus the unique calls that found a copy queued or running.
    assert report["tasks_sent"] >= 250, said
    assert report["kills_children"] > 0 and report["kills_workers"] > 0, said
    assert report["reply_faults"] > 0, said
    assert report["tasks_lost"] == 0, said
    assert report["overlaps"] == 0, said
    if broker == "rabbitmq":  # no window there: every loss is in tasks_lost
        assert report["broker_lost"] == 0, said
    # Kept out of tasks_lost (Redis broker only): each proven lost in transit by kombu.
    assert report["tasks_completed"] + report["broker_lost"] == report["tasks_sent"], said
    assert done.returncode == 0, said
