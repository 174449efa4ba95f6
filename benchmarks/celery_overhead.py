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
   is checked to be SUCCESS (none skipped, none lost).
   Our task: ``@app.task(lock={"key": "bench:{run}:{i}"})`` with ``celery_redislock.install``;
   celery-singleton: ``base=Singleton``; celery-once: ``base=QueueOnce``.
2. Recovery after a crash. A long locked task ``hold(run, key, ...)`` starts; after ``--hold``
   seconds (longer than our ttl, so its lease has been renewed) a duplicate is published and
   must be refused; then
   * ``child_kill``: SIGKILL of the pool child running it (the worker's parent lives on);
   * ``worker_kill`` (ours only): SIGKILL of the whole worker's process group, and a fresh
     worker started at once.
   Then duplicates (same key) are published one after another until one runs. Recovery is the
   time from the kill to the start of the duplicate that ran (``time.time()`` stamped by the
   task; same host). Ours, with ``redislock_ttl`` = ``TTL_S``: the worker's parent releases the
   dead child's lease; after a worker kill the lease lapses within the ttl. celery-singleton
   with its documented ``singleton_lock_expiry`` (the lock is only ever dropped by expiry after a
   kill; without the setting it never is). celery-once: its default timeout is one hour, so the
   figure reported is the configured one, NOT measured; the run only checks that a duplicate is
   refused after the kill and reads the lock's remaining time.

Run from the repository root::

    python benchmarks/celery_overhead.py [--json out.json] [--quick] [--url redis://...]

A full run takes about 2 minutes on 2 cores and ``--quick`` about 40 s. Every process started
here runs in its own process group and is killed on exit (Ctrl-C included). Against ``--url`` the
keys created (each contains the run id) are deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import celery
import redis
from celery import Celery
from celery.result import AsyncResult
from celery_once import AlreadyQueued

import celery_redislock
from celery_redislock.server import RedisServer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the app module lives next to this script
import celery_apps  # noqa: E402
from celery_apps import VARIANTS, Keys, make_app  # noqa: E402

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
PROBE_WAIT_S = 1.0  # the longest one duplicate is followed before the next is published
PENDING = ("PENDING", "RECEIVED", "STARTED")  # result states of a task that has not ended


# -- workers -------------------------------------------------------------------------------------


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
        path = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        with contextlib.suppress(OSError):
            return [int(p) for p in path.read_text().split()]
        return []

    def kill(self) -> None:
        """SIGKILL to the whole group: the worker's parent and its pool children."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.process.wait()

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

    def start(self, variant: str) -> Worker:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
            "CELERYBENCH_VARIANT": variant,
            "CELERYBENCH_URL": self.url,
            "CELERYBENCH_RUN": self.run,
            "CELERYBENCH_TTL": str(TTL_S),
            "CELERYBENCH_EXPIRY": str(self.expiry),
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
                    f"{variant}: {self.client.get(key)} of {count} tasks done after {timeout} s"
                    f"\n{worker.tail()}"
                )
            time.sleep(0.002)

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


def measure_throughput(bench: Bench, fleet: Fleet, variant: str, count: int) -> float:
    worker = fleet.start(variant)
    try:
        bench.warm_up(variant, worker)
        start = time.perf_counter()
        ids = bench.publish_noops(variant, count)
        bench.wait_done(variant, count, worker, 60 + count / 20)
        elapsed = time.perf_counter() - start
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
    return count / elapsed


def run_throughput(bench: Bench, fleet: Fleet, rounds: int, count: int) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        shift = r % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            rates[variant].append(measure_throughput(bench, fleet, variant, count))
    return rates


# -- 2. recovery ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recovery:
    seconds: float
    measured: bool
    note: str
    duplicates: int = 0  # duplicates published (or refused at publish) until one ran
    health: str = ""  # after the recovery: stuck duplicates, hung pool children


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
    return f"ended {state}"


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


def health(probe: Probe, worker: Worker) -> str:
    """After the recovery: duplicates that never ended and pool children that hang."""
    stuck = probe.stuck()
    hung = hung_children(worker)
    if not stuck and not hung:
        return "worker healthy after"
    return (
        f"WORKER DEGRADED after: {stuck} duplicate(s) never ran nor ended, "
        f"{len(hung)} pool child(ren) blocked on a futex {hung}"
    )


def recover_child_kill(bench: Bench, fleet: Fleet, variant: str, hold_s: float) -> Recovery:
    worker = fleet.start(variant)
    try:
        bench.warm_up(variant, worker)
        key = f"child-{variant}"
        pid = start_holder(bench, variant, worker, key, hold_s)
        refused = check_refused(bench, variant, key, worker)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        if variant == "celery_once":
            # Measuring would take an hour: check that the duplicate is still refused and read
            # how long the lock has left, then report the configured timeout.
            time.sleep(1.0)
            try:
                publish = bench.task(variant, "hold").apply_async((bench.run, key, "probe", 0))
            except AlreadyQueued as exc:
                left = exc.countdown
            else:
                raise RuntimeError(f"celery_once: a duplicate was published: {publish.id}")
            timeout = celery_apps.ONCE_DEFAULT_TIMEOUT_S
            return Recovery(
                float(timeout),
                False,
                f"default timeout {timeout} s; 1 s after the kill a duplicate is still refused, "
                f"lock expires in {left:.0f} s",
            )
        probe = Probe(bench, variant, key)
        seconds = probe.until_runs(killed_at, 30 if variant == OURS else bench.expiry + 30)
        if variant == OURS:
            note = "the worker's parent releases the dead child's lease"
        else:
            note = f"lock_expiry {bench.expiry:g} s configured, counted from publish"
        return Recovery(
            seconds,
            True,
            f"{note}; duplicate while held: {refused}",
            probe.tried,
            health(probe, worker),
        )
    finally:
        worker.kill()


def recover_worker_kill(bench: Bench, fleet: Fleet, hold_s: float) -> Recovery:
    worker = fleet.start(OURS)
    try:
        bench.warm_up(OURS, worker)
        key = "worker"
        start_holder(bench, OURS, worker, key, hold_s)
        refused = check_refused(bench, OURS, key, worker)
        killed_at = time.time()
        worker.kill()  # parent and children at once: nobody is left to release the lease
        fresh = fleet.start(OURS)  # duplicates wait in the queue until it is up
        try:
            probe = Probe(bench, OURS, key)
            seconds = probe.until_runs(killed_at, TTL_S + 60)
            healthy = health(probe, fresh)
        finally:
            fresh.kill()
    finally:
        worker.kill()
    return Recovery(
        seconds,
        True,
        f"lease lapses within ttl {TTL_S:g} s; a fresh worker started at the kill; "
        f"duplicate while held: {refused}",
        probe.tried,
        healthy,
    )


# -- reporting -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    label: str
    value: float
    limit: float
    unit: str = " s"

    @property
    def passed(self) -> bool:
        return self.value <= self.limit

    def line(self) -> str:
        mark = "pass" if self.passed else "MISS"
        value = f"{self.value:.3g}{self.unit}"
        return f"  [{mark}] {self.label:<50} {value:>10}  (target <= {self.limit:g}{self.unit})"


def section(title: str) -> None:
    print(f"\n{title}\n{'-' * len(title)}", flush=True)


def print_throughput(rates: dict[str, list[float]], count: int) -> None:
    section(
        f"1. Throughput: {count} trivial tasks, publish -> all done, one worker (prefork -c 2); "
        f"best of {len(rates[OURS])} round(s)"
    )
    plain = max(rates["plain"])
    print(f"  {'variant':<20}{'tasks/s':>9}{'vs plain':>10}{'ms/task extra':>15}  all rounds")
    for variant, values in rates.items():
        best = max(values)
        extra = (1 / best - 1 / plain) * 1000
        rounds = " ".join(f"{v:.0f}" for v in values)
        print(f"  {variant:<20}{best:>9.0f}{best / plain:>9.2f}x{extra:>+15.3f}  {rounds}")


def print_recovery(recovery: dict[str, dict[str, Recovery]]) -> None:
    section(
        "2. Recovery: SIGKILL while a long locked task runs -> seconds until a duplicate "
        "(same key) runs"
    )
    print(f"  {'lock':<20}{'scenario':<13}{'seconds':>9}  {'figure':<12}note")
    for variant, scenarios in recovery.items():
        for scenario, r in scenarios.items():
            how = "measured" if r.measured else "CONFIGURED"
            tries = f"; {r.duplicates} duplicate(s) tried" if r.measured else ""
            print(f"  {variant:<20}{scenario:<13}{r.seconds:>9.2f}  {how:<12}{r.note}{tries}")
            if r.health:
                print(f"  {'':<42}{r.health}")


def to_json(
    rates: dict[str, list[float]], recovery: dict[str, dict[str, Recovery]], expiry: float
) -> dict[str, Any]:
    ours = recovery[OURS]
    return {
        "tasks_per_s": {v: round(max(values), 1) for v, values in rates.items()},
        "recovery_s": {s: round(r.seconds, 3) for s, r in ours.items()},
        "recovery_s_peers": {
            variant: {
                scenario: {"seconds": round(r.seconds, 3), "measured": r.measured}
                for scenario, r in scenarios.items()
            }
            for variant, scenarios in recovery.items()
            if variant != OURS
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


FULL = Settings(tasks=2000, rounds=3, hold_s=TTL_S + 1, expiry=10)
QUICK = Settings(tasks=300, rounds=1, hold_s=TTL_S + 1, expiry=6)


@contextlib.contextmanager
def redis_target(url: str | None) -> Iterator[tuple[str, str]]:
    """The URL to benchmark and where it came from; starts (and stops) a server unless given."""
    if url:
        yield url, "given"
        return
    with RedisServer() as server:
        yield server.url, f"started here: {server.binary} v{server.version}"


def delete_keys(client: redis.Redis, run: str) -> int:
    """Deletes every key whose name contains the run id; returns how many."""
    keys = list(client.scan_iter(match=f"*{run}*", count=1000))
    for start in range(0, len(keys), 1000):
        client.unlink(*keys[start : start + 1000])
    return len(keys)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="fewer tasks and rounds (< 60 s)")
    parser.add_argument(
        "--url", help="benchmark this Redis (default: $REDIS_URL, else a fresh redis-server)"
    )
    parser.add_argument("--tasks", type=int, help="tasks per throughput round (2000, quick 300)")
    return parser.parse_args(argv)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that kill the workers


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = QUICK if args.quick else FULL
    count = args.tasks or settings.tasks
    signal.signal(signal.SIGTERM, _terminate)
    began = time.perf_counter()
    run = f"{os.getpid()}-{os.urandom(3).hex()}"
    with (
        redis_target(args.url or os.environ.get("REDIS_URL")) as (url, origin),
        tempfile.TemporaryDirectory(prefix="celerybench-") as logdir,
        Fleet(url, run, settings.expiry, Path(logdir)) as fleet,
    ):
        bench = Bench(url, run, settings.expiry, redis.Redis.from_url(url))
        try:
            version = bench.client.info("server")["redis_version"]
            print(
                f"Celery overhead benchmark: Redis {version} at {url} ({origin}); Python "
                f"{platform.python_version()}, Celery {celery.__version__}, {os.cpu_count()} "
                f"CPU(s), load average {os.getloadavg()[0]:.2f}"
                + ("; --quick" if args.quick else ""),
                flush=True,
            )
            print(
                f"celery_redislock {celery_redislock.__version__}, celery-singleton "
                f"{_version('celery-singleton')}, celery-once {_version('celery_once')}; "
                f"worker: python {' '.join(WORKER_CMD)}",
                flush=True,
            )
            rates = run_throughput(bench, fleet, settings.rounds, count)
            print_throughput(rates, count)
            recovery = {
                OURS: {
                    "child_kill": recover_child_kill(bench, fleet, OURS, settings.hold_s),
                    "worker_kill": recover_worker_kill(bench, fleet, settings.hold_s),
                },
                "celery_singleton": {
                    "child_kill": recover_child_kill(
                        bench, fleet, "celery_singleton", settings.hold_s
                    )
                },
                "celery_once": {
                    "child_kill": recover_child_kill(bench, fleet, "celery_once", settings.hold_s)
                },
            }
            print_recovery(recovery)
        finally:
            fleet.close()
            if args.url or os.environ.get("REDIS_URL"):
                delete_keys(bench.client, run)
            bench.close()
    checks = [
        Target(
            "recovery after child kill, celery_redislock", recovery[OURS]["child_kill"].seconds, 1.0
        ),
        Target(
            f"recovery after worker kill, celery_redislock (ttl {TTL_S:g} s)",
            recovery[OURS]["worker_kill"].seconds,
            TTL_S + 1,
        ),
    ]
    section("Targets")
    for check in checks:
        print(check.line())
    misses = sum(not c.passed for c in checks)
    print(
        f"\n{len(checks) - misses} of {len(checks)} targets met; total runtime "
        f"{time.perf_counter() - began:.1f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(to_json(rates, recovery, settings.expiry), indent=2))
        print(f"wrote {args.json}")
    return 0


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
