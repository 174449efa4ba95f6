"""Celery overhead benchmark: celery_redislock vs plain Celery, celery-singleton and celery-once.

Everything runs in one run on one Redis (broker, result backend and every lock): a throwaway
``redis-server`` started here, unless ``--url`` (or ``REDIS_URL``) names one. Each measurement
runs one real worker subprocess, started fresh with the same command line for every variant::

    python -m celery -A celery_apps worker -P prefork -c 2 --without-heartbeat \\
        --without-gossip --without-mingle -l warning

and the app of ``benchmarks/celery_apps.py`` for that variant: the same two tasks, same settings,
only the task base / lock options differ. What is measured:

1. Throughput of a trivial task (one INCR of a Redis counter). This process publishes N tasks
   with ``task.delay(run, i)``, every call with a distinct ``i`` (so no lock ever conflicts), and
   the clock runs from the first publish until the counter says all N bodies ran (polled every
   2 ms once all are published). The same method for every variant; publishing is inside the
   clock because celery-singleton and celery-once take their lock when a task is *published*,
   celery_redislock when it starts. A warm-up batch (not timed) has the worker ready and both
   pool children forked. Rounds alternate the variants (order rotated each round), each
   measurement on a fresh worker; the best round per variant is kept. Afterwards every result
   is checked to be SUCCESS (none skipped, none lost). CPU per task (user + sys of the worker's
   processes, of redis-server, and of this publishing process) is shown beside the rate: it
   says where the time goes and is less sensitive than wall time to other load on the host.
   Our task: ``@app.task(lock={"key": "bench:{run}:{i}"})`` with ``celery_redislock.install``;
   celery-singleton: ``base=Singleton``; celery-once: ``base=QueueOnce``; ``floor``: no lock, one
   ``PING`` to the same Redis before the body and one after it, in the pool child: the least any
   lock that takes and gives back its lease in the worker (two round trips there) can cost;
   ``floor_fenced``: the same two round trips, each the least script of a lock that hands out
   fencing tokens (``SET NX PX`` and an ``INCR``, then a compare-and-delete), on a key per call.
2. Recovery after a crash. A long locked task ``hold(run, key, ...)`` starts and runs ``hold_s``
   (4 s: longer than our ttl, so its lease has been renewed); a duplicate published then must
   be refused (ours: it ends SKIPPED; the peers refuse it at publish). Then
   * ``child_kill``: SIGKILL of the pool child running it (the worker's parent lives on);
   * ``worker_kill`` (ours only): SIGKILL of the worker's whole process group, and a fresh
     worker started at once.
   Then duplicates (same key) are published one after another, each followed until it ran, ended
   without running, or 0.25 s passed, until one runs. Recovery is the time from the kill to the
   start of the duplicate that ran (``time.time()`` stamped by the task; same host). Each trial
   runs on a fresh worker; the median over the trials is reported (5 child kills and 3 worker
   kills for ours, 1 with --quick), with the max. A trial also checks the worker afterwards:
   duplicates that never ran nor ended and pool children hung on a futex are reported.
   Ours, with ``redislock_ttl`` = 3 s: the worker's parent releases the dead child's lease;
   after a worker kill the lease lapses within the ttl. celery-singleton, with its documented
   ``singleton_lock_expiry`` (10 s, 6 s with --quick) set: after a kill its lock is only ever
   dropped by that expiry, counted from publish (without the setting, never). celery-once: its
   default timeout is one hour, so the figure reported is that configured one, NOT measured;
   the trial only checks that a duplicate is still refused 1 s after the kill and reads how
   long its lock has left.

Options for the throughput (the recovery runs once, with no added load, whatever they say):

* ``--loads 0,2``: the throughput rounds run once per load, here quiet and then with 2
  CPU-burning processes running throughout (``--load N`` is ``--loads N``); one table per load.
* ``--rounds R``: rounds per load, the best is kept (3, quick 1).
* ``--parser python|hiredis|both``: the redis-py parser of the workers (every client in them:
  broker, result backend, locks). ``python`` hides hiredis from the worker (a stub module on its
  ``PYTHONPATH``), ``hiredis`` needs it installed (``pip install 'celery-redislock[hiredis]'``);
  ``both`` runs every variant under each, in the same rounds. The worker notes the parser it
  uses and the benchmark checks it. This process (publishing) keeps redis-py's own pick.

Run from the repository root::

    python benchmarks/celery_overhead.py [--json out.json] [--quick] [--url redis://...]
        [--loads 0,2] [--rounds 3] [--parser python|hiredis|both]

A full run takes about 2.5 minutes on 2 cores (each extra load about 2 minutes more, the
throughput twice as long with ``--parser both``) and ``--quick`` about 35 s. ``--json`` writes
``tasks_per_s`` (best round, the first load) and ``recovery_s`` (ours, median), plus
``throughput`` (one entry per load and parser: best round per variant, the ratio to plain
Celery, CPU per task and its ratio to plain's, every round), ``recovery_s_max``,
``recovery_s_peers`` (celery-once's figure is the configured one: see ``recovery_measured``),
``recovery_degraded_trials``, ``ttl``, ``singleton_lock_expiry`` and ``once_timeout``.

Every worker runs in its own process group and is killed (all of it) on exit, Ctrl-C and SIGTERM
included. Against ``--url`` the keys created (each contains the run id) are deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import celery
import redis
from celery import Celery
from celery.result import AsyncResult
from celery_once import AlreadyQueued

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the app module lives next to this script
import celery_apps  # noqa: E402
from celery_apps import OVERHEAD_VARIANTS as VARIANTS  # noqa: E402
from celery_apps import Keys, make_app  # noqa: E402
from common import (  # noqa: E402
    PARSERS,
    Load,
    Target,
    base_parser,
    delete_keys,
    load_list,
    parsers_of,
    print_header,
    print_targets,
    redis_cpu_s,
    redis_target,
    section,
    version_of,
)

OURS = "celery_redislock"
TTL_S = 3.0  # app.conf.redislock_ttl for this benchmark (the default is 15 s)
WORKER_CMD = [
    "-m",
    "celery",
    "-A",
    "celery_apps",
    "worker",
    "-P",
    "prefork",
    "-c",
    "2",
    "--without-heartbeat",
    "--without-gossip",
    "--without-mingle",
    "-l",
    "warning",
]
WARMUP_TASKS = 50
READY_TIMEOUT_S = 60
PROBE_GAP_S = 0.01  # between two duplicates that were refused
PROBE_WAIT_S = 0.25  # the longest one duplicate is followed before the next is published
PENDING = ("PENDING", "RECEIVED", "STARTED")  # result states of a task that has not ended


# -- workers -------------------------------------------------------------------------------------


def _running(pid: int) -> bool:
    """True until ``pid`` has exited (a zombie has: its files, sockets included, are closed)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@dataclass
class Worker:
    """One ``celery worker`` subprocess, leader of its own process group."""

    variant: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pgid(self) -> int:
        return self.process.pid  # start_new_session: the worker leads its group

    def children(self) -> list[int]:
        """The pool children (of any thread of the worker's parent)."""
        found: list[int] = []
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{self.process.pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    found += [int(p) for p in (task / "children").read_text().split()]
        return sorted(found)

    def kill(self) -> None:
        """SIGKILL to the whole group, then waits until every member has exited.

        Waiting matters: until the last process holding the broker socket is gone, Redis still
        counts the dead worker's BRPOP as a consumer and may hand it a message just published.
        """
        members = [self.process.pid, *self.children()]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.process.wait()
        deadline = time.monotonic() + 10
        while any(_running(pid) for pid in members) and time.monotonic() < deadline:
            time.sleep(0.001)

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""


@dataclass
class Fleet:
    """Starts workers with the same command line and environment; kills them all at the end."""

    url: str
    run: str
    expiry: float
    logdir: Path
    started: list[Worker] = field(default_factory=list)

    def start(self, variant: str, parser: str = "auto") -> Worker:
        path = [str(HERE), os.environ.get("PYTHONPATH")]
        if parser == "python":
            path.insert(0, str(self.without_hiredis()))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, path)),
            "CELERYBENCH_VARIANT": variant,
            "CELERYBENCH_URL": self.url,
            "CELERYBENCH_RUN": self.run,
            "CELERYBENCH_TTL": str(TTL_S),
            "CELERYBENCH_EXPIRY": str(self.expiry),
            "PYTHONFAULTHANDLER": "1",  # a hung child's stack can be dumped (SIGABRT)
        }
        log = self.logdir / f"worker-{len(self.started)}-{variant}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, *WORKER_CMD],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: killpg reaches the pool children
            )
        worker = Worker(variant, process, log)
        self.started.append(worker)
        return worker

    def without_hiredis(self) -> Path:
        """A folder whose ``hiredis`` module fails to import: first on a worker's PYTHONPATH,
        redis-py there falls back to its pure-Python parser (the Celery CLI imports redis before
        the app, so the app cannot choose)."""
        folder = self.logdir / "without-hiredis"
        folder.mkdir(exist_ok=True)
        (folder / "hiredis.py").write_text('raise ImportError("hidden by the benchmark")\n')
        return folder

    def close(self) -> None:
        for worker in self.started:
            worker.kill()
        self.started.clear()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the publishing side -------------------------------------------------------------------------


@dataclass
class Bench:
    """The apps (publishing side) and Redis of one run."""

    url: str
    run: str
    expiry: float
    client: redis.Redis
    apps: dict[str, Celery] = field(default_factory=dict)
    next_i: int = 0  # every noop call gets a new i: distinct lock keys, also across rounds

    def app(self, variant: str) -> Celery:
        if variant not in self.apps:
            self.apps[variant] = make_app(
                variant, self.url, self.run, ttl=TTL_S, expiry=self.expiry
            )
        return self.apps[variant]

    def task(self, variant: str, name: str) -> celery.Task:
        return self.app(variant).tasks[f"celerybench.{name}"]

    def state(self, variant: str, task_id: str) -> str:
        return str(AsyncResult(task_id, app=self.app(variant)).state)

    def publish_noops(self, variant: str, count: int) -> list[str]:
        noop = self.task(variant, "noop")
        first, self.next_i = self.next_i, self.next_i + count
        return [noop.delay(self.run, i).id for i in range(first, first + count)]

    def wait_done(self, variant: str, count: int, worker: Worker, timeout: float) -> None:
        key = Keys(self.run, variant).done
        deadline = time.monotonic() + timeout
        while int(self.client.get(key) or 0) < count:
            if worker.process.poll() is not None:
                raise RuntimeError(f"{variant}: the worker exited:\n{worker.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{variant}: {int(self.client.get(key) or 0)} of {count} tasks done after "
                    f"{timeout} s"
                    f"\n{worker.tail()}"
                )
            time.sleep(0.002)

    def worker_parser(self, variant: str, wanted: str) -> str:
        """The parser the worker's redis-py uses (it notes it at start); checked if one was
        asked for."""
        noted = self.client.get(Keys(self.run, variant).parser)
        used = noted.decode() if isinstance(noted, bytes) else "?"
        if wanted != "auto" and used != wanted:
            raise RuntimeError(f"{variant}: the worker uses the {used} parser, not {wanted}")
        return used

    def warm_up(self, variant: str, worker: Worker) -> None:
        """Publishes a few tasks and waits for them: the worker is then up, its children forked."""
        self.client.delete(Keys(self.run, variant).done)
        self.publish_noops(variant, WARMUP_TASKS)
        self.wait_done(variant, WARMUP_TASKS, worker, READY_TIMEOUT_S)
        self.client.delete(Keys(self.run, variant).done)

    def close(self) -> None:
        for app in self.apps.values():
            app.close()
        self.client.close()


# -- 1. throughput -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    """One throughput measurement: the rate, and CPU per task (in ms) where it was spent."""

    tasks_per_s: float
    worker_cpu_ms: float  # the worker's parent and pool children (user + sys)
    redis_cpu_ms: float  # redis-server (user + sys; includes broker and result traffic)
    client_cpu_ms: float  # this process: publishing (and polling the counter)

    @property
    def cpu_ms(self) -> float:
        return self.worker_cpu_ms + self.redis_cpu_ms + self.client_cpu_ms


@dataclass(frozen=True)
class Rounds:
    all: list[Round]
    parser: str  # what the workers' redis-py used

    @property
    def best(self) -> Round:
        return max(self.all, key=lambda r: r.tasks_per_s)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one live process (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def worker_cpu_s(worker: Worker) -> float:
    return sum(process_cpu_s(pid) for pid in [worker.process.pid, *worker.children()])


def measure_throughput(
    bench: Bench, fleet: Fleet, variant: str, count: int, parser: str
) -> tuple[Round, str]:
    worker = fleet.start(variant, parser)
    try:
        bench.warm_up(variant, worker)
        used = bench.worker_parser(variant, parser)
        cpu_before = (worker_cpu_s(worker), redis_cpu_s(bench.client), time.process_time())
        start = time.perf_counter()
        ids = bench.publish_noops(variant, count)
        bench.wait_done(variant, count, worker, 60 + count / 20)
        elapsed = time.perf_counter() - start
        cpu_after = (worker_cpu_s(worker), redis_cpu_s(bench.client), time.process_time())
        # Not timed: every call ran exactly once and succeeded (none skipped as a duplicate).
        deadline = time.monotonic() + 10
        states = [bench.state(variant, i) for i in ids]
        while any(s != "SUCCESS" for s in states) and time.monotonic() < deadline:
            time.sleep(0.05)
            states = [bench.state(variant, i) for i in ids]
        bad = {s: states.count(s) for s in set(states) if s != "SUCCESS"}
        if bad:
            raise RuntimeError(f"{variant}: not all tasks succeeded: {bad}\n{worker.tail()}")
    finally:
        worker.kill()
    worker_ms, redis_ms, client_ms = (
        (after - before) / count * 1000 for before, after in zip(cpu_before, cpu_after, strict=True)
    )
    return Round(count / elapsed, worker_ms, redis_ms, client_ms), used


Rates = dict[str, dict[str, Rounds]]  # parser asked for -> variant -> its rounds


def run_throughput(
    bench: Bench, fleet: Fleet, rounds: int, count: int, parsers: list[str]
) -> Rates:
    """Rounds alternate the variants, under each parser (order rotated each round); the best
    round is kept."""
    runs = [(parser, variant) for parser in parsers for variant in VARIANTS]
    results: dict[tuple[str, str], list[Round]] = {run: [] for run in runs}
    used: dict[tuple[str, str], str] = {}
    for r in range(rounds):
        shift = r % len(runs)
        for parser, variant in runs[shift:] + runs[:shift]:
            result, used[parser, variant] = measure_throughput(bench, fleet, variant, count, parser)
            results[parser, variant].append(result)
    return {
        parser: {v: Rounds(results[parser, v], used[parser, v]) for v in VARIANTS}
        for parser in parsers
    }


# -- 2. recovery ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """One kill and what followed."""

    seconds: float  # from the kill to the start of the first duplicate that ran
    duplicates: int  # published (or refused at publish) until one ran
    stuck: int  # duplicates that, 3 s later, had neither run nor ended
    hung: int  # pool children blocked on a futex afterwards
    stacks: str = ""  # their Python stacks (faulthandler), if any


@dataclass(frozen=True)
class Recovery:
    trials: list[Trial]  # empty: not measured, ``configured`` is the figure
    note: str
    configured: float | None = None

    @property
    def measured(self) -> bool:
        return bool(self.trials)

    @property
    def seconds(self) -> float:
        if not self.trials:
            assert self.configured is not None
            return self.configured
        return statistics.median(t.seconds for t in self.trials)

    @property
    def worst(self) -> float:
        return max((t.seconds for t in self.trials), default=self.seconds)

    @property
    def degraded(self) -> list[Trial]:
        return [t for t in self.trials if t.stuck or t.hung]


def next_event(bench: Bench, variant: str, timeout: float) -> dict[str, Any] | None:
    popped = bench.client.blpop([Keys(bench.run, variant).events], timeout=timeout)
    return json.loads(popped[1]) if popped else None


def start_holder(bench: Bench, variant: str, worker: Worker, key: str, hold_s: float) -> int:
    """Publishes the long locked task, waits until it runs; returns the pid of its pool child."""
    bench.client.delete(Keys(bench.run, variant).events)
    bench.task(variant, "hold").delay(bench.run, key, "holder", 600)
    event = next_event(bench, variant, READY_TIMEOUT_S)
    if event is None or event["tag"] != "holder":
        raise RuntimeError(f"{variant}: the holder did not start ({event})\n{worker.tail()}")
    pid = int(event["pid"])
    if pid not in worker.children():
        raise RuntimeError(f"{variant}: holder pid {pid} is not a child of the worker")
    time.sleep(hold_s)
    return pid


def publish_duplicate(bench: Bench, variant: str, key: str, tag: str) -> str | None:
    """Publishes a duplicate (same key) of the holder; its id, or None if refused at publish."""
    task_id = str(uuid.uuid4())
    try:
        result = bench.task(variant, "hold").apply_async((bench.run, key, tag, 0), task_id=task_id)
    except AlreadyQueued:  # celery-once refuses at publish
        return None
    # celery-singleton returns the holder's result instead of publishing a duplicate.
    return task_id if result.id == task_id else None


def check_refused(bench: Bench, variant: str, key: str, worker: Worker) -> str:
    """A duplicate published while the holder runs must not run; returns what happened to it."""
    task_id = publish_duplicate(bench, variant, key, "check")
    if task_id is None:
        return "refused at publish"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = bench.state(variant, task_id)
        if state not in PENDING:
            break
        time.sleep(0.01)
    event = next_event(bench, variant, 0.2)
    if event is not None:
        raise RuntimeError(f"{variant}: a duplicate ran while the lock was held: {event}")
    if state != "SKIPPED":  # the only way a published duplicate should end here (ours)
        raise RuntimeError(f"{variant}: a duplicate published while the lock was held: {state}")
    return "SKIPPED"


@dataclass
class Probe:
    """Duplicates published after a kill, until one runs."""

    bench: Bench
    variant: str
    key: str
    published: list[str] = field(default_factory=list)
    refused: int = 0  # refused at publish (celery-singleton)

    def until_runs(self, killed_at: float, timeout: float) -> float:
        """Seconds from the kill to the start of the first duplicate that ran. Each duplicate
        is followed until it ran, ended without running (SKIPPED), or ``PROBE_WAIT_S`` passed
        (then another is published: one stuck duplicate must not stop the measurement)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            tag = f"probe-{len(self.published) + self.refused}"
            task_id = publish_duplicate(self.bench, self.variant, self.key, tag)
            if task_id is None:
                self.refused += 1
            else:
                self.published.append(task_id)
            wait_until = min(deadline, time.monotonic() + PROBE_WAIT_S)
            while task_id is not None and time.monotonic() < wait_until:
                event = next_event(self.bench, self.variant, 0.01)
                if event is not None:  # a duplicate ran: its own start time stamp
                    return float(event["t"]) - killed_at
                if self.bench.state(self.variant, task_id) not in PENDING:
                    break  # skipped (ours) or failed: try the next one
            event = next_event(self.bench, self.variant, PROBE_GAP_S)
            if event is not None:
                return float(event["t"]) - killed_at
        raise RuntimeError(f"{self.variant}: no duplicate ran within {timeout} s of the kill")

    @property
    def tried(self) -> int:
        return len(self.published) + self.refused

    def stuck(self, grace: float = 3.0) -> int:
        """Duplicates that, ``grace`` seconds on, have neither run nor ended."""
        deadline = time.monotonic() + grace
        while True:
            pending = [t for t in self.published if self.bench.state(self.variant, t) in PENDING]
            if not pending or time.monotonic() > deadline:
                return len(pending)
            time.sleep(0.05)


def hung_children(worker: Worker) -> list[int]:
    """Pool children blocked on a futex (an idle child waits on its pipe, a busy one runs)."""
    hung = []
    for pid in worker.children():
        with contextlib.suppress(OSError):
            if "futex" in Path(f"/proc/{pid}/wchan").read_text():
                hung.append(pid)
    return hung


def finish_trial(seconds: float, probe: Probe, worker: Worker) -> Trial:
    """The trial's figures and the worker's health after it; the Python stacks of hung pool
    children are dumped (SIGABRT: workers run with PYTHONFAULTHANDLER=1) and kept."""
    stuck = probe.stuck()
    hung = hung_children(worker)
    stacks = ""
    if hung:
        for pid in hung:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)
        time.sleep(1.0)
        log = worker.log.read_text(errors="replace")
        stacks = log[log.find("Fatal Python error") :] if "Fatal Python error" in log else ""
    return Trial(seconds, probe.tried, stuck, len(hung), stacks)


def child_kill_trial(
    bench: Bench, fleet: Fleet, variant: str, hold_s: float, n: int
) -> Trial | float:
    """SIGKILL of the pool child running the holder; for celery-once (not measured) the time
    its lock has left, read 1 s after the kill."""
    worker = fleet.start(variant)
    try:
        bench.warm_up(variant, worker)
        key = f"child-{n}"
        pid = start_holder(bench, variant, worker, key, hold_s)
        check_refused(bench, variant, key, worker)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        if variant == "celery_once":
            # Measuring would take an hour: check that a duplicate is still refused, read how
            # long the lock has left; the configured timeout is reported.
            time.sleep(1.0)
            try:
                published = bench.task(variant, "hold").apply_async((bench.run, key, "probe", 0))
            except AlreadyQueued as exc:
                return float(exc.countdown)
            raise RuntimeError(f"celery_once: a duplicate was published: {published.id}")
        probe = Probe(bench, variant, key)
        seconds = probe.until_runs(killed_at, 30 if variant == OURS else bench.expiry + 30)
        return finish_trial(seconds, probe, worker)
    finally:
        worker.kill()


def recover_child_kill(
    bench: Bench, fleet: Fleet, variant: str, hold_s: float, trials: int
) -> Recovery:
    results = [child_kill_trial(bench, fleet, variant, hold_s, n) for n in range(trials)]
    if variant == "celery_once":
        left = min(r for r in results if isinstance(r, float))
        timeout = celery_apps.ONCE_DEFAULT_TIMEOUT_S
        return Recovery(
            [],
            f"its default timeout; 1 s after the kill a duplicate is still refused and the lock "
            f"expires in {left:.0f} s",
            float(timeout),
        )
    measured = [r for r in results if isinstance(r, Trial)]
    if variant == OURS:
        note = "the worker's parent releases the dead child's lease"
    else:
        note = f"lock_expiry {bench.expiry:g} s configured, counted from publish"
    return Recovery(measured, note)


def worker_kill_trial(bench: Bench, fleet: Fleet, hold_s: float, n: int) -> Trial:
    worker = fleet.start(OURS)
    try:
        bench.warm_up(OURS, worker)
        key = f"worker-{n}"
        start_holder(bench, OURS, worker, key, hold_s)
        check_refused(bench, OURS, key, worker)
        killed_at = time.time()
        worker.kill()  # parent and children at once: nobody is left to release the lease
        fresh = fleet.start(OURS)  # duplicates wait in the queue until it is up
        try:
            probe = Probe(bench, OURS, key)
            seconds = probe.until_runs(killed_at, TTL_S + 60)
            return finish_trial(seconds, probe, fresh)
        finally:
            fresh.kill()
    finally:
        worker.kill()


def recover_worker_kill(bench: Bench, fleet: Fleet, hold_s: float, trials: int) -> Recovery:
    return Recovery(
        [worker_kill_trial(bench, fleet, hold_s, n) for n in range(trials)],
        f"the lease lapses within its ttl ({TTL_S:g} s); a fresh worker is started at the kill",
    )


# -- reporting -----------------------------------------------------------------------------------


def print_throughput(rates: Rates, count: int, load: int, loadavg: float) -> None:
    rounds_run = len(next(iter(rates.values()))[OURS].all)
    quiet = "quiet" if not load else f"under load: {load} CPU-burning process(es)"
    section(
        f"1. Throughput, {quiet}: {count} trivial tasks, publish -> all done, one worker "
        f"(prefork -c 2); best of {rounds_run} round(s); load average {loadavg:.2f} at start"
    )
    both = "python" in rates and "hiredis" in rates
    print(
        f"  {'variant':<20}{'parser':<9}{'tasks/s':>8}{'vs plain':>10}"
        + (f"{'hiredis/py':>12}" if both else "")
        + f"{'ms/task extra':>15}{'CPU ms/task':>13}{'worker':>8}{'redis':>7}{'client':>8}"
        f"{'CPU vs plain':>14}  all rounds (tasks/s)"
    )
    for variant in VARIANTS:
        for parser, by_variant in rates.items():
            rounds, plain = by_variant[variant], by_variant["plain"].best
            r = rounds.best
            extra = (1 / r.tasks_per_s - 1 / plain.tasks_per_s) * 1000
            each = " ".join(f"{x.tasks_per_s:.0f}" for x in rounds.all)
            gain = ""
            if both:
                speedup = r.tasks_per_s / rates["python"][variant].best.tasks_per_s
                gain = f"{'':>12}" if parser == "python" else f"{speedup:>11.2f}x"
            print(
                f"  {variant:<20}{rounds.parser:<9}{r.tasks_per_s:>8.0f}"
                f"{r.tasks_per_s / plain.tasks_per_s:>9.2f}x{gain}"
                f"{extra:>+15.3f}{r.cpu_ms:>13.2f}{r.worker_cpu_ms:>8.2f}{r.redis_cpu_ms:>7.2f}"
                f"{r.client_cpu_ms:>8.2f}{plain.cpu_ms / r.cpu_ms:>13.2f}x  {each}"
            )
    print(
        "  vs plain: to plain Celery under the same parser; ms/task extra: 1/rate - 1/plain "
        "rate; CPU: user+sys per task of the best round, summed over the worker (parent + "
        "children), redis-server and this publishing process; CPU vs plain: plain's CPU per "
        "task / this one's (the rate ratio a CPU-bound host would give, steadier than wall "
        "time on a shared one); parser: the workers' redis-py"
    )
    floors = {
        "floor": "two PINGs in the pool child, no lock",
        "floor_fenced": "a fenced lease taken and given back in the pool child, two small scripts",
    }
    for by_variant in rates.values():
        for name, what in floors.items():
            ours, floor = by_variant[OURS].best, by_variant[name].best
            print(
                f"  {OURS} / {name} ({by_variant[OURS].parser}): "
                f"{ours.tasks_per_s / floor.tasks_per_s:.2f}x the rate, "
                f"{floor.cpu_ms / ours.cpu_ms:.2f}x the CPU per task ({what})"
            )
        fenced, floor = by_variant["floor_fenced"].best, by_variant["floor"].best
        print(f"  floor_fenced / floor: {fenced.tasks_per_s / floor.tasks_per_s:.2f}x the rate")


def print_recovery(recovery: dict[str, dict[str, Recovery]], hold_s: float) -> None:
    section(
        f"2. Recovery: a long locked task runs {hold_s:g} s, SIGKILL -> seconds until a "
        "duplicate (same key) runs"
    )
    print(f"  {'lock':<20}{'scenario':<13}{'median':>8}{'max':>8}{'n':>3}  {'figure':<12}note")
    for variant, scenarios in recovery.items():
        for scenario, r in scenarios.items():
            how = "measured" if r.measured else "CONFIGURED"
            print(
                f"  {variant:<20}{scenario:<13}{r.seconds:>8.2f}{r.worst:>8.2f}"
                f"{len(r.trials):>3}  {how:<12}{r.note}"
            )
            if not r.trials:
                continue
            each = " ".join(f"{t.seconds:.2f}" for t in r.trials)
            tries = " ".join(str(t.duplicates) for t in r.trials)
            print(f"  {'':<22}trials: {each} s; duplicates tried: {tries}")
            for t in r.degraded:
                print(
                    f"  {'':<22}WORKER DEGRADED after the {t.seconds:.2f} s trial: {t.stuck} "
                    f"duplicate(s) never ran nor ended, {t.hung} pool child(ren) hung on a futex"
                )
                if t.stacks:  # the innermost frames come first
                    frames = t.stacks.splitlines()[:24]
                    print("\n".join(f"  {'':<24}| {line}" for line in frames))
    print(
        "  a duplicate published while the holder ran was refused in every trial "
        "(ours: SKIPPED; celery-singleton, celery-once: at publish)"
    )


def to_json(
    throughput: dict[int, Rates], recovery: dict[str, dict[str, Recovery]], expiry: float
) -> dict[str, Any]:
    first = next(iter(throughput.values()))
    rates = first[list(first)[-1]]
    return {
        "tasks_per_s": {v: round(r.best.tasks_per_s, 1) for v, r in rates.items()},
        "cpu_ms_per_task": {v: round(r.best.cpu_ms, 3) for v, r in rates.items()},
        "throughput": [
            {
                "load_processes": load,
                "parser": by_variant[OURS].parser,
                "tasks_per_s": {v: round(r.best.tasks_per_s, 1) for v, r in by_variant.items()},
                "vs_plain": {
                    v: round(r.best.tasks_per_s / by_variant["plain"].best.tasks_per_s, 3)
                    for v, r in by_variant.items()
                },
                "cpu_ms_per_task": {v: round(r.best.cpu_ms, 3) for v, r in by_variant.items()},
                "cpu_vs_plain": {
                    v: round(by_variant["plain"].best.cpu_ms / r.best.cpu_ms, 3)
                    for v, r in by_variant.items()
                },
                "rounds_tasks_per_s": {
                    v: [round(x.tasks_per_s, 1) for x in r.all] for v, r in by_variant.items()
                },
            }
            for load, rates_of_load in throughput.items()
            for by_variant in rates_of_load.values()
        ],
        "recovery_s": {s: round(r.seconds, 3) for s, r in recovery[OURS].items()},
        "recovery_s_max": {s: round(r.worst, 3) for s, r in recovery[OURS].items()},
        "recovery_s_peers": {
            variant: {s: round(r.seconds, 3) for s, r in scenarios.items()}
            for variant, scenarios in recovery.items()
            if variant != OURS
        },
        "recovery_measured": {
            variant: {s: r.measured for s, r in scenarios.items()}
            for variant, scenarios in recovery.items()
        },
        "recovery_degraded_trials": {
            variant: {s: len(r.degraded) for s, r in scenarios.items() if r.trials}
            for variant, scenarios in recovery.items()
        },
        "ttl": TTL_S,
        "singleton_lock_expiry": expiry,
        "once_timeout": celery_apps.ONCE_DEFAULT_TIMEOUT_S,
    }


# -- command line --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    tasks: int
    rounds: int
    hold_s: float  # how long the holder runs before the kill
    expiry: float  # celery-singleton's lock_expiry
    child_trials: int  # child kills for ours (celery-singleton and celery-once: one)
    worker_trials: int


FULL = Settings(tasks=2000, rounds=3, hold_s=TTL_S + 1, expiry=10, child_trials=5, worker_trials=3)
QUICK = Settings(tasks=400, rounds=1, hold_s=TTL_S + 1, expiry=6, child_trials=1, worker_trials=1)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__ or "", "fewer tasks and rounds (< 60 s)")
    parser.add_argument("--tasks", type=int, help="tasks per throughput round (2000, quick 400)")
    parser.add_argument("--rounds", type=int, help="throughput rounds per load (3, quick 1)")
    loads = parser.add_mutually_exclusive_group()
    loads.add_argument(
        "--loads",
        type=load_list,
        default=[0],
        metavar="N,M,...",
        help="CPU-burning processes during the throughput rounds, one set of rounds per count "
        "(default 0; e.g. 0,2)",
    )
    loads.add_argument(
        "--load", type=int, metavar="N", help="N CPU-burning processes (the same as --loads N)"
    )
    parser.add_argument(
        "--parser",
        choices=PARSERS,
        default="auto",
        help="the workers' redis-py parser: python, hiredis, or both side by side (default: "
        "redis-py's pick, hiredis when installed)",
    )
    args = parser.parse_args(argv)
    if args.load is not None:
        if args.load < 0:
            parser.error("--load: expected a count >= 0")
        args.loads = [args.load]
    return args


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that kill the workers


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = QUICK if args.quick else FULL
    count = args.tasks or settings.tasks
    rounds = args.rounds or settings.rounds
    parsers = parsers_of(args.parser)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    began = time.perf_counter()
    run = f"{os.getpid()}-{os.urandom(3).hex()}"
    with (
        redis_target(args.url or os.environ.get("REDIS_URL")) as (url, origin),
        tempfile.TemporaryDirectory(prefix="celerybench-") as logdir,
        Fleet(url, run, settings.expiry, Path(logdir)) as fleet,
    ):
        bench = Bench(url, run, settings.expiry, redis.Redis.from_url(url))
        try:
            print_header(
                "Celery overhead benchmark",
                url,
                origin,
                bench.client,
                args.quick,
                f"worker: python {' '.join(WORKER_CMD)}; redis-py {redis.__version__}, hiredis "
                f"{version_of('hiredis')}",
            )
            throughput: dict[int, Rates] = {}
            for load in args.loads:
                loadavg = os.getloadavg()[0]
                with Load(load):
                    throughput[load] = run_throughput(bench, fleet, rounds, count, parsers)
                print_throughput(throughput[load], count, load, loadavg)
            hold, trials = settings.hold_s, settings.child_trials
            recovery = {
                OURS: {
                    "child_kill": recover_child_kill(bench, fleet, OURS, hold, trials),
                    "worker_kill": recover_worker_kill(bench, fleet, hold, settings.worker_trials),
                },
                "celery_singleton": {
                    "child_kill": recover_child_kill(bench, fleet, "celery_singleton", hold, 1)
                },
                "celery_once": {
                    "child_kill": recover_child_kill(bench, fleet, "celery_once", hold, 1)
                },
            }
            print_recovery(recovery, settings.hold_s)
        finally:
            fleet.close()
            if args.url or os.environ.get("REDIS_URL"):
                delete_keys(bench.client, run)
            bench.close()
    checks = [
        Target(
            f"tasks/s, celery_redislock / plain (load {load}, parser {rates[OURS].parser})",
            rates[OURS].best.tasks_per_s / rates["plain"].best.tasks_per_s,
            0.9,
            at_least=True,
            unit="x",
        )
        for load, of_load in throughput.items()
        for rates in of_load.values()
    ] + [
        Target(
            "recovery after child kill (median), celery_redislock",
            recovery[OURS]["child_kill"].seconds,
            1.0,
            unit=" s",
        ),
        Target(
            f"recovery after worker kill (max), celery_redislock, ttl {TTL_S:g} s",
            recovery[OURS]["worker_kill"].worst,
            TTL_S + 1,
            unit=" s",
        ),
    ]
    print_targets(checks, began)
    if args.json:
        args.json.write_text(json.dumps(to_json(throughput, recovery, settings.expiry), indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
