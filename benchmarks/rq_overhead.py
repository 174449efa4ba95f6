"""RQ overhead benchmark: RQ jobs with celery_redislock's lock vs plain RQ jobs, and recovery
after a work horse is SIGKILLed, with and without parent-side release.

Everything runs in one run on one Redis (queues, results and every lock): a throwaway
``redis-server`` started here, unless ``--url`` (or ``REDIS_URL``) names one. Workers are real
``rq worker`` subprocesses (the jobs are in ``benchmarks/rq_jobs.py``)::

    python -m rq.cli worker -u URL -w CLASS -n NAME -P benchmarks -c rq_jobs \\
        --logging_level WARNING --disable-job-desc-logging QUEUE

``-c rq_jobs`` has every worker import the jobs (and celery_redislock) before it forks: no horse
pays for an import, of the plain job or of the locked one.

What is measured:

1. Throughput of a no-op job (one INCR of a Redis counter), per worker kind:
   * ``SimpleWorker`` (jobs run in the worker's own process): ``plain(run, i)`` on one
     ``rq.worker.SimpleWorker``, ``locked_noop(run, i)`` (``@locked(lock="rqbench:{run}:{i}")``,
     a lock of its own per call, so none ever conflicts) on another;
   * the forking ``Worker`` (a work horse forked per job): ``plain`` on RQ's
     ``rq.worker.Worker``, ``locked_noop`` on ``LockWorker`` (RQ's ``Worker`` with parent-side
     release: what a user of the lock runs);
   * and for each, a **floor**: ``floor(run, i)`` on the kind's plain class, no lock, one
     ``PING`` before the body and one after it where the job runs (in the horse, for the forking
     worker): the two round trips any lock held there costs (ours takes its lease before the
     body and gives it back after); and a **floor with a renewer**, ``floor_renewer(run, i)``:
     the same, and a thread started where the job runs, once per process, as a lease's renewer
     is (in a forked horse, once per job: the horse must renew its own lease, since its worker
     may die while it runs and RQ then runs the job again).
   The workers of a kind are started together, warmed up, and then take turns (order rotated
   each round): this process enqueues N jobs with ``enqueue_many`` in one pipeline, and the
   clock runs from the enqueue until the counter says all N bodies ran (polled every 5 ms).
   Afterwards every job is checked to be ``finished`` and the counter to be exactly N (none
   skipped, none run twice). The best round per variant gives the ratio; beside it, the median
   of the paired ratios (locked / plain within each round, measured back to back: less
   sensitive to load that changes between rounds); CPU per job (worker parent + its horses,
   redis-server, this enqueuing process) says where the time goes.
2. Recovery after a horse is SIGKILLed. ``hold(run, key, ...)`` (lease ttl ``TTL_S`` = 5 s,
   ``on_conflict="wait"``) starts on worker A and notes its horse's pid; it runs ``hold_s``
   (6 s: past its ttl, so its lease has been renewed). A copy with the same key is enqueued on
   worker B and must wait in the lock's line without running. Then A's horse is SIGKILLed (as
   by the OOM killer), and recovery is the time from the kill to the start of the waiting copy
   (``time.time()`` stamped by the job; same host). With ``LockWorker`` (both workers) A's
   parent releases the dead horse's lease as soon as it reaps it; with RQ's plain ``Worker``
   the lease lapses within its ttl. Median over the trials, with the max.

Run from the repository root::

    python benchmarks/rq_overhead.py [--json out.json] [--quick] [--url redis://...] [--load N]

``--load N`` runs N CPU-burning processes during the throughput rounds.

A full run takes about 2 minutes on 2 cores and ``--quick`` about 30 s. ``--json`` writes
``jobs_per_s`` (best round per worker kind and variant), ``ratio`` (locked / plain, best and
median), ``ratio_to_floor`` and ``ratio_to_floor_renewer`` (locked / each floor, best and
median), ``cpu_ms_per_job``, ``faults_per_job`` (minor page faults of the worker and its
horses), ``recovery_s`` (median per worker class), ``recovery_s_max`` and ``ttl``.

Every worker runs in its own process group and is killed (all of it, its horses too) on exit,
Ctrl-C and SIGTERM included. Against ``--url`` the keys created (each contains the run id) are
deleted at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import rq
from rq import Queue
from rq.job import Job

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the jobs module lives next to this script
import rq_jobs  # noqa: E402
from common import (  # noqa: E402
    Load,
    Target,
    add_load_option,
    base_parser,
    delete_keys,
    print_targets,
    redis_cpu_s,
    redis_target,
    section,
)

import celery_redislock  # noqa: E402
from celery_redislock.core.admin import describe_lock  # noqa: E402
from celery_redislock.integrations.rq import spec_of  # noqa: E402

LOCK_WORKER = "celery_redislock.integrations.rq.LockWorker"
KINDS: dict[str, dict[str, str]] = {
    # worker kind -> variant -> the worker class that runs it
    "SimpleWorker": {
        "plain": "rq.worker.SimpleWorker",
        "floor": "rq.worker.SimpleWorker",
        "floor_renewer": "rq.worker.SimpleWorker",
        "locked": "rq.worker.SimpleWorker",
    },
    "Worker (fork)": {
        "plain": "rq.worker.Worker",
        "floor": "rq.worker.Worker",
        "floor_renewer": "rq.worker.Worker",
        "locked": LOCK_WORKER,
    },
}
RECOVERY_CLASSES = {"LockWorker": LOCK_WORKER, "Worker": "rq.worker.Worker"}
FUNCTIONS = {
    "plain": rq_jobs.plain,
    "floor": rq_jobs.floor,
    "floor_renewer": rq_jobs.floor_renewer,
    "locked": rq_jobs.locked_noop,
}
READY_TIMEOUT_S = 60
WARMUP_JOBS = 20
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# -- workers -------------------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    """Live child processes of ``pid`` (a forking worker's horse)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
                found.append(int(entry.name))
    return found


@dataclass
class Worker:
    """One ``rq worker`` subprocess, leader of its own process group (a horse makes a group
    of its own: it is found as a child and killed apart)."""

    name: str
    queue: str
    process: subprocess.Popen[bytes]
    log: Path

    def _stat(self) -> list[str]:
        try:
            return Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return ["0"] * 20

    def cpu_s(self) -> float:
        """User + system CPU of the worker and of its horses that ended (reaped by it)."""
        return sum(int(x) for x in self._stat()[11:15]) / CLOCK_TICKS  # utime stime cutime cstime

    def faults(self) -> int:
        """Minor page faults of the worker and of its horses that ended: in a forked horse,
        mostly the pages of its parent's memory it wrote to and so got its own copy of."""
        stat = self._stat()
        return int(stat[7]) + int(stat[8])  # minflt cminflt

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        horses = children_of(self.process.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for pid in horses:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self.process.wait()


class Fleet:
    """Starts workers; every one still running is killed when the fleet closes."""

    def __init__(self, url: str, run: str, log_dir: Path, client: redis.Redis) -> None:
        self.url, self.run, self.log_dir, self.client = url, run, log_dir, client
        self.workers: list[Worker] = []
        self.count = 0
        # The lock Redis is the job's own RQ connection (the default), as for most users.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("REDISLOCK_")}

    def start(self, worker_class: str, queue: str) -> Worker:
        self.count += 1
        name = f"rqbench-{self.run}-{self.count}"
        queue = f"rqbench-{self.run}-{queue}"
        log = self.log_dir / f"{name}.log"
        command = [
            sys.executable, "-m", "rq.cli", "worker", "-u", self.url, "-w", worker_class,
            "-n", name, "-P", str(HERE), "-c", "rq_jobs", "--logging_level", "WARNING",
            "--disable-job-desc-logging", queue,
        ]  # fmt: skip
        with open(log, "wb") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        worker = Worker(name, queue, process, log)
        self.workers.append(worker)
        return worker

    def wait_ready(self, workers: Sequence[Worker]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        for worker in workers:
            while not self.client.exists(f"rq:worker:{worker.name}"):
                if worker.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker {worker.name} did not start:\n{worker.tail()}")
                time.sleep(0.05)

    def stop(self, workers: Sequence[Worker]) -> None:
        for worker in workers:
            worker.kill()
            self.workers.remove(worker)

    def close(self) -> None:
        self.stop(list(self.workers))

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- 1. throughput -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    jobs_per_s: float
    worker_cpu_ms: float  # per job
    faults: float  # minor page faults of the worker and its horses, per job
    redis_cpu_ms: float
    client_cpu_ms: float

    @property
    def cpu_ms(self) -> float:
        return self.worker_cpu_ms + self.redis_cpu_ms + self.client_cpu_ms


@dataclass
class Rounds:
    all: list[Round]

    @property
    def best(self) -> Round:
        return max(self.all, key=lambda r: r.jobs_per_s)

    @property
    def median(self) -> float:
        return statistics.median(r.jobs_per_s for r in self.all)


class Bench:
    def __init__(self, url: str, run: str, client: redis.Redis, fleet: Fleet) -> None:
        self.url, self.run, self.client, self.fleet = url, run, client, fleet
        self.batch = 0

    def queue(self, name: str) -> Queue:
        return Queue(name, connection=self.client)

    def enqueue(self, queue: Queue, variant: str, count: int) -> list[str]:
        fun = FUNCTIONS[variant]
        self.batch += 1
        base = self.batch * 1_000_000  # distinct arguments (and lock names) in every batch
        with self.client.pipeline() as pipe:
            jobs = queue.enqueue_many(
                [Queue.prepare_data(fun, (self.run, base + i)) for i in range(count)],
                pipeline=pipe,
            )
            pipe.execute()
        return [job.id for job in jobs]

    def done(self, variant: str) -> int:
        return int(self.client.get(rq_jobs.done_key(self.run, variant)) or 0)

    def run_batch(self, worker: Worker, variant: str, count: int) -> Round:
        self.client.delete(rq_jobs.done_key(self.run, variant))
        queue = self.queue(worker.queue)
        cpu_before = (worker.cpu_s(), redis_cpu_s(self.client), time.process_time())
        faults_before = worker.faults()
        start = time.perf_counter()
        ids = self.enqueue(queue, variant, count)
        deadline = time.monotonic() + 60 + count / 10
        while self.done(variant) < count:
            if time.monotonic() > deadline or worker.process.poll() is not None:
                raise RuntimeError(
                    f"{worker.name} ({variant}): {self.done(variant)} of {count} jobs ran\n"
                    f"{worker.tail()}"
                )
            time.sleep(0.005)
        elapsed = time.perf_counter() - start
        cpu_after = (worker.cpu_s(), redis_cpu_s(self.client), time.process_time())
        faults = (worker.faults() - faults_before) / count
        self.check_finished(worker, variant, ids, count)
        worker_ms, redis_ms, client_ms = (
            (after - before) / count * 1000
            for before, after in zip(cpu_before, cpu_after, strict=True)
        )
        return Round(count / elapsed, worker_ms, faults, redis_ms, client_ms)

    def check_finished(self, worker: Worker, variant: str, ids: list[str], count: int) -> None:
        """Not timed: every job finished, and each body ran exactly once."""
        deadline = time.monotonic() + 10
        while True:
            jobs = Job.fetch_many(ids, connection=self.client)
            states = [j.get_status(refresh=False) if j is not None else "gone" for j in jobs]
            bad = {str(s): states.count(s) for s in set(states) if s != "finished"}
            if not bad or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if bad or self.done(variant) != count:
            raise RuntimeError(
                f"{worker.name} ({variant}): jobs not finished {bad}, bodies run "
                f"{self.done(variant)} of {count}\n{worker.tail()}"
            )
        with self.client.pipeline() as pipe:  # not needed any more: keep the server small
            for job_id in ids:
                pipe.delete(f"rq:job:{job_id}", f"rq:results:{job_id}")
            pipe.execute()


def run_throughput(bench: Bench, kind: str, rounds: int, count: int) -> dict[str, Rounds]:
    """Both workers of a kind run side by side; rounds alternate them (order rotated)."""
    variants = list(KINDS[kind])
    workers = {
        v: bench.fleet.start(KINDS[kind][v], f"{kind.split()[0].lower()}-{v}") for v in variants
    }
    try:
        bench.fleet.wait_ready(list(workers.values()))
        for variant, worker in workers.items():
            bench.run_batch(worker, variant, WARMUP_JOBS)
        results: dict[str, list[Round]] = {v: [] for v in variants}
        for r in range(rounds):
            shift = r % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                results[variant].append(bench.run_batch(workers[variant], variant, count))
        return {v: Rounds(rs) for v, rs in results.items()}
    finally:
        bench.fleet.stop(list(workers.values()))


# -- 2. recovery ---------------------------------------------------------------------------------


def next_event(bench: Bench, timeout: float) -> dict[str, Any] | None:
    popped = bench.client.blpop([rq_jobs.events_key(bench.run)], timeout=timeout)
    return json.loads(popped[1]) if popped else None


def waiting_in_line(bench: Bench, key: str) -> int:
    spec = spec_of(rq_jobs.hold)
    assert spec is not None
    name = spec.lock_name((bench.run, key, "", 0), {})
    return len(describe_lock(bench.client, name, spec.settings.namespace).waiters)


def recovery_trial(bench: Bench, a: Worker, b: Worker, hold_s: float, n: int) -> float:
    """One kill: seconds from the SIGKILL of the holder's horse to the waiter's start."""
    key = f"{a.name}-{n}"
    bench.client.delete(rq_jobs.events_key(bench.run))
    bench.queue(a.queue).enqueue(rq_jobs.hold, bench.run, key, "holder", 600, job_timeout=900)
    event = next_event(bench, READY_TIMEOUT_S)
    if event is None or event["tag"] != "holder":
        raise RuntimeError(f"the holder did not start ({event})\n{a.tail()}")
    pid = int(event["pid"])
    if pid not in children_of(a.process.pid):
        raise RuntimeError(f"holder pid {pid} is not a horse of {a.name}")
    time.sleep(hold_s)
    bench.queue(b.queue).enqueue(rq_jobs.hold, bench.run, key, "waiter", 0)
    deadline = time.monotonic() + 30
    while not waiting_in_line(bench, key):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the copy never waited for the lock\n{b.tail()}")
        time.sleep(0.01)
    event = next_event(bench, 0.2)
    if event is not None:
        raise RuntimeError(f"a copy ran while the lock was held: {event}")
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    event = next_event(bench, rq_jobs.TTL_S + 30)
    if event is None or event["tag"] != "waiter":
        raise RuntimeError(f"the waiting copy did not start ({event})\n{b.tail()}")
    return float(event["t"]) - killed_at


@dataclass(frozen=True)
class Recovery:
    trials: list[float]
    note: str

    @property
    def median(self) -> float:
        return statistics.median(self.trials)

    @property
    def worst(self) -> float:
        return max(self.trials)


def run_recovery(bench: Bench, label: str, hold_s: float, trials: int) -> Recovery:
    worker_class = RECOVERY_CLASSES[label]
    a = bench.fleet.start(worker_class, f"recover-{label}-a")
    b = bench.fleet.start(worker_class, f"recover-{label}-b")
    try:
        bench.fleet.wait_ready([a, b])
        seconds = [recovery_trial(bench, a, b, hold_s, n) for n in range(trials)]
    finally:
        bench.fleet.stop([a, b])
    if label == "LockWorker":
        note = "the worker's parent releases the dead horse's lease"
    else:
        note = f"the lease lapses within its ttl ({rq_jobs.TTL_S:g} s)"
    return Recovery(seconds, note)


# -- reporting -----------------------------------------------------------------------------------


def paired(rounds: Rounds, plain: Rounds) -> float:
    """The median over the rounds of ``rounds``' rate / ``plain``'s rate in the same round."""
    return statistics.median(
        x.jobs_per_s / y.jobs_per_s for x, y in zip(rounds.all, plain.all, strict=True)
    )


def print_throughput(rates: dict[str, dict[str, Rounds]], counts: dict[str, int]) -> None:
    rounds = len(next(iter(rates.values()))["plain"].all)
    section(
        f"1. Throughput: no-op jobs (one INCR), enqueue -> all done, one worker per variant; "
        f"best of {rounds} round(s)"
    )
    print(
        f"  {'worker':<15}{'variant':<15}{'class':<13}{'jobs':>5}{'jobs/s':>8}{'vs plain':>10}"
        f"{'paired':>8}{'ms/job extra':>14}{'CPU ms/job':>12}{'worker':>8}{'redis':>7}"
        f"{'client':>8}{'faults':>8}  all rounds (jobs/s)"
    )
    for kind, variants in rates.items():
        plain = variants["plain"]
        for variant, r in variants.items():
            best = r.best
            extra = (1 / best.jobs_per_s - 1 / plain.best.jobs_per_s) * 1000
            cls = KINDS[kind][variant].rsplit(".", 1)[1]
            each = " ".join(f"{x.jobs_per_s:.0f}" for x in r.all)
            print(
                f"  {kind:<15}{variant:<15}{cls:<13}{counts[kind]:>5}{best.jobs_per_s:>8.0f}"
                f"{best.jobs_per_s / plain.best.jobs_per_s:>9.2f}x"
                f"{paired(r, plain):>7.2f}x{extra:>+14.3f}{best.cpu_ms:>12.2f}"
                f"{best.worker_cpu_ms:>8.2f}{best.redis_cpu_ms:>7.2f}{best.client_cpu_ms:>8.2f}"
                f"{best.faults:>8.0f}  {each}"
            )
    for kind, variants in rates.items():
        locked = variants["locked"]
        for name in ("floor", "floor_renewer"):
            floor = variants[name]
            print(
                f"  {kind}: locked / {name} {locked.best.jobs_per_s / floor.best.jobs_per_s:.2f}x "
                f"(best rounds), {paired(locked, floor):.2f}x (paired); CPU per job "
                f"{locked.best.cpu_ms - floor.best.cpu_ms:+.2f} ms"
            )
    print(
        "  vs plain: best round / plain's best round; paired: median over the rounds of the rate "
        "/ plain's rate in the same round;\n  ms/job extra: 1/rate - 1/plain rate; CPU: user+sys "
        "per job of the best round, summed over the worker (parent + horses), redis-server and "
        "this enqueuing process;\n  floor: no lock, one PING before the body and one after "
        "it where the job runs; floor_renewer: the same, and a thread started where the job "
        "runs (once per process: per job in a forked horse), as a lease's renewer is;\n  "
        "faults: minor page faults of the worker (parent + horses) per job: a forked horse "
        "copies each page of its parent's memory it writes to, "
        "Python objects' reference counts included"
    )


def print_recovery(recovery: dict[str, Recovery], hold_s: float) -> None:
    section(
        f"2. Recovery: a locked job (ttl {rq_jobs.TTL_S:g} s) runs {hold_s:g} s, its horse is "
        "SIGKILLed -> seconds until a copy waiting on a second worker starts"
    )
    print(f"  {'worker class':<14}{'median':>8}{'max':>8}{'n':>3}  note")
    for label, r in recovery.items():
        print(f"  {label:<14}{r.median:>8.3f}{r.worst:>8.3f}{len(r.trials):>3}  {r.note}")
        print(f"  {'':<14}trials: {' '.join(f'{s:.3f}' for s in r.trials)} s")
    print("  the copy waited in the lock's line, and did not run, in every trial until the kill")


def to_json(rates: dict[str, dict[str, Rounds]], recovery: dict[str, Recovery]) -> dict[str, Any]:
    return {
        "jobs_per_s": {
            kind: {v: round(r.best.jobs_per_s, 1) for v, r in variants.items()}
            for kind, variants in rates.items()
        },
        "jobs_per_s_median": {
            kind: {v: round(r.median, 1) for v, r in variants.items()}
            for kind, variants in rates.items()
        },
        "ratio": {
            kind: {
                "best": round(v["locked"].best.jobs_per_s / v["plain"].best.jobs_per_s, 3),
                "paired_median": round(paired(v["locked"], v["plain"]), 3),
                "per_round": [
                    round(x.jobs_per_s / y.jobs_per_s, 3)
                    for x, y in zip(v["locked"].all, v["plain"].all, strict=True)
                ],
            }
            for kind, v in rates.items()
        },
        "ratio_to_floor": {
            kind: {
                "best": round(v["locked"].best.jobs_per_s / v["floor"].best.jobs_per_s, 3),
                "paired_median": round(paired(v["locked"], v["floor"]), 3),
            }
            for kind, v in rates.items()
        },
        "ratio_to_floor_renewer": {
            kind: {
                "best": round(v["locked"].best.jobs_per_s / v["floor_renewer"].best.jobs_per_s, 3),
                "paired_median": round(paired(v["locked"], v["floor_renewer"]), 3),
            }
            for kind, v in rates.items()
        },
        "cpu_ms_per_job": {
            kind: {v: round(r.best.cpu_ms, 3) for v, r in variants.items()}
            for kind, variants in rates.items()
        },
        "faults_per_job": {
            kind: {v: round(r.best.faults) for v, r in variants.items()}
            for kind, variants in rates.items()
        },
        "recovery_s": {label: round(r.median, 3) for label, r in recovery.items()},
        "recovery_s_max": {label: round(r.worst, 3) for label, r in recovery.items()},
        "recovery_trials_s": {
            label: [round(s, 3) for s in r.trials] for label, r in recovery.items()
        },
        "ttl": rq_jobs.TTL_S,
    }


# -- command line --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    counts: dict[str, int]  # jobs per round, per worker kind
    rounds: int
    hold_s: float
    trials: dict[str, int]  # kills per worker class


FULL = Settings(
    counts={"SimpleWorker": 700, "Worker (fork)": 200},
    rounds=7,
    hold_s=rq_jobs.TTL_S + 1,
    trials={"LockWorker": 3, "Worker": 2},
)
QUICK = Settings(
    counts={"SimpleWorker": 300, "Worker (fork)": 100},
    rounds=2,
    hold_s=1.0,
    trials={"LockWorker": 1, "Worker": 1},
)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that kill the workers


@contextlib.contextmanager
def _log_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="rqbench-") as logs:
        yield Path(logs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = base_parser(__doc__ or "", "fewer jobs, rounds and kills (about 30 s)")
    add_load_option(parser, "during the throughput rounds")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    began = time.perf_counter()
    run = f"{os.getpid()}-{os.urandom(3).hex()}"
    given = args.url or os.environ.get("REDIS_URL")
    with redis_target(given) as (url, origin), _log_dir() as logs:
        client = redis.Redis.from_url(url)
        try:
            with Fleet(url, run, logs, client) as fleet:
                bench = Bench(url, run, client, fleet)
                version = client.info("server")["redis_version"]
                print(
                    f"RQ overhead benchmark: Redis {version} at {url} ({origin}); Python "
                    f"{sys.version.split()[0]}, RQ {rq.__version__}, celery_redislock "
                    f"{celery_redislock.__version__}, {os.cpu_count()} CPU(s), load average "
                    f"{os.getloadavg()[0]:.2f}"
                    + ("; --quick" if args.quick else "")
                    + (f"; {args.load} CPU-burning process(es)" if args.load else ""),
                    flush=True,
                )
                with Load(args.load):
                    rates = {
                        kind: run_throughput(bench, kind, settings.rounds, settings.counts[kind])
                        for kind in KINDS
                    }
                print_throughput(rates, settings.counts)
                recovery = {
                    label: run_recovery(bench, label, settings.hold_s, settings.trials[label])
                    for label in RECOVERY_CLASSES
                }
                print_recovery(recovery, settings.hold_s)
        finally:
            if given:
                delete_keys(client, run)
            client.close()
    fork = rates["Worker (fork)"]
    # (#26: 0.95x plain RQ; beside it, whether the floor a horse-renewed lease stands on allows it)
    ratios = (
        ("LockWorker + lock / plain Worker", "locked", "plain"),
        ("the floor with a renewer / plain Worker", "floor_renewer", "plain"),
        ("LockWorker + lock / floor with a renewer", "locked", "floor_renewer"),
    )
    checks = [
        *(
            Target(
                f"jobs/s, forking worker: {label}",
                fork[top].best.jobs_per_s / fork[under].best.jobs_per_s,
                0.95,
                at_least=True,
                unit="x",
            )
            for label, top, under in ratios
        ),
        Target(
            "recovery after a horse kill (median), LockWorker",
            recovery["LockWorker"].median,
            1.0,
            unit=" s",
        ),
        Target(
            f"recovery after a horse kill (max), plain Worker, ttl {rq_jobs.TTL_S:g} s",
            recovery["Worker"].worst,
            rq_jobs.TTL_S + 1.5,
            unit=" s",
        ),
    ]
    print_targets(checks, began)
    if args.json:
        args.json.write_text(json.dumps(to_json(rates, recovery), indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
