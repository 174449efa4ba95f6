"""The conformance table: the locked calls (``JOBS``, declared as Celery tasks by
``confcelery`` and as RQ jobs by ``confrq``, from these very options) and the scenarios
(``SCENARIOS``), each with the outcome both frameworks must show.

Every call takes ``(key, seconds=0.0)``: its lock (or unique key, or rate key) is
``conf:<key>``, a test's own key, so that one worker per framework serves a whole module. The
body notes that it ran (``ran:<key>``, with the run id; ``args:<key>``, its ``seconds``) and its
pid, then holds until
``seconds`` passed or the test sets ``stop:<key>`` (``seconds`` below 0: it fails). Under
``rate=`` it notes its slot's cost (``rate-cost:<key>``) and does what the test asks of its
limit (:func:`rate_hooks`: settle a cost, pause after a 429).

What an outcome is, in words common to both (the adapters map each framework's onto them):

- ``state``: ``ran`` (Celery ``SUCCESS``, RQ ``finished`` with the body's result), ``skipped``
  (Celery ``FAILURE`` with ``TaskSkipped``, RQ ``finished`` returning ``SKIPPED``), ``failed``
  (``FAILURE``/``failed``, ``error`` naming the exception class), ``retrying``
  (``RETRY``/``scheduled`` to come back), ``canceled`` (``REVOKED``/``canceled``);
- ``actions``: every ``lock_conflict`` action sent for the run id (receivers in the worker
  modules, and in this process for the producer side), and ``backend_error:<policy>`` for
  ``lock_backend_error``;
- ``log``: a phrase of core/outcomes.py that the worker logs for the run id (``{lock}`` is the
  lock's name); None: no outcome line is promised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from celery_redislock import current_lease, current_rate

KEY = "conf:{key}"


@dataclass(frozen=True)
class Job:
    """One locked call: its ``lock=``, ``unique=`` and ``rate=`` options, as both frameworks
    take them. ``acks_late``: the Celery task's (an RQ job is always acknowledged as it ends)."""

    lock: Any = None
    unique: Any = None
    rate: Any = None
    acks_late: bool = False


def _lock(**options: Any) -> dict[str, Any]:
    return {"key": KEY, **options}


def _cost(key: str, seconds: float = 0.0) -> float:
    """A call's cost from its arguments: 30 units (the rows' bursts) unless it holds."""
    return 30.0 if seconds == 0 else 1.0


def rate_hooks(marks: Any, key: str) -> None:
    """What a body does with its rate slot and its lease, as both frameworks' bodies do: notes
    its cost; settles the cost the test put in ``settle:<key>``; pauses its limit for the
    seconds in ``pause:<key>``, its lock for those in ``lock-pause:<key>`` (as after an
    upstream 429)."""
    lock_pause = marks.get(f"lock-pause:{key}")
    lease = current_lease()
    if lock_pause is not None and lease is not None:
        lease.pause(float(lock_pause))
    slot = current_rate()
    if slot is None:
        return
    marks.rpush(f"rate-cost:{key}", repr(slot.reservation.cost))
    settle, pause = marks.mget(f"settle:{key}", f"pause:{key}")
    if settle is not None:
        slot.settle(float(settle))
    if pause is not None:
        slot.pause(float(pause))


JOBS: dict[str, Job] = {
    "skip": Job(lock=_lock(on_conflict="skip")),
    "retry": Job(lock=_lock(on_conflict="retry", countdown=0.05)),
    "retry_once": Job(lock=_lock(on_conflict="retry", countdown=0.05, max_retries=1)),
    "wait_briefly": Job(lock=_lock(on_conflict="wait", timeout=0.5)),
    "wait": Job(lock=_lock(on_conflict="wait", timeout=30)),
    "raise_": Job(lock=_lock(on_conflict="raise")),
    "queue": Job(lock=_lock(on_conflict="queue")),
    "queue_max_wait": Job(lock=_lock(on_conflict="queue", max_wait=1)),
    "queue_max_waiting": Job(lock=_lock(on_conflict="queue", max_waiting=1)),
    "until_started": Job(unique={"lifecycle": "until_started", "key": KEY}),
    "until_finished": Job(unique={"lifecycle": "until_finished", "key": KEY}),
    "while_running": Job(unique={"lifecycle": "while_running", "key": KEY}),
    "until_and_while_running": Job(unique={"lifecycle": "until_and_while_running", "key": KEY}),
    "dup_raise": Job(unique={"lifecycle": "until_started", "key": KEY, "on_duplicate": "raise"}),
    "dup_replace": Job(
        unique={"lifecycle": "until_started", "key": KEY, "on_duplicate": "replace"}
    ),
    "once_per_period": Job(unique={"lifecycle": "once_per_period", "key": KEY, "period": 60}),
    "keep_last": Job(unique={"lifecycle": "keep_last", "key": KEY}),
    "debounced": Job(unique={"lifecycle": "debounce", "key": KEY, "period": 1.0}),
    "debounced_long": Job(unique={"lifecycle": "debounce", "key": KEY, "period": 5.0}),
    "debounced_max_wait": Job(
        unique={"lifecycle": "debounce", "key": KEY, "period": 2.0, "max_wait": 2.0}
    ),
    "dup_cancel": Job(unique={"lifecycle": "until_finished", "key": KEY, "on_duplicate": "cancel"}),
    "rated": Job(rate={"rate": "1/4s", "key": KEY}),
    "rated_max_delay": Job(rate={"rate": "1/60s", "key": KEY, "max_delay": 1}),
    # 30 units of 10 a second: a full bucket holds one call; the next waits 3 s for its slot.
    "rated_cost": Job(rate={"rate": "10/s", "key": KEY, "burst": 30, "cost": _cost}),
    "rated_fast": Job(rate={"rate": "100/s", "key": KEY}),
    # A tenant's limit (its ``seconds`` names the tenant) and a shared one, all or nothing.
    "rated_two": Job(
        rate=[{"rate": "1/3s", "key": "conf:{key}:t{seconds}"}, {"rate": "100/s", "key": KEY}]
    ),
    # ttl 20: a copy that finds its own run's lease looks again after 7 s. (With ttl 3, and again
    # with ttl 9 at a load average of 12 under LOAD=2, a renewal answered after the lease's
    # last second took it for lost: the copy ran.)
    "redelivered": Job(lock=_lock(ttl=20), acks_late=True),
    "plain": Job(lock=_lock()),
    # ttl 6, renewed every 2 s: the forced release comes first. (With ttl 1, renewals late by a
    # second on a busy machine let the lease lapse before the release that was to take it.)
    "renewed_often": Job(lock=_lock(ttl=6)),
    "reader": Job(lock=_lock(mode="read", on_conflict="skip")),
    "cap2": Job(lock=_lock(limit=2, on_conflict="skip")),
    "per_host": Job(lock=_lock(scope="host", on_conflict="skip")),
    "unique_in_line": Job(
        lock=_lock(on_conflict="queue"), unique={"lifecycle": "until_started", "key": KEY}
    ),
    # Called with a third argument, ``tenant`` (every call takes it, "" by default).
    "queue_tenant": Job(lock=_lock(on_conflict="queue", tenant="{tenant}")),
    # Two locks all or nothing: the tenant's (one at a time) and a shared one (two at a time).
    "two_locks": Job(lock=[{"key": KEY + ":t{tenant}", "on_conflict": "skip"}, _lock(limit=2)]),
    "two_locks_wait": Job(
        lock=[{"key": KEY + ":t{tenant}", "on_conflict": "wait", "timeout": 30}, _lock(limit=2)]
    ),
}

ADAPTERS = ("celery", "rq")


@dataclass(frozen=True)
class Expect:
    """What the call under test shows. ``error`` None: not compared (a killed runner's error is
    each framework's own: Celery's ``WorkerLostError``, RQ's note that its horse died)."""

    state: str
    runs: int  # how many times the body started, for the key, in all
    actions: frozenset[str] = frozenset()
    error: str | None = None
    log: str | None = None
    same_id: bool | None = None  # a second send: handed the first call's id back?
    meanwhile: str | None = None  # its state while the lock is still held (a play that says)
    first: str | None = None  # a second send: the final state of the first call
    says: str | None = None  # its error's message (regex), after the run's name and id
    # The lock_acquired / lock_released signals sent for its run id (the lock's or the run lock
    # a unique lifecycle implies).
    lease: frozenset[str] = frozenset()
    # A skipped run's record of the conflict (Celery: the TaskSkipped error's; RQ: outcome_of):
    # its holders, once its lock's name was found in it.
    record: tuple[str, ...] | None = None
    # A line the producer logs for a second send (as ``log``, for the second call's own id).
    send_log: str | None = None


@dataclass(frozen=True)
class Scenario:
    """A row: the call (``job``), how the test plays it (``play``: a function of
    test_conformance.py), and what it must show under both frameworks. ``drift``: adapter ->
    why that framework differs today (an xfail, strict, for that adapter only)."""

    name: str
    job: str
    play: str
    expect: Expect
    params: dict[str, Any] = field(default_factory=dict)
    drift: dict[str, str] = field(default_factory=dict)
    marks: tuple[str, ...] = ()  # more pytest markers (e.g. "faults")

    def cases(self) -> list[Any]:
        """The row's pytest params, one per adapter."""
        out = []
        for adapter in ADAPTERS:
            marks: list[Any] = [getattr(pytest.mark, m) for m in (adapter, *self.marks)]
            if self.name in VERSIONS:
                marks.append(pytest.mark.versions)
            if adapter in self.drift:
                marks.append(pytest.mark.xfail(strict=True, reason=f"drift: {self.drift[adapter]}"))
            out.append(pytest.param(adapter, self, id=f"{adapter}-{self.name}", marks=marks))
        return out


# The rows that run again on the lowest supported Celery, kombu, RQ and redis-py (marker
# `versions`, `make test-lowest`: see tests/conftest.py), and why: those that go through the
# frameworks' internals or redis-py's errors. The others are the core's decisions, taken the same
# whatever the versions (caps, modes, waits, the line's limits, rates, pauses, claims at publish).
VERSIONS: dict[str, str] = {
    "skip": "how a run that does not run ends (Celery's tracer and states, RQ's job status)",
    "raise": "an error raised before the body, as each framework reports it",
    "retry_runs_after_the_release": "Task.retry's publish; RQ's Retry through its scheduler",
    "retry_gives_up_after_max_retries": "the retry count each framework keeps",
    "queue_runs_when_the_holder_releases": "a parked run put back (re-publish, _enqueue_job)",
    "a_killed_holder_hands_the_lock_to_the_line_at_once": "the parent after a killed child/horse",
    "two_locks_a_killed_runner_s_leases_are_both_released_by_the_parent": "the same, two leases",
    "killed_runner_is_released_by_the_parent_at_once": "the parent's signals, RQ's own",
    "a_lease_lost_by_its_end_logs_one_line": "Celery's tracer lines filtered (tracelog.py)",
    "on_duplicate_raise": "raised from the publish (apply_async, Queue.enqueue)",
    "on_duplicate_replace": "a queued copy revoked (Celery) or canceled (RQ)",
    "on_duplicate_cancel_stops_the_running_copy": "revoke(terminate=True); RQ's stop-job command",
    "keep_last_runs_the_latest_call_as_the_running_one_ends": "replace, revoke and the line",
    "keep_last_replaced_copies_leave_the_line_as_they_are_replaced": "the same, many copies",
    "until_started_running_copy_lets_a_second_run": "the claim ended as the run starts",
    "until_finished_frees_its_key_as_it_ends": "the claim ended as the run ends",
    "until_and_while_running_frees_its_key_as_it_ends": "the same, its run lock too",
    "until_finished_frees_its_key_when_it_fails": "the claim ended by a failure",
    "once_per_period_hands_back_a_failed_run_too": "a failed run's state handed back",
    "debounce_runs_once_with_the_latest_arguments": "a publish with a countdown; RQ's enqueue_in",
    "debounce_max_wait_runs_during_a_steady_stream": "the same, under a stream of calls",
    "rate_full_comes_back_for_its_slot": "published again with an ETA; RQ's Retry and scheduler",
    "copy_of_a_finished_run_is_dropped": "a second delivery of one id",
    "copy_beside_its_running_first_awaits_then_is_dropped": "the same, while the first runs",
    "backend_down_fail": "redis-py's errors as the run starts (5.0 retries none)",
    "backend_down_retry": "the same, and the framework's retry",
    "backend_down_run": "the same, and the run without its lock",
    "lock_redis_down_at_the_release": "redis-py's errors at the release",
    "lock_redis_down_at_the_release_logs_one_line": "the same, and the worker's log",
}


def actions(*names: str) -> frozenset[str]:
    return frozenset(names)


HELD = frozenset({"acquired", "released"})  # took its lease and gave it back


# The lines of core/outcomes.py: "<LEVEL> <what follows the run's "task NAME[ID]">", a regex;
# the worker's line must be that level, from the logger celery_redislock.core.outcomes.
SKIPPED = r"INFO skipped: lock '{lock}' is held by the-test"
RETRIES = r"INFO retries in \d+\.\ds: lock '{lock}' is held by the-test"
PARKED = r"INFO parked in the task line of lock '{lock}' \(\d+ waiting\): held by the-test"
PAUSED_SKIP = r"INFO skipped: lock '{lock}' is paused for \d+\.\ds"
PAUSED_PARKED = (
    r"INFO parked in the task line of lock '{lock}' \(\d+ waiting\): paused for \d+\.\ds"
)
EXPIRED = (
    r"WARNING not run: it waited in the task line of lock '{lock}' longer than max_wait \(1s\)"
)
FULL = r"WARNING not run: the task line of lock '{lock}' is full \(1 parked\)"
RATE_FULL = r"INFO : rate limit '{lock}' \(.*\) is full; it comes back for its slot in \d+\.\d\ds"
RATE_FULL_ANY = (
    r"INFO : rate limit '[^']+' \(.*\) is full; it comes back for its slot in \d+\.\d\ds"
)
DROPPED = r"INFO dropped: a copy of it already ran to its end under lock '{lock}'"
AWAITS = r"INFO : another copy of it holds lock '{lock}' \(running, or its worker died\); this one"
UNLOCKED = r"ERROR runs WITHOUT lock '{lock}': Redis failed: "
# (With the reason in brackets when the heartbeat counted the lease lapsed before Redis answered
# its renewal: a busy machine's way of losing it first.)
LOST = r"ERROR : lease on lock '{lock}' lost(?: \([^\n]*\))?; the task goes on without it"
RETRIES_DOWN = r"INFO retries in \d+\.\ds: Redis for lock '{lock}' failed: "
RETRIES_DOWN_RATE = r"INFO retries in \d+\.\ds: .*Redis failed: "
UNLOCKED_RATE = r"ERROR runs WITHOUT .*Redis failed: "
# Lines the locked run (core/run/) logs itself, not through core/outcomes.py: without the run's
# name and id, so they are whole lines here ("^...").
RELEASE_FAILED = (
    r"^WARNING celery_redislock\.core\.run\.run lock '{lock}': release failed, the lease "
    r"lapses within its ttl: "
)
# The loss said once: its line, and no line about it at the release after it (a lease already
# reported lost is no news there).
LOST_ONCE = (
    r"^ERROR celery_redislock\.core\.outcomes task \S+\[{id}\]: lease on lock '{lock}' lost"
    r"(?: \([^\n]*\))?; the task goes on without it$"
    r"(?![\s\S]*lock '{lock}': lease was no longer held at release)"
)
# A producer's line: each framework's word for the publish ("task ... not published", "job ...
# not enqueued"), from the one module that sends (core/run/send.py).
NOT_SENT = (
    r"^INFO celery_redislock\.core\.run\.send (task|job) \S+\[{id}\] not "
    r"(published|enqueued): .* is queued under unique key '{lock}'"
)

SCENARIOS: list[Scenario] = [
    # -- on_conflict, the lock held from outside (a core Lock owned by "the-test") -------------
    Scenario(
        "skip",
        "skip",
        "held_throughout",
        Expect("skipped", 0, actions("skip"), log=SKIPPED, record=("the-test",)),
    ),
    Scenario(
        "retry_runs_after_the_release",
        "retry",
        "released_after_action",
        Expect("ran", 1, actions("retry"), log=RETRIES, meanwhile="retrying", lease=HELD),
        params={"action": "retry"},
    ),
    Scenario(
        "retry_gives_up_after_max_retries",
        "retry_once",
        "held_throughout",
        Expect(
            "failed",
            0,
            actions("retry"),
            error="LockNotAcquired",
            log=RETRIES,
            says=r"gave up after 1 conflict retries: lock '{lock}' is held by the-test",
        ),
    ),
    Scenario(
        "wait_times_out",
        "wait_briefly",
        "held_throughout",
        Expect(
            "failed",
            0,
            actions("wait"),
            error="LockNotAcquired",
            says=r"lock '{lock}' is held by the-test after waiting 0\.5s",
        ),
    ),
    Scenario(
        "wait_gets_it",
        "wait",
        "released_once_it_waits",
        # No conflict signal: a wait that gets the lock is an acquire that waited.
        Expect("ran", 1, actions(), lease=HELD),
    ),
    Scenario(
        "raise",
        "raise_",
        "held_throughout",
        Expect(
            "failed",
            0,
            actions("raise"),
            error="LockNotAcquired",
            says=r"lock '{lock}' is held by the-test",
        ),
    ),
    Scenario(
        "queue_runs_when_the_holder_releases",
        "queue",
        "released_after_action",
        Expect("ran", 1, actions("queue"), log=PARKED, meanwhile="parked", lease=HELD),
        params={"action": "queue"},
    ),
    # -- modes, caps and scope: the outside holder's lease as the row's params say -------------
    Scenario(
        "a_reader_beside_a_reader_runs",
        "reader",
        "held_throughout",
        Expect("ran", 1, lease=HELD),
        params={"mode": "read"},
    ),
    Scenario(
        "a_writer_beside_a_reader_skips",
        "skip",
        "held_throughout",
        Expect("skipped", 0, actions("skip"), log=SKIPPED, record=("the-test",)),
        params={"mode": "read"},
    ),
    Scenario(
        "a_cap_with_a_place_free_runs",
        "cap2",
        "held_throughout",
        Expect("ran", 1, lease=HELD),
        params={"limit": 2},
    ),
    Scenario(
        "a_cap_lowered_at_runtime_skips_where_the_code_s_would_run",
        "cap2",
        "held_with_a_cap_set_live",
        Expect("skipped", 0, actions("skip"), log=SKIPPED, record=("the-test",)),
        params={"limit": 2},
    ),
    Scenario(
        "a_full_cap_skips",
        "cap2",
        "held_throughout",
        Expect(
            "skipped",
            0,
            actions("skip"),
            log=SKIPPED.replace("the-test", "the-test, the-test"),
            record=("the-test", "the-test"),
        ),
        params={"limit": 2, "count": 2},
    ),
    Scenario(
        "scope_host_takes_the_lock_of_this_host",
        "per_host",
        "held_throughout",
        Expect("skipped", 0, actions("skip"), log=SKIPPED, record=("the-test",)),
        params={"host": True},
    ),
    # -- a lock paused (after an upstream 429, or by an operator) --------------------------------
    Scenario(
        "a_paused_lock_skips_saying_so",
        "skip",
        "paused_lock",
        Expect("skipped", 0, actions("skip"), log=PAUSED_SKIP, record=()),
    ),
    Scenario(
        "a_run_pauses_its_lock_and_the_next_waits_in_line_until_it_ends",
        "queue",
        "lock_paused_by_a_run",
        Expect("ran", 2, actions("queue"), log=PAUSED_PARKED, lease=HELD),
        # 6 s: the pause outlasts the first run's end and the second's delivery on a busy machine.
        params={"gap": 6.0},
    ),
    # -- several locks, all or nothing (lock= as a list) -----------------------------------------
    Scenario(
        "two_locks_each_cap_holds_under_contention_and_a_refused_call_holds_none",
        "two_locks",
        "several_locks",
        Expect("skipped", 1, actions("skip")),
    ),
    Scenario(
        "two_locks_a_waiting_call_runs_once_both_are_free",
        "two_locks_wait",
        "several_locks_wait",
        Expect("ran", 1, lease=frozenset({"acquired", "released", "acquired#2", "released#2"})),
    ),
    Scenario(
        "two_locks_a_killed_runner_s_leases_are_both_released_by_the_parent",
        "two_locks",
        "kill_runner_of_several",
        Expect("failed", 1, lease=frozenset({"acquired", "acquired#2"})),
        marks=("faults",),
    ),
    # -- the task line ---------------------------------------------------------------------------
    Scenario(
        "line_max_wait_expires",
        "queue_max_wait",
        "held_throughout",
        Expect(
            "failed",
            0,
            actions("queue", "expired"),
            error="LockNotAcquired",
            log=EXPIRED,
            says=r"waited in the task line of lock '{lock}' longer than max_wait \(1s\); not run",
        ),
    ),
    Scenario(
        "line_max_waiting_full",
        "queue_max_waiting",
        "line_full",
        # The newcomer; the one already parked runs once the holder releases (runs: 1).
        Expect(
            "failed",
            1,
            actions("full"),
            error="LineFull",
            log=FULL,
            says=r"lock '{lock}': its task line holds 1 parked tasks \(max_waiting\)",
        ),
    ),
    Scenario(
        "a_killed_holder_hands_the_lock_to_the_line_at_once",
        "queue",
        "kill_runner_with_line",
        Expect(
            "ran",
            2,
            actions("queue"),
            log=PARKED.replace("the-test", ".*"),
            first="failed",
            lease=HELD,
        ),
        marks=("faults",),
    ),
    Scenario(
        "an_operator_frees_the_lock_and_the_line_runs",
        "queue",
        "forced_release_with_line",
        Expect(
            "ran",
            2,
            actions("queue"),
            log=PARKED.replace("the-test", ".*"),
            first="ran",  # it ran on without its lease, and ends as its body does
            lease=HELD,
        ),
    ),
    Scenario(
        "tenants_take_turns_in_the_line",
        "queue_tenant",
        "tenant_flood",
        # B's last call: it parked behind A's flood, and ran among the first starts.
        Expect("ran", 303, actions("queue"), log=PARKED, lease=HELD),
        params={"flood": 300},
        marks=("slow",),
    ),
    Scenario(
        "a_lease_taken_away_is_reported_lost_and_the_run_goes_on",
        "renewed_often",
        "lease_taken_away",
        # Lost, not given back: no lock_released.
        Expect("ran", 1, log=LOST, lease=frozenset({"acquired", "lost"})),
    ),
    Scenario(
        "a_lease_lost_by_its_end_logs_one_line",
        "renewed_often",
        "lease_taken_away",
        Expect("ran", 1, log=LOST_ONCE, lease=frozenset({"acquired", "lost"})),
    ),
    Scenario(
        "a_unique_call_keeps_its_claim_while_parked",
        "unique_in_line",
        "duplicate_while_parked",
        Expect("ran", 1, actions("queue", "existing"), log=PARKED, same_id=True, lease=HELD),
    ),
    # -- unique: a second send while the first is queued (sent with a delay) --------------------
    Scenario(
        "until_started_queued_copy_is_handed_back",
        "until_started",
        "duplicate_while_queued",
        Expect("ran", 1, actions("existing"), same_id=True, first="ran"),
    ),
    Scenario(
        "until_finished_queued_copy_is_handed_back",
        "until_finished",
        "duplicate_while_queued",
        Expect("ran", 1, actions("existing"), same_id=True, lease=HELD),
    ),
    Scenario(
        "until_and_while_running_queued_copy_is_handed_back",
        "until_and_while_running",
        "duplicate_while_queued",
        Expect("ran", 1, actions("existing"), same_id=True, lease=HELD),
    ),
    Scenario(
        "a_duplicate_at_send_logs_one_line",
        "until_finished",
        "duplicate_while_queued",
        Expect(
            "ran",
            1,
            actions("existing"),
            same_id=True,
            first="ran",
            lease=HELD,
            send_log=NOT_SENT,
        ),
    ),
    Scenario(
        "on_duplicate_raise",
        "dup_raise",
        "duplicate_while_queued",
        Expect(
            "failed",
            1,
            actions("raise"),
            error="DuplicateTask",
            first="ran",
            says=r"a copy \([0-9a-f-]+\) is already queued under unique key '{lock}'",
        ),
    ),
    Scenario(
        "on_duplicate_replace",
        "dup_replace",
        "duplicate_while_queued",
        # The new call runs; the replaced one never does (runs: 1).
        Expect("ran", 1, actions("replace"), same_id=False, first="canceled"),
    ),
    # -- unique: a second send while the first runs ---------------------------------------------
    Scenario(
        "until_started_running_copy_lets_a_second_run",
        "until_started",
        "duplicate_while_running",
        Expect("ran", 2, actions(), same_id=False, first="ran"),
    ),
    Scenario(
        "until_finished_running_copy_is_handed_back",
        "until_finished",
        "duplicate_while_running",
        Expect("ran", 1, actions("existing"), same_id=True, lease=HELD),
    ),
    Scenario(
        "while_running_second_run_skips",
        "while_running",
        "duplicate_while_running",
        Expect(
            "skipped",
            1,
            actions("skip"),
            same_id=False,
            first="ran",
            log=SKIPPED.replace("the-test", ".*"),
        ),
    ),
    Scenario(
        "until_and_while_running_second_run_waits_its_turn",
        "until_and_while_running",
        "duplicate_while_running",
        Expect(
            "ran",
            2,
            actions("retry"),
            same_id=False,
            first="ran",
            log=RETRIES.replace("the-test", ".*"),
            lease=HELD,
        ),
    ),
    # -- unique: a second send once the first finished --------------------------------------------
    Scenario(
        "until_finished_frees_its_key_as_it_ends",
        "until_finished",
        "send_after_finished",
        Expect("ran", 2, actions(), same_id=False, first="ran", lease=HELD),
    ),
    Scenario(
        "until_and_while_running_frees_its_key_as_it_ends",
        "until_and_while_running",
        "send_after_finished",
        Expect("ran", 2, actions(), same_id=False, first="ran", lease=HELD),
    ),
    Scenario(
        "until_finished_frees_its_key_when_it_fails",
        "until_finished",
        "failed_then_sent_again",
        Expect("ran", 2, same_id=False, first="failed", lease=HELD),
    ),
    # -- unique: in time (once per period, keep the last call, cancel the running copy) --------
    Scenario(
        "once_per_period_queued_copy_is_handed_back",
        "once_per_period",
        "duplicate_while_queued",
        Expect("ran", 1, actions("existing"), same_id=True, first="ran"),
    ),
    Scenario(
        "once_per_period_hands_back_the_run_after_it_ended",
        "once_per_period",
        "send_after_finished",
        Expect("ran", 1, actions("existing"), same_id=True, first="ran"),
    ),
    Scenario(
        "once_per_period_hands_back_a_failed_run_too",
        "once_per_period",
        "failed_then_sent_again",
        Expect("failed", 1, actions("existing"), same_id=True, first="failed"),
    ),
    Scenario(
        "keep_last_runs_the_latest_call_as_the_running_one_ends",
        "keep_last",
        "latest_while_running",
        # The first runs; the second parks and is replaced by the third, which runs next.
        Expect(
            "ran",
            2,
            actions("queue", "queue#2", "replace"),  # (both later calls parked)
            same_id=False,
            first="canceled",
            lease=frozenset({"acquired", "released"}),
        ),
    ),
    Scenario(
        "keep_last_replaced_copies_leave_the_line_as_they_are_replaced",
        "keep_last",
        "latest_of_many_while_running",
        # One runs; 20 calls follow, each replacing the one before: the replaced leave the line
        # as they are replaced (none is handed the lock), each ends canceled, the newest runs.
        Expect("ran", 2, actions("queue", "replace"), same_id=False, first="canceled", lease=HELD),
        params={"calls": 20},
    ),
    Scenario(
        "debounce_runs_once_with_the_latest_arguments",
        "debounced",
        "debounced_burst",
        # (the first and third calls' signals: the second's own id is not known to the test)
        Expect("ran", 1, actions("debounce", "debounce#2"), same_id=True),
    ),
    Scenario(
        "debounce_max_wait_runs_during_a_steady_stream",
        "debounced_max_wait",
        "debounced_stream",
        Expect("ran", 2, actions("debounce"), same_id=False),
        marks=("slow",),  # (a stream of calls for its max_wait: about 5 s)
    ),
    Scenario(
        "on_duplicate_cancel_stops_the_running_copy",
        "dup_cancel",
        "cancel_running",
        Expect("ran", 2, actions("cancel"), same_id=False, first="canceled", lease=HELD),
        marks=("faults",),
    ),
    # -- rate= -----------------------------------------------------------------------------------
    Scenario(
        "rate_full_comes_back_for_its_slot",
        "rated",
        "rate_full",
        Expect("ran", 2, actions("rate"), log=RATE_FULL),
        params={"per": 4.0},
        marks=("slow",),  # (a 4 s slot: about 4 s)
    ),
    Scenario(
        "rate_past_max_delay_fails",
        "rated_max_delay",
        "rate_full",
        Expect(
            "failed",
            1,
            actions("rate"),
            error="LockNotAcquired",
            says=r"rate limit '{lock}' \(1/60s\) has no start free for \d+\.\ds, "
            r"past max_delay \(1\.0s\)",
        ),
        params={"per": 0.0},
    ),
    Scenario(
        "rate_cost_from_the_arguments_spaces_the_calls",
        "rated_cost",
        "rate_costs",
        Expect("ran", 2, actions("rate"), log=RATE_FULL),
        params={"gap": 3.0},
        marks=("slow",),  # (3 s between the calls)
    ),
    Scenario(
        "rate_cost_settled_lower_gives_the_bucket_back",
        "rated_cost",
        "rate_settled",
        Expect("ran", 2),
    ),
    Scenario(
        "rate_paused_by_a_run_holds_the_next_until_it_ends",
        "rated_fast",
        "rate_paused",
        Expect("ran", 2, actions("rate"), log=RATE_FULL),
        params={"gap": 10.0},
        marks=("slow",),
    ),
    Scenario(
        "rate_several_limits_a_tenant_backlog_does_not_hold_the_shared_one",
        "rated_two",
        "rate_several",
        Expect("ran", 3, actions("rate"), log=RATE_FULL_ANY),
        marks=("slow",),  # (RQ counts whole seconds: about 10 s)
    ),
    Scenario(
        "rate_set_at_runtime_applies_at_the_next_start",
        "rated_fast",
        "rate_set_live",
        Expect("ran", 2, actions("rate"), log=RATE_FULL),
        params={"gap": 10.0},
        marks=("slow",),
    ),
    # -- another delivery of the same run --------------------------------------------------------
    Scenario(
        "copy_of_a_finished_run_is_dropped",
        "redelivered",
        "copy_of_finished",
        Expect("ran", 1, actions("drop"), log=DROPPED, lease=HELD),
    ),
    Scenario(
        "copy_beside_its_running_first_awaits_then_is_dropped",
        "redelivered",
        "copy_while_running",
        Expect("ran", 1, actions("await", "drop"), log=AWAITS, lease=HELD),
    ),
    # -- a killed runner (Celery prefork child, RQ LockWorker horse) -----------------------------
    Scenario(
        "killed_runner_is_released_by_the_parent_at_once",
        "plain",
        "kill_runner",
        Expect("failed", 1, lease=frozenset({"acquired"})),
        marks=("faults",),
    ),
    # -- the lock Redis unreachable at send (the producer's; a unique call claims its key) ------
    Scenario(
        "send_with_the_lock_redis_down_fail",
        "until_finished",
        "send_while_down",
        Expect("failed", 0, error="LockBackendError", says=r"lock '{lock}': Redis failed: .*"),
        params={"policy": "fail"},
    ),
    Scenario(
        "send_with_the_lock_redis_down_retry",
        "until_finished",
        "send_while_down",
        Expect("failed", 0, error="LockBackendError", says=r"lock '{lock}': Redis failed: .*"),
        params={"policy": "retry"},
    ),
    Scenario(
        "send_with_the_lock_redis_down_run",
        "until_finished",
        "send_while_down",
        Expect("ran", 1, lease=HELD),  # published unchecked; the worker's lock Redis answers
        params={"policy": "run"},
    ),
    # -- the lock Redis down as the run starts (a worker of its own per policy) -----------------
    Scenario(
        "backend_down_fail",
        "plain",
        "backend_down",
        Expect(
            "failed",
            0,
            actions("backend_error:fail"),
            error="LockBackendError",
            says=r"lock '{lock}': Redis failed: .*",
        ),
        params={"policy": "fail"},
    ),
    Scenario(
        "backend_down_retry",
        "plain",
        "backend_down",
        # Re-sent until the lock Redis answers again (it is started once the retry was logged).
        Expect("ran", 1, actions("backend_error:retry"), log=RETRIES_DOWN, lease=HELD),
        params={"policy": "retry"},
    ),
    Scenario(
        "backend_down_run",
        "plain",
        "backend_down",
        Expect("ran", 1, actions("backend_error:run"), log=UNLOCKED),
        params={"policy": "run"},
    ),
    # -- the same for a rate limit (its slots live in the lock Redis) ---------------------------
    Scenario(
        "rate_with_the_lock_redis_down_fail",
        "rated",
        "backend_down",
        Expect(
            "failed",
            0,
            actions("backend_error:fail"),
            error="LockBackendError",
            says=r".*Redis failed: .*",
        ),
        params={"policy": "fail"},
    ),
    Scenario(
        "rate_with_the_lock_redis_down_retry",
        "rated",
        "backend_down",
        Expect("ran", 1, actions("backend_error:retry"), log=RETRIES_DOWN_RATE),
        params={"policy": "retry"},
    ),
    Scenario(
        "rate_with_the_lock_redis_down_run",
        "rated",
        "backend_down",
        Expect("ran", 1, actions("backend_error:run"), log=UNLOCKED_RATE),
        params={"policy": "run"},
    ),
    # -- the lock Redis stopped while the run holds its lease ------------------------------------
    Scenario(
        "lock_redis_down_at_the_release",
        "plain",
        "down_at_release",
        # Its release failed: the lease was not given back (it lapses), so no lock_released.
        Expect("ran", 1, lease=frozenset({"acquired"})),
        params={"policy": "fail", "started": True},
    ),
    Scenario(
        "lock_redis_down_at_the_release_logs_one_line",
        "plain",
        "down_at_release",
        Expect("ran", 1, lease=frozenset({"acquired"}), log=RELEASE_FAILED),
        params={"policy": "fail", "started": True},
    ),
]

assert len({s.name for s in SCENARIOS}) == len(SCENARIOS)
assert all(s.job in JOBS for s in SCENARIOS)
assert set(VERSIONS) <= {s.name for s in SCENARIOS}, set(VERSIONS) - {s.name for s in SCENARIOS}
