"""Rate-limit starts benchmark: does a task with ``rate=`` start at the rate it was given, on
real Celery workers?

One run on one Redis (broker and limits; a throwaway ``redis-server`` unless ``--url`` or
``REDIS_URL`` names one), two real Celery workers (``-P solo`` each, started here; this module
is their app). A case floods ``--calls`` calls (200; 100 with ``--quick``) of one task as fast as
this process publishes them, and the task's body notes its start (``time.time()``) and its slot
in Redis. The cases, each on a limit of its own (``key: bench:<run>-<case>``):

* ``20/s``: ``rate={"rate": "20/s", "key": ...}``;
* ``20/s, burst 10``: ``"burst": 10`` as well;
* ``20/s, cost 2``: ``"cost": 2`` (every call costs two units: 10 starts a second).

Shown per case: the rate configured (units/s), the most starts (and units: starts times the
cost) that any 1-second window of the run held (a window opened at every start), the mean
over the run (starts per second, from the first start to the last), each against the
configured rate; the run's time, from the first publish to the last start, against the ideal
``calls * cost / limit``; how many calls were published again for their slot (the
``lock_conflict`` signals with ``action="rate"``, and the starts of such copies); and how late
the starts were after their slots (median and max).

Tasks reserve over the period widened by a slack of 5% of it (0.1 s to 1 s: ``20/s`` runs as 20
per 1.1 s), so the run takes about 10% longer than the ideal by design; a burst lets ``burst``
units start at once, so a 1-second window may hold up to ``burst + limit / 1.1`` units.

Run from the repository root::

    python benchmarks/rate_starts.py [--calls N] [--quick] [--json PATH] [--url redis://...]
        [--limit N] [--case plain|burst|cost] [--pool solo|prefork] [--load N]

(``--limit``: units a second instead of 20; ``--pool prefork``: two processes per worker;
``--load N``: N CPU burners during each case.)

A full run takes about 70 s on 2 cores (``--quick``: about 40 s). Against ``--url`` the keys it
created (each contains the run id) are deleted at the end.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from celery import Celery

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import Load, add_load_option, base_parser, delete_keys, redis_target, section  # noqa: E402

from celery_redislock import current_rate, install, lock_conflict  # noqa: E402

URL = os.environ.get("RATE_STARTS_URL", "redis://127.0.0.1:6379/0")
RUN = os.environ.get("RATE_STARTS_RUN", "none")
WORKERS = 2
LIMIT = int(os.environ.get("RATE_STARTS_LIMIT", "20"))  # units a second, every case (--limit)
RATE_HEADER = "redislock_rate"  # a copy published again for its slot carries it


@dataclass(frozen=True)
class Case:
    task: str
    label: str
    burst: int
    cost: int


CASES = (
    Case("ratebench.plain", f"{LIMIT}/s", 1, 1),
    Case("ratebench.burst", f"{LIMIT}/s, burst 10", 10, 1),
    Case("ratebench.cost", f"{LIMIT}/s, cost 2", 1, 2),
)


def starts_key(run: str) -> str:
    return f"ratestarts:{run}:starts"


def republished_key(run: str) -> str:
    return f"ratestarts:{run}:republished"


def queue_of(run: str) -> str:
    return f"ratestarts-{run}"


def make_app(url: str, run: str) -> Celery:
    """The benchmark's app on ``url`` and its three tasks (the workers' and the producer's)."""
    app = install(Celery("rate_starts_bench", broker=url, set_as_current=False))
    app.conf.update(
        redislock_url=url,
        task_ignore_result=True,
        task_default_queue=queue_of(run),
        broker_connection_retry_on_startup=True,
    )
    marks = redis.Redis.from_url(url)

    def started(task: Any, case: str) -> None:
        now = time.time()
        slot = current_rate()
        came_back = RATE_HEADER in (task.request.headers or {})
        note = [now, slot.reservation.slot_ms if slot else None, came_back]
        marks.rpush(starts_key(case), json.dumps(note))

    for case in CASES:
        options: dict[str, Any] = {"rate": f"{LIMIT}/s", "key": "bench:{case}"}
        if case.burst != 1:
            options["burst"] = case.burst
        if case.cost != 1:
            options["cost"] = case.cost

        def body(self: Any, case: str, i: int) -> None:
            started(self, case)

        app.task(name=case.task, bind=True, shared=False, rate=options)(body)
    return app


app = make_app(URL, RUN)  # the workers' (celery -A rate_starts): URL and run from the environment
_COUNTS = redis.Redis.from_url(URL)  # the workers' (connects on first use)


@lock_conflict.connect
def _count_republished(sender: Any = None, lock: str = "", action: str = "", **_: Any) -> None:
    """In the workers: a call published again for its slot (its limit is ``bench:<case>``)."""
    if action == "rate" and lock.startswith("bench:"):
        _COUNTS.incr(republished_key(lock.removeprefix("bench:")))


# -- the workers ----------------------------------------------------------------------------------


class Workers:
    """``WORKERS`` Celery workers (``-P solo``), each in its own process group."""

    def __init__(self, url: str, run: str, logdir: Path, pool: str = "solo") -> None:
        env = {**os.environ, "RATE_STARTS_URL": url, "RATE_STARTS_RUN": run}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
        self.logs = [logdir / f"worker{n}.log" for n in range(WORKERS)]
        self.processes: list[subprocess.Popen[bytes]] = []
        for n, log in enumerate(self.logs):
            with log.open("wb") as out:
                self.processes.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "celery",
                            "-A",
                            "rate_starts",
                            "worker",
                            "-P",
                            pool,
                            *(["-c", "2"] if pool == "prefork" else []),
                            "-n",
                            f"ratestarts{n}-{run}@%h",
                            "--without-heartbeat",
                            "--without-gossip",
                            "--without-mingle",
                            "-Q",
                            queue_of(run),
                            "-l",
                            "WARNING",
                        ],
                        cwd=HERE,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def wait_up(self, producer: Celery, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.processes):
                break
            if len(producer.control.ping(timeout=1.0) or []) >= WORKERS:
                return
        raise SystemExit(f"the workers did not start; see {', '.join(map(str, self.logs))}")

    def close(self) -> None:
        for p in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


# -- one case -------------------------------------------------------------------------------------


def most_in_window(times: list[float], weight: int, seconds: float = 1.0) -> int:
    """The most units any window of ``seconds`` held (a window opened at every start)."""
    most, j = 0, 0
    for i, t in enumerate(times):
        while j < len(times) and times[j] < t + seconds:
            j += 1
        most = max(most, (j - i) * weight)
    return most


def measure(url: str, producer: Celery, run: str, case: Case, calls: int) -> dict[str, Any]:
    marks = redis.Redis.from_url(url)
    name = f"{run}-{case.task.split('.')[-1]}"
    task = producer.tasks[case.task]
    ideal = calls * case.cost / LIMIT
    began = time.time()
    for i in range(calls):
        task.apply_async((name, i))
    published = time.time() - began
    deadline = time.monotonic() + 3 * ideal + 60
    while int(marks.llen(starts_key(name))) < calls:
        if time.monotonic() > deadline:
            raise SystemExit(
                f"{case.label}: {marks.llen(starts_key(name))} of {calls} calls started in time"
            )
        time.sleep(0.05)
    time.sleep(0.5)  # a start beyond the calls (there must be none) would show now
    notes = [json.loads(n) for n in marks.lrange(starts_key(name), 0, -1)]
    times = sorted(n[0] for n in notes)
    late_ms = sorted(max(0.0, n[0] * 1000 - n[1]) for n in notes if n[1] is not None)
    run_s = times[-1] - began
    spread = times[-1] - times[0]
    most = most_in_window(times, 1)
    marks.close()
    return {
        "calls": calls,
        "starts": len(notes),
        "configured_units_per_s": LIMIT,
        "configured_starts_per_s": LIMIT / case.cost,
        "max_starts_in_1s": most,
        "max_units_in_1s": most * case.cost,
        "mean_starts_per_s": (len(times) - 1) / spread if spread else float("nan"),
        "run_s": run_s,
        "publish_s": published,
        "ideal_s": ideal,
        "republished": int(marks.get(republished_key(name)) or 0),
        "started_from_copy": sum(1 for n in notes if n[2]),
        "late_ms_median": statistics.median(late_ms) if late_ms else float("nan"),
        "late_ms_max": late_ms[-1] if late_ms else float("nan"),
        "load_average_after": os.getloadavg()[0],
    }


def report(results: dict[str, Any]) -> None:
    section("Starts against the configured rate (units/s; a start costs `cost` units)")
    print(
        f"  {'case':<20}{'rate':>6}{'max in 1 s':>16}{'mean/s':>14}{'run time':>18}"
        f"{'published again':>17}{'late after slot':>18}"
    )
    print(
        f"  {'':<20}{'':>6}{'starts (units)':>16}{'starts':>14}{'s / ideal':>18}"
        f"{'signals / starts':>17}{'median / max ms':>18}"
    )
    for label, r in results.items():
        per_s = r["configured_starts_per_s"]
        most = (
            f"{r['max_starts_in_1s']} ({r['max_units_in_1s']}) x{r['max_units_in_1s'] / LIMIT:.2f}"
        )
        mean = f"{r['mean_starts_per_s']:.1f} x{r['mean_starts_per_s'] / per_s:.2f}"
        took = f"{r['run_s']:.1f}/{r['ideal_s']:.1f} x{r['run_s'] / r['ideal_s']:.2f}"
        again = f"{r['republished']} / {r['started_from_copy']}"
        late = f"{r['late_ms_median']:.0f} / {r['late_ms_max']:.0f}"
        print(f"  {label:<20}{LIMIT:>6}{most:>16}{mean:>14}{took:>18}{again:>17}{late:>18}")
    print(
        "  max in 1 s: the most starts (units) any 1-second window held, x the configured "
        "units/s;\n  mean/s: starts per second from the first start to the last, x the "
        "configured starts/s (rate / cost);\n  run time: first publish to last start, against "
        "calls * cost / rate"
    )


def main() -> None:
    global LIMIT, CASES  # (the workers read the limit from the environment)
    parser = base_parser(__doc__ or "", "100 calls per case instead of 200")
    parser.add_argument("--calls", type=int, default=200, help="calls per case (200)")
    add_load_option(parser)
    parser.add_argument(
        "--pool",
        choices=("solo", "prefork"),
        default="solo",
        help="the workers' pool (solo; prefork: 2 processes each)",
    )
    parser.add_argument("--limit", type=int, default=LIMIT, help="units a second (20)")
    parser.add_argument(
        "--case", choices=[c.task.split(".")[-1] for c in CASES], help="this case alone"
    )
    args = parser.parse_args()
    LIMIT = args.limit
    os.environ["RATE_STARTS_LIMIT"] = str(LIMIT)
    CASES = tuple(
        Case(c.task, c.label.replace("20/s", f"{LIMIT}/s"), c.burst, c.cost)
        for c in CASES
        if args.case in (None, c.task.split(".")[-1])
    )
    calls = 100 if args.quick and args.calls == 200 else args.calls
    run = os.urandom(4).hex()
    began = time.perf_counter()
    with (
        redis_target(args.url or os.environ.get("REDIS_URL")) as (url, origin),
        tempfile.TemporaryDirectory(prefix="rate-starts-") as logdir,
    ):
        client = redis.Redis.from_url(url)
        print(
            f"Rate starts: Redis {client.info('server')['redis_version']} at {url} ({origin}); "
            f"{WORKERS} workers (-P {args.pool}); {calls} calls per case; {os.cpu_count()} CPU(s), "
            f"load average {os.getloadavg()[0]:.2f}; run {run}"
            + (f"; {args.load} CPU-burning process(es) during each case" if args.load else ""),
            flush=True,
        )
        producer = make_app(url, run)
        workers = Workers(url, run, Path(logdir), args.pool)
        results: dict[str, Any] = {}
        load = os.getloadavg()[0]
        try:
            workers.wait_up(producer)
            for case in CASES:
                with Load(args.load):
                    results[case.label] = measure(url, producer, run, case, calls)
                r = results[case.label]
                print(
                    f"  {case.label}: {r['starts']} starts in {r['run_s']:.1f} s, at most "
                    f"{r['max_starts_in_1s']} in 1 s",
                    flush=True,
                )
        finally:
            workers.close()
            delete_keys(client, run)
            client.close()
    report(results)
    results["load_average"] = [load, os.getloadavg()[0]]
    took = time.perf_counter() - began
    print(f"\nload average {os.getloadavg()[0]:.2f}; total runtime {took:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
