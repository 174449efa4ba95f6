"""The Celery app the worker tests run: tasks that record what they did in Redis.

Workers import it as ``lockapp`` (tests/ on PYTHONPATH); its broker, result backend and lock
Redis are all ``LOCKAPP_REDIS_URL``. Each task notes its start (task id, pid) and the
concurrency it saw per key, so tests can assert on what really ran, where and beside what.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

import redis
from celery import Celery
from celery.exceptions import Ignore, Reject
from celery.signals import (
    before_task_publish,
    task_failure,
    task_postrun,
    task_prerun,
    task_success,
    worker_init,
    worker_process_init,
)
from celery.worker.control import inspect_command

from celery_redislock import LockedTask, LockLost, install, lock_conflict, lock_for, lock_lost
from celery_redislock.core.keys import LockKeys
from celery_redislock.integrations.celery.settings import client_for

URL = os.environ["LOCKAPP_REDIS_URL"]
# The broker may be another (LOCKAPP_BROKER_URL, e.g. RabbitMQ); results and locks stay on URL.
app = install(Celery("lockapp", broker=os.environ.get("LOCKAPP_BROKER_URL", URL), backend=URL))
app.conf.update(
    redislock_ttl=float(os.environ.get("LOCKAPP_TTL", "30")),
    worker_prefetch_multiplier=1,
    task_acks_late=os.environ.get("LOCKAPP_ACKS_LATE") == "1",
    broker_connection_retry_on_startup=True,
    result_expires=600,
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("LOCKAPP_VT", "3600")),
        # Look for overdue unacked messages often (kombu's default: every 10 s, every 10th look).
        "unacked_restore_interval": 0.5,
        "unacked_restore_throttle": 1,
    },
)
app.conf.redislock_url = URL
if os.environ.get("LOCKAPP_BACKEND_POLICY"):
    app.conf.redislock_on_backend_error = os.environ["LOCKAPP_BACKEND_POLICY"]
if os.environ.get("LOCKAPP_LOCK_URL"):
    app.conf.redislock_url = os.environ["LOCKAPP_LOCK_URL"]
if os.environ.get("LOCKAPP_SWEEP_INTERVAL"):
    app.conf.redislock_line_sweep_interval = float(os.environ["LOCKAPP_SWEEP_INTERVAL"])
if os.environ.get("LOCKAPP_MAX_TASKS_PER_CHILD"):
    app.conf.worker_max_tasks_per_child = int(os.environ["LOCKAPP_MAX_TASKS_PER_CHILD"])
if os.environ.get("LOCKAPP_LOG_FORMAT"):  # e.g. with each line's level and logger
    app.conf.worker_log_format = os.environ["LOCKAPP_LOG_FORMAT"]
r = redis.Redis.from_url(URL)
RETRY = {"on_conflict": "retry", "countdown": 0.05}


def started(key: str, task_id: str) -> None:
    # One transaction: a test that sees the start also finds the pid.
    with r.pipeline() as notes:
        notes.hset("pid", task_id, os.getpid())
        notes.rpush(f"started:{key}", task_id)
        notes.rpush(f"started-at:{key}", repr(time.time()))
        notes.execute()


class Active:
    """Counts the runs of ``key`` in progress, notes the count each run saw on entry, and what
    the ``beside`` counters were at that instant (for read/write checks)."""

    def __init__(self, key: str, *beside: str) -> None:
        self.key, self.beside = key, beside

    def __enter__(self) -> None:
        count = r.incr(f"active:{self.key}")
        others = ",".join(f"{k}={int(r.get('active:' + k) or 0)}" for k in self.beside)
        r.rpush(f"seen:{self.key}", count)
        r.rpush(f"beside:{self.key}", others)

    def __exit__(self, *exc: Any) -> None:
        r.decr(f"active:{self.key}")


def _sleep(seconds: float, name: str) -> None:
    # Ends early when a test sets stop:<name>, so no test waits longer than it must.
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not r.exists(f"stop:{name}"):
        time.sleep(0.01)


@app.task(bind=True, lock={"key": "hold:{name}"})
def hold(self: Any, name: str, seconds: float = 0.0, ending: str = "return") -> str:
    """Holds ``hold:<name>`` for ``seconds`` then ends as ``ending`` says."""
    started(name, self.request.id)
    if ending == "soft":
        _sleep(seconds, name)  # interrupted by SoftTimeLimitExceeded
    else:
        _sleep(seconds, name)
    r.rpush(f"ended:{name}", f"{self.request.id}:{ending}:{self.request.retries}")
    if ending == "fail":
        raise RuntimeError("failed on purpose")
    if ending == "ignore":
        raise Ignore()
    if ending == "reject":
        raise Reject("rejected on purpose", requeue=False)
    if ending == "retry" and self.request.retries == 0:
        raise self.retry(countdown=0)
    return ending


@app.task
def echo(value: Any = None, *more: Any) -> Any:
    """A plain task (no lock): a workflow's other step; notes each run under ``echo``."""
    r.rpush("echo", repr(value))
    return value


@app.task(bind=True)
def plain_wait(self: Any, name: str, seconds: float) -> None:
    """A plain task (no lock) that waits ``seconds`` or until ``stop:<name>``."""
    started(name, self.request.id)
    _sleep(seconds, name)


@app.task
def note_errback(task_id: str) -> None:
    """A ``link_error`` callback: notes the id of the task that failed."""
    r.rpush("errback", task_id)


@app.task(bind=True, lock={"key": "hold:{name}", **RETRY}, max_retries=3)
def duplicate(self: Any, name: str) -> str:
    """Takes the same lock as ``hold``, retrying until it gets it."""
    started(f"dup:{name}", self.request.id)
    r.rpush(f"dup-retries:{name}", self.request.retries)
    return "ran"


@app.task(
    bind=True,
    lock={"key": "hold:{name}", "on_conflict": "retry", "countdown": 0.05, "count_retries": True},
    max_retries=2,
)
def counted_duplicate(self: Any, name: str) -> str:
    """Conflict retries spend this task's own max_retries (2)."""
    return "ran"


@app.task(bind=True, lock={"key": "hold:{name}"}, time_limit=1)
def hard_limited(self: Any, name: str) -> None:
    started(name, self.request.id)
    time.sleep(60)


@app.task(bind=True, lock={"key": "hold:{name}"}, soft_time_limit=0.5)
def soft_limited(self: Any, name: str) -> None:
    started(name, self.request.id)
    try:
        time.sleep(60)
    finally:
        r.rpush(f"ended:{name}", f"{self.request.id}:soft")


@app.task(bind=True, lock={"key": "counter:{key}", **RETRY})
def increment(self: Any, key: str) -> None:
    """A non-atomic read-modify-write: loses updates unless runs of one key are serialised."""
    with Active(key):
        value = int(r.get(f"counter:{key}") or 0)
        time.sleep(0.005)
        r.set(f"counter:{key}", value + 1)


@app.task(lock={"key": "cap", "limit": 3, **RETRY})
def capped(i: int) -> None:
    with Active("cap"):
        time.sleep(0.1)


@app.task(lock={"key": "rw:{resource}", "mode": "read", **RETRY})
def read(resource: str) -> None:
    with Active(f"read:{resource}", f"write:{resource}"):
        time.sleep(0.05)


@app.task(lock={"key": "rw:{resource}", "mode": "write", **RETRY})
def write(resource: str) -> None:
    with Active(f"write:{resource}", f"read:{resource}"):
        time.sleep(0.05)


@app.task(bind=True, lock={"key": "hold:{name}"})
def watch_lease(self: Any, name: str, seconds: float) -> str:
    """Checks its lease until told to stop; notes LockLost when the lease goes."""
    return _watch(self, name, seconds)


def _watch(self: Any, name: str, seconds: float) -> str:
    started(name, self.request.id)
    lease = self.lease
    r.hset(
        f"lease:{name}",
        mapping={
            "name": lease.name,
            "fence": lease.fence,
            "mode": lease.mode,
            "token": lease.token,
        },
    )
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            lease.check()
        except LockLost as exc:
            r.rpush(f"lost:{name}", str(exc))
            return "lost"
        time.sleep(0.02)
    return "held"


def _note_lost(sender: Any = None, task_id: str = "", lease: Any = None, **_: Any) -> None:
    r.rpush("signal:lock_lost", f"{task_id}:{lease.name}")


lock_lost.connect(_note_lost, weak=False)


@app.task(lock={"key": "hold:{name}", "on_conflict": "wait", "timeout": 10})
def waiting(name: str) -> str:
    return "ran"


@app.task(lock={"key": "hold:{name}", "on_conflict": "wait", "timeout": 0.3})
def waiting_briefly(name: str) -> str:
    return "ran"


@app.task(bind=True, lock={"key": "hold:{name}", "on_conflict": "raise"})
def strict(self: Any, name: str) -> str:
    return "ran"


def _note_conflict(sender: Any = None, task_id: str = "", action: str = "", **_: Any) -> None:
    r.rpush("signal:lock_conflict", f"{task_id}:{action}")


lock_conflict.connect(_note_conflict, weak=False)


@inspect_command()
def redislock_watched(state: Any) -> dict[str, int]:
    """Remote control, answered by a worker's parent: how many children it watches."""
    from celery_redislock.integrations.celery.parent import watched_tasks

    return {"watched": len(watched_tasks())}


@app.task(bind=True, lock={"key": "hold:{name}", "ttl": 6, "max_hold": 0.5})
def held_briefly(self: Any, name: str, seconds: float) -> str:
    """Runs past its max_hold: renewal stops, and the lease lapses under it. (Its first renewal
    falls due at 2 s, past the max_hold: the heartbeat stops it there, 4 s before the lease
    would lapse anyway, however late a busy machine wakes the heartbeat in that span.)"""
    return _watch(self, name, seconds)


@app.task(bind=True, lock={"key": "hold:{name}"})
def slow_to_die(self: Any, name: str) -> None:
    """Takes half a second to die of SIGTERM: Celery has long counted the task done by then."""

    def linger_then_exit(signum: int, frame: Any) -> None:
        time.sleep(0.5)
        os._exit(1)

    signal.signal(signal.SIGTERM, linger_then_exit)
    started(name, self.request.id)
    time.sleep(60)


# -- unique tasks (enqueue-time uniqueness) ------------------------------------------------------


def _unique_run(self: Any, name: str, seconds: float, retry_countdown: float | None) -> str:
    started(name, self.request.id)
    _sleep(seconds, name)
    if retry_countdown is not None and self.request.retries == 0:
        raise self.retry(countdown=retry_countdown)
    with r.pipeline() as notes:
        notes.rpush(f"ended:{name}", f"{self.request.id}:{self.request.retries}")
        notes.rpush(f"ended-at:{name}", repr(time.time()))
        notes.execute()
    return "ran"


@app.task(bind=True, unique={"lifecycle": "until_finished", "key": "fin:{name}"})
def unique_finished(
    self: Any, name: str, seconds: float = 0.0, retry_countdown: float | None = None
) -> str:
    return _unique_run(self, name, seconds, retry_countdown)


@app.task
def publish_unique(name: str) -> str:
    """Publishes ``unique_finished(name)`` to a queue no worker reads; its id."""
    return str(unique_finished.apply_async((name,), queue="nobody").id)


@app.task(bind=True, unique={"lifecycle": "until_started", "key": "start:{name}"})
def unique_started(
    self: Any, name: str, seconds: float = 0.0, retry_countdown: float | None = None
) -> str:
    return _unique_run(self, name, seconds, retry_countdown)


@app.task(bind=True, unique={"lifecycle": "until_and_while_running", "key": "both:{name}"})
def unique_both(
    self: Any, name: str, seconds: float = 0.0, retry_countdown: float | None = None
) -> str:
    with Active(f"both:{name}"):
        return _unique_run(self, name, seconds, retry_countdown)


@app.task(
    bind=True,
    unique={"lifecycle": "until_started", "key": "deb:{name}", "on_duplicate": "replace"},
)
def debounced(self: Any, name: str, n: int) -> int:
    started(name, self.request.id)
    return n


@app.task(
    bind=True,
    unique={"lifecycle": "until_started", "key": "eta:{name}", "allowance": 1},
)
def briefly_unique(self: Any, name: str) -> str:
    started(name, self.request.id)
    return "ran"


@app.task(unique={"lifecycle": "until_finished", "on_duplicate": "raise"})
def unique_strict(name: str) -> str:
    return name


if os.environ.get("LOCKAPP_BEAT"):
    app.conf.beat_schedule = {
        "report": {
            "task": "lockapp.unique_finished",
            "schedule": float(os.environ["LOCKAPP_BEAT"]),
            "args": ("beat", 60),
        }
    }


class PausesBeforeRetrying(LockedTask):
    """Stops between giving up its run lease and publishing its retry, until the test says."""

    def signature_from_request(self, *args: Any, **kwargs: Any) -> Any:
        r.rpush("retry-gap", self.request.id)
        deadline = time.monotonic() + 10
        while not r.exists("retry-gap:go") and time.monotonic() < deadline:
            time.sleep(0.01)
        return super().signature_from_request(*args, **kwargs)


@app.task(
    bind=True,
    base=PausesBeforeRetrying,
    unique={"lifecycle": "until_finished", "key": "gap:{name}"},
)
def retried_after_a_pause(self: Any, name: str) -> str:
    return _unique_run(self, name, 0, 0.1)


# -- unique and backend failures -----------------------------------------------------------------


@app.task(bind=True, unique="until_started", lock={"key": "hold:{name}"})
def unique_locked(self: Any, name: str) -> str:
    """Unique while queued (its claim is on the lock's key); skipped if ``hold:<name>`` is held."""
    started(name, self.request.id)
    return "ran"


@app.task(
    bind=True,
    unique="until_started",
    lock={"key": "hold:{name}", "on_conflict": "retry", "countdown": 0.05, "max_retries": 2},
)
def unique_locked_retrying(self: Any, name: str) -> str:
    """Unique while queued; gives up after 2 conflict retries (LockNotAcquired)."""
    started(name, self.request.id)
    return "ran"


@app.task(
    bind=True,
    unique={"lifecycle": "until_finished", "key": "rep:{name}", "on_duplicate": "replace"},
)
def replacing_finished(self: Any, name: str, seconds: float = 0.0) -> str:
    return _unique_run(self, name, seconds, None)


@app.task(
    bind=True,
    unique={"lifecycle": "until_finished", "key": "strict:{name}", "on_duplicate": "raise"},
)
def strict_finished(self: Any, name: str, seconds: float = 0.0) -> str:
    return _unique_run(self, name, seconds, None)


@app.task(
    bind=True,
    unique={"lifecycle": "until_finished", "key": "bf:{name}", "allowance": 0.5},
)
def briefly_finished(self: Any, name: str, retry_countdown: float) -> str:
    """Retries once with ``retry_countdown`` (longer than its 0.5 s allowance); the retried run
    then holds on until the test sets stop:<name>, so a call meanwhile finds it running."""
    started(name, self.request.id)
    if self.request.retries == 0:
        raise self.retry(countdown=retry_countdown)
    _sleep(60, name)
    return "ran"


# -- endings, parent and conflicts ---------------------------------------------------------------

if os.environ.get("LOCKAPP_TIME_LIMIT"):
    # The default max_hold of every lease. The threads and solo pools enforce no time limit, so
    # there a task outlives it and its lease is seen to stop being renewed.
    app.conf.task_time_limit = float(os.environ["LOCKAPP_TIME_LIMIT"])


def _end_as(self: Any, name: str, ending: str) -> str:
    started(name, self.request.id)
    if ending == "fail":
        raise RuntimeError("failed on purpose")
    if ending == "ignore":
        raise Ignore()
    if ending == "reject":
        raise Reject("rejected on purpose", requeue=False)
    return ending


@app.task(bind=True, lock={"key": "hold:{name}"})
def ends(self: Any, name: str, ending: str) -> str:
    """Ends at once as ``ending`` says: return, fail, ignore or reject."""
    return _end_as(self, name, ending)


@app.task(bind=True, lock={"key": "hold:{name}"}, acks_late=True)
def ends_late(self: Any, name: str, ending: str) -> str:
    """``ends``, acks_late: its lease goes after its result is stored."""
    return _end_as(self, name, ending)


_ENDINGS = {"lockapp.ends", "lockapp.ends_late"}


def _note_lock_at_store(task: Any, task_id: str, args: Any, kwargs: Any, outcome: str) -> None:
    # task_success and task_failure come after Celery stored the result: whether the run's lock
    # was still held at that instant tells the order of the two.
    if getattr(task, "name", None) in _ENDINGS:
        held = lock_for(task, args, kwargs or {}).locked()
        r.hset(f"at-store:{task_id}", outcome, "held" if held else "free")


def _on_success(sender: Any = None, **_: Any) -> None:
    request = sender.request
    _note_lock_at_store(sender, request.id, request.args, request.kwargs, "success")


def _on_failure(
    sender: Any = None, task_id: str = "", args: Any = (), kwargs: Any = None, **_: Any
) -> None:
    _note_lock_at_store(sender, task_id, args, kwargs, "failure")


def _on_postrun(sender: Any = None, task_id: str = "", state: str = "", **_: Any) -> None:
    if getattr(sender, "name", None) in _ENDINGS:
        r.hset("postrun", task_id, state)


task_success.connect(_on_success, weak=False)
task_failure.connect(_on_failure, weak=False)
task_postrun.connect(_on_postrun, weak=False)


@app.task(bind=True, base=PausesBeforeRetrying, lock={"key": "hold:{name}"})
def retried_with_lock(self: Any, name: str) -> str:
    """Retries once; its retry publish waits for the test (``retry-gap:go``)."""
    started(name, self.request.id)
    if self.request.retries == 0:
        raise self.retry(countdown=0)
    return "ran"


@app.task(bind=True, lock={"key": "shared:{name}", "limit": 4})
def shares_a_lock(self: Any, name: str) -> None:
    """Holds one of the four leases of ``shared:<name>`` until the test stops it."""
    started(name, self.request.id)
    _sleep(60, name)


@app.task(bind=True, lock={"key": "hold:{name}", **RETRY, "max_retries": 2})
def gives_up(self: Any, name: str) -> str:
    """Retries on conflict at most twice (the lock's own max_retries), then fails."""
    return "ran"


def _hold_time(self: Any, name: str, seconds: float) -> float | None:
    # Seconds from the start of the body until the lease was seen lost; None: held throughout.
    started(name, self.request.id)
    lease, begun = self.lease, time.monotonic()
    while time.monotonic() - begun < seconds:
        try:
            lease.check()
        except LockLost:
            return time.monotonic() - begun
        time.sleep(0.01)
    return None


# A ttl of 3 s: renewed each second, so a renewal up to 2 s late on a busy machine still comes
# in time, and the first falls due at the earliest maximum hold these run under (1 s).
@app.task(bind=True, lock={"key": "hold:{name}", "ttl": 3}, time_limit=30)
def limited_hold(self: Any, name: str, seconds: float) -> float | None:
    """No max_hold: its default is this call's time_limit, else the task's (30 s)."""
    return _hold_time(self, name, seconds)


@app.task(bind=True, lock={"key": "hold:{name}", "ttl": 3})
def default_hold(self: Any, name: str, seconds: float) -> float | None:
    """No max_hold, no time limit of its own: the default is the app's task_time_limit."""
    return _hold_time(self, name, seconds)


@app.task(bind=True, lock={"key": "hold:{name}"})
def lock_state(self: Any, name: str) -> list[bool]:
    """[is its lock held, does this run hold a lease]: a plain call takes none."""
    return [lock_for(lock_state, (name,)).locked(), self.lease is not None]


@app.task(bind=True, lock={"key": "hold:{name}", "on_conflict": "wait", "timeout": 10})
def waits_and_notes(self: Any, name: str) -> str:
    """``waiting``, noting when it started (``started-at:waited:<name>``)."""
    started(f"waited:{name}", self.request.id)
    return "ran"


LINE = {"on_conflict": "queue"}


@app.task(bind=True, lock={"key": "line:{name}", **LINE})
def in_line(self: Any, name: str, i: int, seconds: float = 0.0) -> int:
    """Waits in its lock's task line when the lock is taken; notes the order runs start in."""
    started(f"line:{name}", self.request.id)
    r.rpush(f"order:{name}", i)
    with Active(f"line:{name}"):
        _sleep(seconds, name)
    return i


@app.task(bind=True, lock={"key": "linecap", "limit": 3, **LINE})
def capped_in_line(self: Any, i: int, seconds: float) -> int:
    started("linecap", self.request.id)
    with Active("linecap"):
        _sleep(seconds, "linecap")
    return i


@app.task(bind=True, lock={"key": "line:{name}", **LINE, "max_wait": 1})
def impatient(self: Any, name: str) -> str:
    started(f"line:{name}", self.request.id)
    return "ran"


@app.task(bind=True, lock={"key": "line:{name}", **LINE, "max_waiting": 2})
def short_line(self: Any, name: str) -> str:
    started(f"line:{name}", self.request.id)
    return "ran"


@app.task(bind=True, unique="until_started", lock={"key": "line:{name}", **LINE})
def unique_in_line(self: Any, name: str) -> str:
    started(f"line:{name}", self.request.id)
    return "ran"


@app.task(bind=True, rate="5/s")
def rated(self: Any, i: int) -> int:
    """At most 5 starts a second across every worker."""
    r.rpush("rated:starts", repr(time.time()))
    return i


@app.task(bind=True, rate={"rate": "2/s", "key": "account:{account}"})
def rated_by_account(self: Any, account: str, i: int) -> int:
    r.rpush(f"rated:starts:{account}", repr(time.time()))
    return i


@app.task(bind=True, rate={"rate": "1/10s", "max_delay": 1})
def rated_impatient(self: Any) -> str:
    r.rpush("rated:impatient", repr(time.time()))
    return "ran"


@app.task(bind=True, rate="10/s")
def rated_late(self: Any, i: int) -> int:
    """10 starts a second; a copy that comes back for its slot comes 0.3 s late (below)."""
    r.rpush("rated:late", repr(time.time()))
    return i


def _come_back_late(sender: Any = None, task_id: str = "", **_: Any) -> None:
    # The second delivery (the one that comes back for its slot) starts 0.3 s late, past the
    # slack of 0.1 s: as on a busy worker, deterministically. It notes the slot it was booked
    # (its request's record, 'slot_us cost'), which the test compares with the one it ran at.
    if getattr(sender, "name", "") == "lockapp.rated_late" and r.incr(f"late:{task_id}") == 2:
        booked = r.get(LockKeys.of("redislock", sender.name).rate_request(f"{task_id}.0"))
        r.hset("rated:booked", task_id, booked or b"")
        time.sleep(0.3)


task_prerun.connect(_come_back_late, weak=False)


def _note_delivery(sender: Any = None, task_id: str = "", **_: Any) -> None:
    if getattr(sender, "name", "").startswith("lockapp.rated"):
        r.hincrby("deliveries", task_id, 1)


task_prerun.connect(_note_delivery, weak=False)


# -- a thread of the worker's main process inside the lock client's pool ------------------------

# Never collected where they were inherited (a pool child): a client collected there disconnects
# its pool, which takes the pool's lock.
_KEPT: list[Any] = []


def _hold_lock_pool(sender: Any = None, **_: Any) -> None:
    """With ``LOCKAPP_POOL_HOLDER`` set: a thread of the worker's main process that, while the
    key ``pool:hold`` exists, holds the connection pool of the app's lock client as any thread
    of that process using the client does for an instant in each call it makes; ``pool:held``
    says that it does. A pool child forked meanwhile inherits the pool taken. (Not one of the
    integration's threads: those hold the fork guard in their calls, so no fork happens then.)"""
    if not os.environ.get("LOCKAPP_POOL_HOLDER"):
        return
    pool = client_for(app).connection_pool
    own = redis.Redis.from_url(URL)  # the thread's own, never used by a child
    _KEPT.extend((pool, own))

    def hold() -> None:
        while True:
            if own.exists("pool:hold"):
                with pool._lock:
                    own.set("pool:held", 1)
                    while own.exists("pool:hold"):
                        time.sleep(0.01)
                own.delete("pool:held")
            time.sleep(0.01)

    threading.Thread(target=hold, name="lockapp-pool-holder", daemon=True).start()


worker_init.connect(_hold_lock_pool, weak=False)


# -- a hand-over published by the child watch while the worker forks ----------------------------


def _note_forks(sender: Any = None, **_: Any) -> None:
    """With ``LOCKAPP_FORK_NOTES`` set, while the key ``fork:note`` exists: the worker's main
    process notes each fork it is about to make (``fork`` in the list ``fork:events``, before
    the fork guard's hook: registered after it, this one runs first), and each pool child notes
    that it started (``up:<pid>``)."""
    if not os.environ.get("LOCKAPP_FORK_NOTES"):
        return
    notes = redis.Redis.from_url(URL)  # the forking thread's own
    _KEPT.append(notes)

    def before() -> None:
        if notes.exists("fork:note"):
            # The fork waits until the child watch publishes the hand-over (on a loaded machine
            # Celery forked the replacement before the watch had seen the death), so that the
            # publish is in progress at the fork, for certain.
            deadline = time.monotonic() + 30
            while b"publishing" not in notes.lrange("fork:events", 0, -1):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            notes.rpush("fork:events", "fork")

    os.register_at_fork(before=before)


def _note_up(sender: Any = None, **_: Any) -> None:
    if os.environ.get("LOCKAPP_FORK_NOTES"):
        notes = redis.Redis.from_url(URL)
        if notes.exists("fork:note"):
            notes.rpush("fork:events", f"up:{os.getpid()}")


def _publish_across_a_fork(sender: Any = None, **_: Any) -> None:
    """With ``LOCKAPP_FORK_NOTES`` set and the key ``fork:note``: the first task the child watch
    publishes (a hand-over) holds the broker connection pool it publishes through (as redis-py
    does for an instant in each call) until the worker is about to fork, then goes on. A pool
    child forked while it holds that pool inherits it taken, and hangs as it closes the broker
    connections it inherited (kombu does so in each new pool child)."""
    if not os.environ.get("LOCKAPP_FORK_NOTES"):
        return
    if threading.current_thread().name != "redislock-childwatch":
        return
    own = redis.Redis.from_url(URL)
    _KEPT.append(own)
    if not own.exists("fork:note") or not own.set("fork:publishing", 1, nx=True):
        return
    frame = sys._getframe(1)
    while "producer" not in frame.f_locals:  # Celery's send_task_message(producer, ...)
        assert frame.f_back is not None
        frame = frame.f_back
    pool = frame.f_locals["producer"].channel.pool  # redis-py's, under kombu's Redis channel
    _KEPT.append(pool)
    with pool._lock:
        own.rpush("fork:events", "publishing")
        deadline = time.monotonic() + 30
        while b"fork" not in own.lrange("fork:events", 0, -1) and time.monotonic() < deadline:
            time.sleep(0.01)
        own.rpush("fork:events", "published")


worker_init.connect(_note_forks, weak=False)
worker_process_init.connect(_note_up, weak=False)
before_task_publish.connect(_publish_across_a_fork, weak=False)


def _redis_us() -> int:
    seconds, micros = r.time()
    return int(seconds) * 1_000_000 + int(micros)


@app.task(bind=True)
def flow_step(
    self: Any, key: str, chain_no: int, link: int, seconds: float = 0.0, ending: str = "return"
) -> str:
    """A link of a locked workflow (tests/celery/test_celery_workflow.py): notes its start and
    end on Redis's clock under ``flow:<key>`` as ``chain link start_us end_us pid``, and its
    start under ``flow-started:<key>``; sleeps (until ``stop:<key>``), then ends as ``ending``
    says."""
    begun = _redis_us()
    r.rpush(f"flow-started:{key}", f"{chain_no} {link} {os.getpid()}")
    _sleep(seconds, key)
    if ending == "fail":
        r.rpush(f"flow:{key}", f"{chain_no} {link} {begun} {_redis_us()} {os.getpid()}")
        raise RuntimeError("failed on purpose")
    if ending == "retry" and self.request.retries == 0:
        raise self.retry(countdown=0.2)
    r.rpush(f"flow:{key}", f"{chain_no} {link} {begun} {_redis_us()} {os.getpid()}")
    return f"{chain_no}.{link}"
