"""The conformance table (scenarios.py) played against real Celery workers and real RQ workers:
each row, under each framework, must show the same outcome, state, signal actions and log line.

A rule missing from one framework fails that framework's row. One worker set per framework
serves the module (each test uses a key of its own); the rows that need a worker configured
apart (the lock Redis unreachable) start their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import pytest
from helpers import free_port, lapse_at, wait_for, wait_until_queued

from celery_redislock import DuplicateTask, LockBackendError, RateLimit
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.admin import clear_limits, force_release, resume_lock, set_limits
from celery_redislock.core.handover import PUBLISH_WINDOW_S
from celery_redislock.core.keys import LockKeys
from celery_redislock.core.lock import Lock

from .adapters import FINAL, Adapter
from .scenarios import SCENARIOS, Expect, Scenario

# Rows whose worker has a lock Redis of the test's own (started and stopped by the test).
OWN_PLAYS = ("backend_down", "down_at_release")
SHARED = [case for s in SCENARIOS if s.play not in OWN_PLAYS for case in s.cases()]
OWN = [case for s in SCENARIOS if s.play in OWN_PLAYS for case in s.cases()]

# Generous: a loaded 2-core machine may be slow; a condition met returns at once.
DEADLINE_S = 30.0


# An error message names its run first, in each framework's words ("task NAME[ID]: ", "job
# module.function[ID]: ", without the id at send): what follows must be the same.
RUN_PREFIX = re.compile(r"^(task|job) [^\s\[]+?(\[[^\]]+\])?: ")


def lock_name(row: Scenario, key: str) -> str:
    """The lock a call of ``key`` takes (``scope="host"``: this host's)."""
    return f"conf:{key}@{socket.gethostname()}" if row.params.get("host") else f"conf:{key}"


@contextmanager
def held(adapter: Adapter, row: Scenario, key: str) -> Iterator[None]:
    """The call's lock, held from outside by the test (holder id "the-test"): one lease, or
    ``count`` leases, in the ``mode`` and under the ``limit`` of the row's params."""
    options = {k: row.params[k] for k in ("mode", "limit") if k in row.params}
    lock = adapter.lock(lock_name(row, key), **options)
    leases = [
        lock.acquire(owner=f"test{n}", info={"task_id": "the-test"})
        for n in range(row.params.get("count", 1))
    ]
    try:
        yield
    finally:
        for lease in leases:
            lease.release()


@contextmanager
def captured() -> Iterator[list[str]]:
    """This process's log lines of the package (a producer's), as a worker's are written."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{record.levelname} {record.name} {record.getMessage()}")

    logger, handler = logging.getLogger("celery_redislock"), Keep()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def settle(adapter: Adapter, run_id: str, timeout: float = DEADLINE_S) -> str:
    wait_for(lambda: adapter.state(run_id)[0] in FINAL, f"run {run_id} ended", timeout)
    return adapter.state(run_id)[0]


def outcome_line(run_id: str, line: str, lock: str) -> re.Pattern[str]:
    """``line`` (a row's ``log``: "LEVEL phrase") as the outcomes logger writes it for the run;
    a ``line`` starting with ``^`` is a whole line's regex ("{id}": the run's id)."""
    if line.startswith("^"):
        whole = line.replace("{lock}", re.escape(lock)).replace("{id}", re.escape(run_id))
        return re.compile(whole, re.MULTILINE)
    level, phrase = line.split(" ", 1)
    return re.compile(
        rf"^{level} celery_redislock\.core\.outcomes task \S+"
        + re.escape(f"[{run_id}]")
        + " ?"
        + phrase.replace("{lock}", re.escape(lock)),
        re.MULTILINE,
    )


def logged(
    adapter: Adapter, run_id: str, line: str, lock: str, timeout: float = DEADLINE_S
) -> bool:
    """Whether the worker logged ``line`` (a row's ``log``) for the run, from the outcomes
    logger, within ``timeout`` seconds (a liveness bound: a busy machine writes a pool child's
    log line seconds after the signal the test waited for)."""
    pattern = outcome_line(run_id, line, lock)
    deadline = time.monotonic() + timeout
    while not pattern.search(adapter.log()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def observe(
    adapter: Adapter,
    row: Scenario,
    key: str,
    run_id: str,
    *,
    also: tuple[str, ...] = (),
    same_id: bool | None = None,
    state: tuple[str, str | None] | None = None,
    meanwhile: str | None = None,
    first: str | None = None,
    text: str | None = None,
    said_at_send: tuple[str, str] | None = None,
) -> Expect:
    """What the run ``run_id`` showed, in the row's terms (the fields the row leaves open are
    left out)."""
    want = row.expect
    got_state, error = state or adapter.state(run_id)
    says = None
    if want.says is not None:
        said = RUN_PREFIX.sub("", text if text is not None else adapter.error_text(run_id), 1)
        pattern = want.says.replace("{lock}", re.escape(lock_name(row, key)))
        says = want.says if re.fullmatch(pattern, said) else said
    ids = dict.fromkeys((run_id, *also))  # each id once, in order
    seen = counted([a for rid in ids for a in adapter.actions(rid)])
    lease = leased(adapter, ids, want.lease)
    log = None
    if want.log is not None:
        found = logged(adapter, run_id, want.log, lock_name(row, key))
        log = want.log if found else "<not logged>"
    return Expect(
        state=got_state,
        runs=adapter.runs(key),
        actions=seen,
        error=error if want.error is not None else None,
        log=log,
        same_id=same_id if want.same_id is not None else None,
        meanwhile=meanwhile if want.meanwhile is not None else None,
        first=first if want.first is not None else None,
        says=says,
        lease=lease,
        record=recorded(adapter, row, key, run_id) if want.record is not None else None,
        send_log=sent_line(row, key, said_at_send),
    )


def leased(adapter: Adapter, ids: Iterable[str], want: frozenset[str]) -> frozenset[str]:
    """The runs' lock_acquired and lock_released signals. A release may come just after the
    run's end is stored (Celery releases in ``task_postrun``, after the result): what the row
    expects is waited for up to DEADLINE_S; anything else is read as it stands."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        got = counted([a for rid in ids for a in adapter.lease(rid)])
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def sent_line(row: Scenario, key: str, said: tuple[str, str] | None) -> str | None:
    """The row's ``send_log`` if the producer logged it for the call (``said``: its id and what
    the producer logged), else what it logged."""
    want = row.expect.send_log
    if want is None or said is None:
        return None
    run_id, text = said
    return want if outcome_line(run_id, want, lock_name(row, key)).search(text) else text


# Actions a run may signal more than once (a conflict retry per conflict, a look per await).
REPEATABLE = frozenset({"retry", "await"})


def counted(signals: list[str]) -> frozenset[str]:
    """The signals as a set, each repeat of one that must come once marked ("name#2")."""
    out: list[str] = []
    for signal_ in signals:
        if signal_ in REPEATABLE and signal_ in out:
            continue
        n = sum(1 for s in out if s == signal_ or s.startswith(f"{signal_}#")) + 1
        out.append(signal_ if n == 1 else f"{signal_}#{n}")
    return frozenset(out)


def recorded(adapter: Adapter, row: Scenario, key: str, run_id: str) -> tuple[str, ...] | None:
    """The holders a skipped run recorded, if it recorded its own lock's name too."""
    record = adapter.skip_record(run_id)
    if record.get("lock") != lock_name(row, key):
        return ("<lock>", repr(record))
    return tuple(record.get("holders") or ())


# -- plays: how a row is played (the row's `play`) ------------------------------------------------


def held_throughout(adapter: Adapter, row: Scenario, key: str) -> Expect:
    with held(adapter, row, key):
        run_id = adapter.send(row.job, key)
        settle(adapter, run_id)
    return observe(adapter, row, key, run_id)


def held_with_a_cap_set_live(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """One lease held of a lock whose code allows 2, and a cap of 1 set at runtime (as
    ``redislock limit set NAME --cap 1``): the worker, started with the code's limit, finds the
    lock full at this call."""
    name = lock_name(row, key)
    set_limits(adapter.lock_client, name, cap=1)
    try:
        return held_throughout(adapter, row, key)
    finally:
        clear_limits(adapter.lock_client, name)


def released_after_action(adapter: Adapter, row: Scenario, key: str) -> Expect:
    action = row.params["action"]
    with held(adapter, row, key):
        run_id = adapter.send(row.job, key)
        wait_for(lambda: action in adapter.actions(run_id), f"action {action!r}", DEADLINE_S)
        if row.expect.meanwhile is not None:  # the state comes just after the signal
            with contextlib.suppress(AssertionError):
                wait_for(lambda: adapter.state(run_id)[0] == row.expect.meanwhile, "", DEADLINE_S)
        meanwhile = adapter.state(run_id)[0]
        assert adapter.runs(key) == 0
    settle(adapter, run_id)
    return observe(adapter, row, key, run_id, meanwhile=meanwhile)


def released_once_it_waits(adapter: Adapter, row: Scenario, key: str) -> Expect:
    lock = adapter.lock(lock_name(row, key))
    with held(adapter, row, key):
        run_id = adapter.send(row.job, key)
        wait_until_queued(adapter.lock_client, lock)  # it waits in the lock's line
    settle(adapter, run_id)
    return observe(adapter, row, key, run_id)


def line_full(adapter: Adapter, row: Scenario, key: str) -> Expect:
    with held(adapter, row, key):
        parked = adapter.send(row.job, key)
        wait_for(lambda: "queue" in adapter.actions(parked), "the first parked", DEADLINE_S)
        run_id = adapter.send(row.job, key)
        settle(adapter, run_id)
    assert settle(adapter, parked) == "ran"  # the one parked runs once the holder released
    return observe(adapter, row, key, run_id)


def tenant_flood(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """Tenant A floods the line with ``flood`` calls while the lock is held; tenant B sends 3
    once A's have parked. From the release on, tenants take turns: B's three are among the
    first 10 starts (one start in two), and every call runs once."""
    flood, name = row.params["flood"], lock_name(row, key)
    meta = LockKeys.of("redislock", name).meta

    def parked() -> int:
        return int(adapter.lock_client.hget(meta, "qp") or 0)

    # Held far longer than the flood takes to park (a lapse would hand the line on early).
    lease = Lock(adapter.lock_client, name, ttl=600).acquire(info={"task_id": "the-test"})
    try:
        flooded = [adapter.send(row.job, key, tenant="A") for _ in range(flood)]
        wait_for(lambda: parked() == flood, f"A's {flood} calls parked", DEADLINE_S * 6)
        few = [adapter.send(row.job, key, tenant="B") for _ in range(3)]
        # (Their signal, not the line's count: it comes once each logged that it parked, and
        # whom it found holding the lock.)
        wait_for(
            lambda: all("queue" in adapter.actions(run_id) for run_id in few),
            "B's 3 calls parked",
            DEADLINE_S,
        )
    finally:
        lease.release()
    wait_for(lambda: adapter.runs(key) == flood + 3, "every call ran", DEADLINE_S * 20)
    ran = [r.decode() for r in adapter.marks.lrange(f"ran:{key}", 0, -1)]
    starts = sorted(ran.index(run_id) for run_id in few)
    assert starts[-1] < 10, f"B's calls started {starts} (0: the first start after the release)"
    assert sorted(ran) == sorted(flooded + few)  # each once
    return observe(adapter, row, key, few[-1])


DELAY_S = 2.0  # long enough to send the second call while the first is still queued


def duplicate_while_parked(adapter: Adapter, row: Scenario, key: str) -> Expect:
    with held(adapter, row, key):
        first = adapter.send(row.job, key)
        wait_for(lambda: "queue" in adapter.actions(first), "the first parked", DEADLINE_S)
        sent = str(uuid.uuid4())
        second = adapter.send(row.job, key, run_id=sent)
    settle(adapter, first)
    if second != first:
        settle(adapter, second)
    return observe(adapter, row, key, first, also=(sent,), same_id=second == first)


def kill_runner_with_line(adapter: Adapter, row: Scenario, key: str) -> Expect:
    first = adapter.send(row.job, key, 60.0)
    wait_for(lambda: adapter.runs(key) == 1, "the first runs", DEADLINE_S)
    pid = adapter.pid(key)
    run_id = adapter.send(row.job, key)
    wait_for(lambda: "queue" in adapter.actions(run_id), "the second parked", DEADLINE_S)
    lapse = lapse_at(adapter.lock(lock_name(row, key)))
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: adapter.runs(key) == 2, "the parked call runs", DEADLINE_S)
    # Handed on by the parent, not by a lapse of the lease (its ttl is 30 s).
    assert time.monotonic() < lapse
    settle(adapter, run_id)
    return observe(adapter, row, key, run_id, first=settle(adapter, first))


def forced_release_with_line(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """An operator frees the lock of a running call (the framework-free admin call, which
    publishes nothing): the call parked behind it is put back by a sweep, and runs."""
    first = adapter.send(row.job, key, 60.0)
    wait_for(lambda: adapter.runs(key) == 1, "the first runs", DEADLINE_S)
    run_id = adapter.send(row.job, key)
    wait_for(lambda: "queue" in adapter.actions(run_id), "the second parked", DEADLINE_S)
    released = force_release(adapter.lock_client, lock_name(row, key), task_id=first)
    assert released.holders, released
    wait_for(lambda: adapter.runs(key) == 2, "the parked call runs", DEADLINE_S)
    settle(adapter, run_id)
    adapter.stop(key)
    return observe(adapter, row, key, run_id, first=settle(adapter, first))


def lease_taken_away(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """The run's lease is freed behind its back (an operator's forced release): its heartbeat
    reports it lost, and the run goes on to its end."""
    run_id = adapter.send(row.job, key, 60.0)
    wait_for(lambda: adapter.runs(key) == 1, "the call runs", DEADLINE_S)
    assert force_release(adapter.lock_client, lock_name(row, key), task_id=run_id).holders
    wait_for(lambda: "lost" in adapter.lease(run_id), "the loss signalled", DEADLINE_S)
    adapter.stop(key)
    settle(adapter, run_id)
    return observe(adapter, row, key, run_id)


def duplicate_while_queued(adapter: Adapter, row: Scenario, key: str) -> Expect:
    first = adapter.send(row.job, key, delay=DELAY_S)
    sent = str(uuid.uuid4())  # the second call's own id: what a producer signals names it
    try:
        with captured() as said:
            second = adapter.send(row.job, key, delay=DELAY_S, run_id=sent)
    except DuplicateTask as exc:
        assert exc.task_id == first
        ended = settle(adapter, first)
        failed = ("failed", "DuplicateTask")
        return observe(
            adapter, row, key, first, also=(sent,), state=failed, first=ended, text=str(exc)
        )
    settle(adapter, second)
    ended = settle(adapter, first)  # ran, skipped or (replaced) canceled
    return observe(
        adapter,
        row,
        key,
        second,
        also=(first, sent),
        same_id=second == first,
        first=ended,
        said_at_send=(sent, "\n".join(said)),
    )


def duplicate_while_running(adapter: Adapter, row: Scenario, key: str) -> Expect:
    first = adapter.send(row.job, key, 60.0)
    wait_for(lambda: adapter.runs(key) == 1, "the first runs", DEADLINE_S)
    sent = str(uuid.uuid4())
    second = adapter.send(row.job, key, run_id=sent)
    if second != first:
        wait_for(
            lambda: adapter.state(second)[0] in FINAL or adapter.actions(second),
            "the second call ended or met the first",
            DEADLINE_S,
        )
    adapter.stop(key)
    ended = settle(adapter, first)
    settle(adapter, second)
    return observe(adapter, row, key, second, also=(sent,), same_id=second == first, first=ended)


def send_after_finished(adapter: Adapter, row: Scenario, key: str) -> Expect:
    first = adapter.send(row.job, key)
    ended = settle(adapter, first)
    # Its result is stored before its lease (and key) are given back: "finished" is both.
    name = lock_name(row, key)
    wait_for(lambda: not adapter.lock(name).locked(), "the first's lease given back", DEADLINE_S)
    sent = str(uuid.uuid4())
    second = adapter.send(row.job, key, run_id=sent)
    settle(adapter, second)
    return observe(adapter, row, key, second, also=(sent,), same_id=second == first, first=ended)


def failed_then_sent_again(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """A call whose body fails gives its lease and key back: the same call sent again runs."""
    first = adapter.send(row.job, key, -1.0)
    ended = settle(adapter, first)
    assert not adapter.lock(lock_name(row, key)).locked()
    sent = str(uuid.uuid4())
    second = adapter.send(row.job, key, run_id=sent)
    settle(adapter, second)
    return observe(adapter, row, key, second, also=(sent,), same_id=second == first, first=ended)


def latest_while_running(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """keep_last: while the first runs, a second call parks; a third replaces it (latest
    wins) and starts as the first ends, not after a retry's delay."""
    first = adapter.send(row.job, key, 60.0)
    wait_for(lambda: adapter.runs(key) == 1, "the first runs", DEADLINE_S)
    second = adapter.send(row.job, key)
    # Parked (RQ: its horse returned, its Retry scheduled), so that the replace meets a parked
    # copy: it takes it out of the line, and the sweeper ends it canceled.
    wait_for(lambda: adapter.state(second)[0] == "parked", "the second parked", DEADLINE_S)
    sent = str(uuid.uuid4())
    third = adapter.send(row.job, key, run_id=sent)
    wait_for(lambda: "queue" in adapter.actions(third), "the third parked", DEADLINE_S)
    adapter.stop(key)
    ended = time.time()
    settle(adapter, third)
    assert settle(adapter, first) == "ran"
    ran = [r.decode() for r in adapter.marks.lrange(f"ran:{key}", 0, -1)]
    assert ran == [first, third], ran  # the replaced call never ran
    # Handed the lock as the first released it: before the 10 s publish window of a hand-over
    # that nobody published would end (5.8 s under 2 CPU burners).
    assert adapter.started_at(key)[1] - ended < PUBLISH_WINDOW_S - 1
    replaced = settle(adapter, second)
    # Never handed the lock: no lease taken, no skip as superseded (counted with the third's).
    return observe(
        adapter,
        row,
        key,
        third,
        also=(second, sent),
        same_id=third == second,
        first=replaced,
    )


def latest_of_many_while_running(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """keep_last: one call runs, then ``calls`` more, each replacing the one before. A replaced
    call leaves the task line as it is replaced: none is handed the lock (no lease taken, no
    skip as superseded), each ends canceled, and the newest alone runs once the first ends."""
    first = adapter.send(row.job, key, 60.0)
    wait_for(lambda: adapter.runs(key) == 1, "the first runs", DEADLINE_S)
    ids = [adapter.send(row.job, key, run_id=str(uuid.uuid4())) for _ in range(row.params["calls"])]
    newest, replaced = ids[-1], ids[:-1]
    wait_for(lambda: "queue" in adapter.actions(newest), "the newest parked", DEADLINE_S)
    adapter.stop(key)
    settle(adapter, newest)
    assert settle(adapter, first) == "ran"
    ran = [r.decode() for r in adapter.marks.lrange(f"ran:{key}", 0, -1)]
    assert ran == [first, newest], ran
    ended = {run_id: settle(adapter, run_id) for run_id in replaced}
    assert [r for r in replaced if ended[r] != "canceled"] == [], ended
    # Handed the lock, a parked copy is delivered a second time (and takes its lease, or is
    # discarded as revoked): a replaced copy is delivered at most once, and takes no lease.
    handed = [
        r
        for r in replaced
        if adapter.deliveries(r) > 1 or adapter.lease(r) or "superseded" in adapter.actions(r)
    ]
    assert handed == [], [(r, adapter.deliveries(r), adapter.lease(r)) for r in handed]
    assert adapter.deliveries(newest) == 2  # parked, then handed the lock
    return observe(adapter, row, key, newest, same_id=False, first="canceled")


def args_of(adapter: Adapter, key: str) -> list[float]:
    """The ``seconds`` each run of ``key`` was called with, in the order they ran."""
    return [float(a) for a in adapter.marks.lrange(f"args:{key}", 0, -1)]


def debounced_burst(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """Three calls in a burst: nothing runs until the key is quiet for its period; then one
    run, with the latest call's arguments, under the id every caller was handed."""
    first = adapter.send(row.job, key, 0.001)
    second = adapter.send(row.job, key, 0.002)
    sent = str(uuid.uuid4())
    third = adapter.send(row.job, key, 0.003, run_id=sent)
    assert adapter.runs(key) == 0  # nothing published yet
    assert first == second == third, (first, second, third)
    settle(adapter, first)
    assert args_of(adapter, key) == [0.003]
    return observe(adapter, row, key, first, also=(sent,), same_id=True)


def debounced_stream(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """Calls every 0.4 s, never quiet for the 2 s period: max_wait (2 s) publishes the pending
    call while they keep coming; the calls after it make the next run, with the latest."""
    ids, n = [], 0
    deadline = time.monotonic() + DEADLINE_S
    while adapter.runs(key) == 0:
        assert time.monotonic() < deadline, "no run while the calls kept coming"
        n += 1
        ids.append(adapter.send(row.job, key, n / 1000))
        time.sleep(0.4)  # (the stream's pace: time passing is the point, nothing to watch)
    n += 1
    last = adapter.send(row.job, key, n / 1000)
    settle(adapter, last)
    # The latest call's arguments ran. (Not necessarily last: a run max_wait published may
    # wait in the queue while the next one runs on the other worker, on a busy machine.)
    assert n / 1000 in args_of(adapter, key)
    return observe(adapter, row, key, last, same_id=last == ids[0])


def cancel_running(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """on_duplicate="cancel": a call that finds a copy running stops it (Celery: the pool
    child is terminated; RQ: the horse is stopped) and runs once its lease is released."""
    first = adapter.send(row.job, key, 60.0)
    wait_for(lambda: adapter.runs(key) == 1, "the first runs", DEADLINE_S)
    sent = str(uuid.uuid4())
    second = adapter.send(row.job, key, run_id=sent)
    ended = settle(adapter, first)
    settle(adapter, second)
    # (What the stopped copy signals is each framework's, as for any killed runner.)
    observed = observe(
        adapter, row, key, second, also=(sent,), same_id=second == first, first=ended
    )
    # The new copy may meet the stopped copy's lease while it dies, and come back (a retry).
    return dataclasses.replace(observed, actions=observed.actions - {"retry"})


def _together(adapter: Adapter, row: Scenario, key: str) -> tuple[str, str]:
    """Sends two calls at once, and waits until one of them waits for its rate slot: (the one
    that went on, the one that waits). Sent one after the other's end, the second found a free
    slot whenever a busy machine took the rate's period over the first."""
    calls = (adapter.send(row.job, key), adapter.send(row.job, key))
    wait_for(
        lambda: any("rate" in adapter.actions(c) for c in calls), "one of two to wait", DEADLINE_S
    )
    second = next(c for c in calls if "rate" in adapter.actions(c))
    return next(c for c in calls if c != second), second


def rate_full(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """Two calls go out together: one takes the slot, the other finds the limit full."""
    first, second = _together(adapter, row, key)
    settle(adapter, first)
    settle(adapter, second)
    assert "rate" not in adapter.actions(first)
    starts = adapter.started_at(key)
    if len(starts) == 2:  # never two starts within the rate's period
        assert starts[1] - starts[0] >= row.params["per"] * 0.8, starts
    return observe(adapter, row, key, second)


def _two_in_a_row(adapter: Adapter, row: Scenario, key: str) -> tuple[str, str]:
    """Sends a call, waits for its end, then sends another; the second starts no sooner than
    the row's ``gap`` seconds after the first (its slot), and both run."""
    first = adapter.send(row.job, key)
    settle(adapter, first)
    second = adapter.send(row.job, key)
    settle(adapter, second)
    starts = adapter.started_at(key)
    if len(starts) == 2 and "gap" in row.params:
        assert starts[1] - starts[0] >= row.params["gap"] * 0.8, starts
    return first, second


def rate_costs(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """Each call costs 30 units (its cost function's answer), a full bucket: of two calls sent
    together, one waits for 30 units at 10 a second. The run saw its cost (``current_rate()``)."""
    first, second = _together(adapter, row, key)
    settle(adapter, first)
    settle(adapter, second)
    assert "rate" not in adapter.actions(first)
    starts = adapter.started_at(key)
    assert len(starts) == 2 and starts[1] - starts[0] >= row.params["gap"] * 0.8, starts
    assert adapter.marks.lrange(f"rate-cost:{key}", 0, -1) == [b"30.0", b"30.0"]
    return observe(adapter, row, key, second)


def rate_settled(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """Each run settles its cost at 0 units instead of the 30 it reserved (a call that found
    nothing to do): the bucket gets them back, so the next call starts at once (without, it
    would wait 3 s for its slot), and the bucket is full again after both."""
    adapter.marks.set(f"settle:{key}", "0")
    _, second = _two_in_a_row(adapter, row, key)
    limit = RateLimit(adapter.lock_client, lock_name(row, key), "10/s", burst=30)
    assert limit.usage().available == 30
    return observe(adapter, row, key, second)


def rate_paused(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """The first run pauses its limit (as after a 429): the next call at 100 a second waits for
    the pause to end. The pause, 10 s, outlasts the first run's end and the second's delivery
    on a loaded machine (3 s did not: the second started after it, unpaused)."""
    adapter.marks.set(f"pause:{key}", str(row.params["gap"]))
    _, second = _two_in_a_row(adapter, row, key)
    return observe(adapter, row, key, second)


def rate_several(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """Two limits a call takes all or nothing: its tenant's (1 per 3 s; the call's ``seconds``
    names the tenant) and a shared one (100 a second). Tenant A's second call waits for its
    tenant's slot; tenant B's call, sent after it, starts at once: A's wait holds no room in
    the shared limit."""
    # A's two calls go out together: one takes its tenant's slot, the other waits for the next.
    first, second = _together(adapter, row, key)
    other = adapter.send(row.job, key, 0.001)
    settle(adapter, first)
    settle(adapter, other)
    settle(adapter, second)
    ran = [r.decode() for r in adapter.marks.lrange(f"ran:{key}", 0, -1)]
    assert ran == [first, other, second], ran
    assert "rate" not in adapter.actions(first) and "rate" not in adapter.actions(other)
    starts = adapter.started_at(key)
    assert starts[2] - starts[0] >= 3 * 0.8, starts
    return observe(adapter, row, key, second)


def paused_lock(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """The lock is paused (as ``redislock pause NAME 30``) and nobody holds it: a call skips,
    saying it is paused, holding nothing."""
    name = lock_name(row, key)
    adapter.lock(name).pause(30)
    try:
        run_id = adapter.send(row.job, key)
        settle(adapter, run_id)
        assert not adapter.lock(name).locked()
    finally:
        resume_lock(adapter.lock_client, name)
    return observe(adapter, row, key, run_id)


def lock_paused_by_a_run(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """The first run pauses its own lock for 2 s (``current_lease().pause``, as after a 429):
    the next call, sent once the first ended, waits in the task line until the pause ends
    (nobody releases then: a sweeper hands the lock on) and runs."""
    adapter.marks.set(f"lock-pause:{key}", str(row.params["gap"]))
    first = adapter.send(row.job, key)
    settle(adapter, first)
    adapter.marks.delete(f"lock-pause:{key}")
    assert adapter.lock(lock_name(row, key)).paused_for() > 0
    second = adapter.send(row.job, key)
    settle(adapter, second)
    starts = adapter.started_at(key)
    assert starts[1] - starts[0] >= row.params["gap"] * 0.8, starts
    return observe(adapter, row, key, second)


def several_locks(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """Two locks a call takes all or nothing: its tenant's (one at a time) and a shared one (two
    at a time, one place held by the test). A's first call runs on one runner and fills both;
    on the other, A's second finds its tenant's lock full and C finds the shared one full: both
    skip, and neither holds anything meanwhile (C's tenant lock stays free)."""
    shared = adapter.lock(lock_name(row, key), limit=2)
    outside = shared.acquire(info={"task_id": "the-test"})
    a1 = adapter.send(row.job, key, 60.0, tenant="a")
    wait_for(lambda: adapter.runs(key) == 1, "A's first runs", DEADLINE_S)
    a2 = adapter.send(row.job, key, tenant="a")
    assert settle(adapter, a2) == "skipped"
    assert adapter.skip_record(a2).get("lock") == f"conf:{key}:ta"
    c = adapter.send(row.job, key, tenant="c")
    settle(adapter, c)
    assert adapter.skip_record(c).get("lock") == lock_name(row, key)
    assert not adapter.lock(f"conf:{key}:tc").locked()
    assert {h.info.get("task_id") for h in shared.holders()} == {a1, "the-test"}
    outside.release()
    adapter.stop(key)
    assert settle(adapter, a1) == "ran"
    wait_for(lambda: not shared.locked(), "A's leases given back", DEADLINE_S)
    return observe(adapter, row, key, c)


def several_locks_wait(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """A call that waits for two locks while the test holds one of them (its tenant's) starts
    only once it is released, holding both then."""
    tenant = adapter.lock(f"conf:{key}:ta")
    lease = tenant.acquire(info={"task_id": "the-test"})
    run_id = adapter.send(row.job, key, tenant="a")
    # A worker took the call (its id in the worker's log): it asks for both locks from then on
    # and finds its tenant's held (however late its first ask, it starts after the release).
    wait_for(lambda: run_id in adapter.log(), "a worker took the call", DEADLINE_S)
    released = time.time()
    lease.release()
    assert settle(adapter, run_id) == "ran"
    assert adapter.started_at(key)[0] >= released
    return observe(adapter, row, key, run_id)


def kill_runner_of_several(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """A runner holding two locks is SIGKILLed: the worker's parent gives back both leases at
    once (not by a lapse: their ttl is 30 s)."""
    run_id = adapter.send(row.job, key, 60.0, tenant="a")
    wait_for(lambda: adapter.runs(key) == 1, "the call runs", DEADLINE_S)
    locks = [adapter.lock(lock_name(row, key), limit=2), adapter.lock(f"conf:{key}:ta")]
    assert all(lk.locked() for lk in locks)
    lapse = lapse_at(*locks)
    os.kill(adapter.pid(key), signal.SIGKILL)
    wait_for(lambda: not any(lk.locked() for lk in locks), "both leases released", DEADLINE_S)
    assert time.monotonic() < lapse
    settle(adapter, run_id)
    return observe(adapter, row, key, run_id)


def rate_set_live(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """A rate set in Redis at runtime (1 per the row's gap: 10 s, which outlasts the first run's
    end and the second's delivery on a loaded machine) takes the place of the code's (100 a
    second) at the next start, on a worker that started with the code's."""
    name = lock_name(row, key)
    set_limits(adapter.lock_client, name, rate=f"1/{row.params['gap']:g}s")
    try:
        _, second = _two_in_a_row(adapter, row, key)
    finally:
        clear_limits(adapter.lock_client, name)
    return observe(adapter, row, key, second)


def copy_of_finished(adapter: Adapter, row: Scenario, key: str) -> Expect:
    run_id = adapter.send(row.job, key)
    settle(adapter, run_id)
    # Its result is stored before its lease is given back: the copy goes once both are done.
    # (Sent at once, a copy on a busy machine found the first's lease still held: it awaited.)
    name = lock_name(row, key)
    wait_for(lambda: not adapter.lock(name).locked(), "the first's lease given back", DEADLINE_S)
    adapter.send_copy(row.job, key, run_id)
    wait_for(
        lambda: "drop" in adapter.actions(run_id) or adapter.runs(key) > 1,
        "the copy dropped (or run)",
        DEADLINE_S,
    )
    return observe(adapter, row, key, run_id, state=(settle(adapter, run_id), None))


def copy_while_running(adapter: Adapter, row: Scenario, key: str) -> Expect:
    run_id = adapter.send(row.job, key, 60.0)
    wait_for(lambda: adapter.runs(key) == 1, "the first runs", DEADLINE_S)
    adapter.send_copy(row.job, key, run_id)
    wait_for(
        lambda: "await" in adapter.actions(run_id) or adapter.runs(key) > 1,
        "the copy meets its first",
        DEADLINE_S,
    )
    adapter.stop(key)
    wait_for(
        lambda: "drop" in adapter.actions(run_id) or adapter.runs(key) > 1,
        "the copy dropped (or run) once its first finished",
        DEADLINE_S,
    )
    return observe(adapter, row, key, run_id, state=(settle(adapter, run_id), None))


def kill_runner(adapter: Adapter, row: Scenario, key: str) -> Expect:
    run_id = adapter.send(row.job, key, 60.0)
    wait_for(lambda: adapter.runs(key) == 1, "the call runs", DEADLINE_S)
    lock = adapter.lock(lock_name(row, key))
    assert lock.locked()
    lapse = lapse_at(lock)
    os.kill(adapter.pid(key), signal.SIGKILL)
    wait_for(lambda: not lock.locked(), "the killed runner's lease released", DEADLINE_S)
    # By the parent, not by a lapse of the lease (its ttl is 30 s).
    assert time.monotonic() < lapse
    settle(adapter, run_id)
    return observe(adapter, row, key, run_id)


def send_while_down(adapter: Adapter, row: Scenario, key: str) -> Expect:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    sent = str(uuid.uuid4())
    with adapter.producer_lock_down(url, row.params["policy"]):
        try:
            run_id = adapter.send(row.job, key, run_id=sent)
        except LockBackendError as exc:
            failed = ("failed", "LockBackendError")
            return observe(adapter, row, key, sent, state=failed, text=str(exc))
    settle(adapter, run_id)
    return observe(adapter, row, key, run_id, also=(sent,))


def backend_down(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """The worker's lock Redis (``adapter.lock_server``) is down as the call starts; under
    ``retry`` it comes back once the retry was logged, and the call then runs."""
    run_id = adapter.send(row.job, key)
    try:
        if row.params["policy"] == "retry":
            assert row.expect.log is not None and adapter.lock_server is not None
            wait_for(
                lambda: (
                    logged(adapter, run_id, row.expect.log or "", f"conf:{key}", 0)
                    or adapter.state(run_id)[0] in FINAL
                ),
                "the retry logged (or the run ended)",
                DEADLINE_S,
            )
            adapter.lock_server.start()
        settle(adapter, run_id)
        return observe(adapter, row, key, run_id)
    finally:
        adapter.forget(run_id)


def down_at_release(adapter: Adapter, row: Scenario, key: str) -> Expect:
    """The lock Redis stops while the call holds its lease: the call ends as its body does."""
    assert adapter.lock_server is not None
    run_id = adapter.send(row.job, key, 60.0)
    wait_for(lambda: adapter.runs(key) == 1, "the call runs", DEADLINE_S)
    adapter.lock_server.stop()
    adapter.stop(key)
    settle(adapter, run_id)
    return observe(adapter, row, key, run_id)


PLAYS: dict[str, Callable[[Adapter, Scenario, str], Expect]] = {
    f.__name__: f
    for f in (
        held_throughout,
        held_with_a_cap_set_live,
        released_after_action,
        released_once_it_waits,
        line_full,
        tenant_flood,
        duplicate_while_queued,
        duplicate_while_running,
        send_after_finished,
        failed_then_sent_again,
        rate_full,
        rate_costs,
        rate_settled,
        rate_paused,
        rate_several,
        rate_set_live,
        paused_lock,
        lock_paused_by_a_run,
        several_locks,
        several_locks_wait,
        kill_runner_of_several,
        copy_of_finished,
        copy_while_running,
        kill_runner,
        kill_runner_with_line,
        forced_release_with_line,
        lease_taken_away,
        duplicate_while_parked,
        latest_while_running,
        latest_of_many_while_running,
        cancel_running,
        debounced_burst,
        debounced_stream,
        send_while_down,
        backend_down,
        down_at_release,
    )
}


def play(adapter: Adapter, row: Scenario) -> None:
    key = f"{row.name}-{uuid.uuid4().hex[:8]}"
    try:
        observed = PLAYS[row.play](adapter, row, key)
    finally:
        adapter.stop(key)  # whatever still holds ends at once
    assert observed == row.expect


@pytest.mark.parametrize(("shared", "row"), SHARED, indirect=["shared"], scope="module")
def test_conformance(shared: Adapter, row: Scenario) -> None:
    play(shared, row)


@pytest.mark.faults
@pytest.mark.slow  # workers of its own, per row: about 5 s each on a loaded machine
@pytest.mark.parametrize(("name", "row"), OWN)
def test_conformance_with_the_lock_redis_down(
    name: str, row: Scenario, own_adapter: Callable[..., Adapter]
) -> None:
    locks = RedisServer(port=free_port())  # not started: nothing listens there yet
    url, policy = locks.url, row.params["policy"]
    env = (
        {"CONF_LOCK_URL": url, "CONF_BACKEND_POLICY": policy}
        if name == "celery"
        else {"REDISLOCK_URL": url, "REDISLOCK_ON_BACKEND_ERROR": policy}
    )
    try:
        if row.params.get("started"):
            locks.start()
        adapter = own_adapter(name, env)
        adapter.lock_server = locks
        play(adapter, row)
    finally:
        locks.close()


@pytest.mark.faults
@pytest.mark.slow  # workers of its own, started twice
@pytest.mark.parametrize("name", ["celery", "rq"])
def test_a_debounced_call_outlives_its_killed_workers(
    name: str, own_adapter: Callable[..., Adapter]
) -> None:
    """Every worker SIGKILLed while a debounced call waits (its period: 5 s): the call stays in
    Redis; a worker started later publishes it once, with the latest call's arguments."""
    key = f"debounce-killed-{uuid.uuid4().hex[:8]}"
    env = {"CONF_OWN": "1"}  # (workers of the test's own queue)
    adapter = own_adapter(name, env)
    run_id = adapter.send("debounced_long", key, 0.001)
    assert adapter.send("debounced_long", key, 0.002) == run_id
    for worker in adapter.workers:
        worker.kill()
    pending = LockKeys.of("redislock", f"conf:{key}").pending
    assert adapter.lock_client.hget(pending, "id") == run_id.encode()
    later = own_adapter(name, env)
    assert settle(later, run_id, timeout=DEADLINE_S + 10) == "ran"
    assert later.runs(key) == 1 and args_of(later, key) == [0.002]
    assert not adapter.lock_client.exists(pending)
