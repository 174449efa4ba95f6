"""The five scenarios: each starts its worker processes, waits for them and has them judged."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from celery_redislock import Lock

from .fleet import Fleet, Run, collect, sleep_until
from .intervals import NS_PER_S, Interval, handoffs_ms, load
from .judges import judge_cap, judge_crash, judge_fair, judge_mutex, judge_read_write
from .report import Outcome, say
from .settings import (
    CAP_LIMIT,
    COUNTER_SLEEP_MS,
    CRASH_TTL_S,
    FAIR_HOLD_MS,
    PROCESSES,
    READER_HOLD_MS,
    WORK_TTL_S,
    WRITER_HOLD_MS,
    WRITER_PAUSE_MS,
)
from .workers import Job, hold_until_killed, work


def mutex(run: Run) -> Outcome:
    rounds = run.settings.mutex_rounds
    keys = run.keys("mutex")
    _banner(
        1,
        "mutex",
        f"{PROCESSES} processes x {rounds} rounds of GET, sleep "
        f"{COUNTER_SLEEP_MS:g} ms, SET of one counter under Lock(ttl={WORK_TTL_S:g})",
    )
    job = Job(keys, rounds=rounds, hold_ms=COUNTER_SLEEP_MS, count=True)
    fleet = _everyone(run, job)
    counter = int(run.client.get(keys.counter) or 0)
    return judge_mutex(fleet, collect(run.client, keys.results), counter, PROCESSES * rounds)


def cap(run: Run) -> Outcome:
    s = run.settings
    keys = run.keys("cap")
    _banner(
        2,
        "cap",
        f"a fleet-wide cap of {CAP_LIMIT}: Lock(limit={CAP_LIMIT}); {PROCESSES} "
        f"processes x {s.cap_rounds} leases held {s.cap_hold_ms:g} ms each",
    )
    job = Job(keys, limit=CAP_LIMIT, rounds=s.cap_rounds, hold_ms=s.cap_hold_ms, pause_ms=1)
    fleet = _everyone(run, job)
    return judge_cap(fleet, collect(run.client, keys.results))


def read_write(run: Run) -> Outcome:
    writes = run.settings.writes
    keys = run.keys("rw")
    _banner(
        3,
        "read/write",
        f"{PROCESSES - 1} processes read (hold {READER_HOLD_MS:g} ms, "
        f"again at once), 1 writes {writes} times (hold {WRITER_HOLD_MS:g} ms)",
    )
    readers = Job(keys, mode="read", hold_ms=READER_HOLD_MS, until_stopped=True)
    writer = Job(
        keys,
        mode="write",
        rounds=writes,
        delay_ms=50,
        hold_ms=WRITER_HOLD_MS,
        pause_ms=WRITER_PAUSE_MS,
    )
    with Fleet(run, keys) as fleet:
        fleet.start(work, readers, PROCESSES - 1)
        writer_process = fleet.start(work, writer)
        fleet.go(PROCESSES)
        fleet.join(writer_process)
        run.client.set(keys.stop, 1)
        fleet.join()
    intervals = collect(run.client, keys.results)
    return judge_read_write(fleet, intervals)


def fair(run: Run) -> Outcome:
    seconds = run.settings.fair_seconds
    _banner(
        4,
        "fair",
        f"{PROCESSES} processes take Lock(fair=True) for {seconds:g} s "
        f"(hold {FAIR_HOLD_MS:g} ms), then the same with fair=False for comparison",
    )
    fair_counts, fair_fleet, fair_handoffs = _time_boxed(run, "fair", True, seconds)
    unfair_counts, _, unfair_handoffs = _time_boxed(run, "unfair", False, seconds)
    return judge_fair(fair_fleet, fair_counts, fair_handoffs, unfair_counts, unfair_handoffs)


def _time_boxed(
    run: Run, name: str, is_fair: bool, seconds: float
) -> tuple[dict[int, int], Fleet, list[float]]:
    """All processes take the lock in a loop for ``seconds``; returns acquisitions per pid."""
    keys = run.keys(name)
    job = Job(keys, fair=is_fair, hold_ms=FAIR_HOLD_MS)
    fleet = _everyone(run, job, seconds)
    intervals = collect(run.client, keys.results)
    per_pid = Counter(i.pid for i in intervals)
    counts = {p.pid or 0: per_pid[p.pid or 0] for p in fleet.processes}
    return counts, fleet, handoffs_ms(intervals)


def crash(run: Run) -> Outcome:
    hold_s = run.settings.crash_hold_s
    keys = run.keys("crash")
    _banner(
        5,
        "crash",
        f"a holder of Lock(ttl={CRASH_TTL_S:g}), kept by its Heartbeat, is "
        f"SIGKILLed after {hold_s:g} s; {PROCESSES - 1} processes wait for the lock",
    )
    job = Job(keys, ttl=CRASH_TTL_S, rounds=1, hold_ms=50)
    with Fleet(run, keys) as fleet:
        victim = fleet.start(hold_until_killed, job)[0]
        held = load(fleet.pop(keys.held))[0]
        waiters = fleet.start(work, job, PROCESSES - 1)
        fleet.go(PROCESSES - 1)
        sleep_until(held.t_acquired + int(hold_s * NS_PER_S))
        t_kill = fleet.kill(victim)
        _show_holders(job.lock(run.client), "right after the SIGKILL")
        fleet.join(waiters)
    dead = Interval(held.mode, held.pid, held.fence, held.t_requested, held.t_acquired, t_kill)
    return judge_crash(fleet, dead, collect(run.client, keys.results))


def _everyone(run: Run, job: Job, seconds: float | None = None) -> Fleet:
    """All processes do ``job``, started together (and stopped after ``seconds``, if given)."""
    with Fleet(run, job.keys) as fleet:
        fleet.start(work, job, PROCESSES)
        fleet.go(PROCESSES, seconds)
        fleet.join()
    return fleet


def _show_holders(lock: Lock, when: str) -> None:
    for h in lock.holders():
        say(
            f"  holders() {when}: pid {h.info.get('pid')} fence {h.fence}, "
            f"expires in {h.expires_in:.2f} s (nobody renews it now)"
        )


SCENARIOS: list[Callable[[Run], Outcome]] = [mutex, cap, read_write, fair, crash]


def _banner(number: int, name: str, text: str) -> None:
    say()
    say(f"[{number}/{len(SCENARIOS)}] {name}: {text}")
