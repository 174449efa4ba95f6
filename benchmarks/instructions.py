"""Instructions per call, counted by valgrind: what the process running a locked task executes
for its lock, beside floors. A count does not move with the machine's load (the rates of the
other benchmarks do, by 10-30% on a shared machine), so a change in the per-task path shows
as a change of the count, however busy the machine is.

Each variant runs in a subprocess under ``valgrind --tool=callgrind`` twice, with N and 6N
calls; the difference of the two totals divided by 5N is what one call executes, in this
process (Python, redis-py, hiredis), without start-up, imports and warm-up. What Redis and the
kernel do is not counted.

1. **One Celery task delivery in a pool child**, as the worker's tracer runs it: the request
   pushed, ``before_start``, the task called (its ``__call__`` if its class has its own, else
   its body: nothing), ``task_postrun`` sent:
   * ``plain``: a task without any lock (the base: Celery's own share of the delivery);
   * ``floor``: no lock, one ``PING`` before the body and one after it (the two round trips
     a lock held in the worker cannot do without; ``celery_overhead.py``'s floor);
   * ``floor_fenced``: no lock of ours, the same two round trips each a fenced lock's least
     script (``SET NX PX`` and an ``INCR``, then a compare-and-delete; ``celery_overhead.py``'s
     fenced floor);
   * ``celery_redislock``: ``lock=`` on a key made from the arguments (a lock per call), the
     settings read once as in a worker; ``celery_redislock_lean``: the same in a namespace
     whose layout is ``lean``;
   * ``unique_lean``: the same task also ``unique="until_finished"`` (keyed as its lock),
     each delivery holding its queued claim (made by the parent beforehand, as a publish
     would): the claim ends in the acquire's call; ``unique_lean_apart``: the same with the
     claim's end in a call of its own, as before this release.
2. **One uncontended acquire+release pair** on one name (``lock_core.py``'s locks): ours,
   ours in a namespace whose layout is ``lean`` (``core/layout.py``), redis-py's ``Lock``,
   python-redis-lock, the fenced floor (``SET NX PX`` and an ``INCR`` in
   one script, then a compare-and-delete script) and two ``PING`` s.
3. **What Redis executes per contended acquisition**, counted in ``redis-server`` (started here
   under callgrind, ``--hz 1``; the client is not counted): a holder holds the lock, a waiter's
   blocking acquire tries, fails and blocks on its ``BLPOP``, the holder releases, the waiter
   takes the lock and releases it. Every command of the protocol is sent, in the order two
   processes send it (the wake-up is a push, so the ``BLPOP`` finds it whenever it comes).
   Ours, fair and not, python-redis-lock and ``lock_core.py``'s waiting floor (three minimal
   scripts and a ``BLPOP``, as ours): ``lock_core.py``'s Redis CPU per contended acquisition,
   without the noise. And ours once more with each part's helpers defined twice per call: the
   difference is what defining them costs Redis in every call, the most that helpers made once
   (Redis 7 functions) could save.

Needs ``valgrind`` (Debian: ``apt-get install valgrind``). Run from the repository root::

    python benchmarks/instructions.py [--json out.json] [--quick] [--url redis://...]

A full run takes about 6 minutes, ``--quick`` (N = 100 instead of 200, 30 contended
acquisitions instead of 60) about 4.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import base_parser, delete_keys, redis_target, section  # noqa: E402

CELERY = (
    "plain",
    "floor",
    "floor_fenced",
    "celery_redislock",
    "celery_redislock_lean",
    "unique_lean",
    "unique_lean_apart",
)
# A unique task's deliveries, each holding its claim (made by the parent beforehand).
UNIQUE = ("unique_lean", "unique_lean_apart")
PAIRS = (
    "celery_redislock",
    "celery_redislock_lean",
    "redis_py",
    "python_redis_lock",
    "fenced_floor",
    "ping_x2",
)
# Ours with every part's helpers defined a second time in each call (see _helpers_defined_twice).
HELPERS_TWICE = "celery_redislock_helpers_twice"
CONTENDED = (
    "celery_redislock",
    "celery_redislock_lean",
    "celery_redislock_fair",
    "python_redis_lock",
    "waiting_floor",
    HELPERS_TWICE,
)
RUN = os.environ.get("INSTR_RUN") or uuid.uuid4().hex[:8]  # (in every key; the children's too)


# -- the calls, run in the child -----------------------------------------------------------------


def _celery_call(variant: str, url: str, ids: str = "") -> Callable[[int], None]:
    """One delivery of a no-op task of ``variant``, as a pool child runs it (``ids``: the task
    ids' prefix, for a unique variant, whose claims the parent made)."""
    from celery import Celery
    from celery.app.trace import task_has_custom
    from celery.signals import task_postrun
    from celery_apps import WorkerFencedLease, WorkerRoundTrips

    import celery_redislock
    from celery_redislock.integrations.celery import settings

    app = Celery(f"instr_{variant}", broker=url, backend=url, set_as_current=False)
    options: dict[str, Any] = {}
    if variant in ("celery_redislock", "celery_redislock_lean", *UNIQUE):
        app.conf.redislock_url = url
        celery_redislock.install(app)
        options = {"lock": {"key": "instr:{run}:{i}"}}
        if variant != "celery_redislock":
            import redis

            from celery_redislock.core import layout

            app.conf.redislock_namespace = namespace = _namespace(variant)
            layout.set_layout(redis.Redis.from_url(url), namespace, "lean")
        if variant in UNIQUE:
            options["unique"] = "until_finished"
        if variant == "unique_lean_apart":  # as before the claim ended in the acquire
            from celery_redislock.core.server_store import ServerStore

            ServerStore.gives_up_claims = lambda self, lock: False  # type: ignore[method-assign]
    elif variant == "floor":
        options = {"base": WorkerRoundTrips, "floor_url": url}
    elif variant == "floor_fenced":
        options = {"base": WorkerFencedLease, "floor_url": url}

    @app.task(name="instr.noop", shared=False, **options)  # type: ignore[untyped-decorator]
    def noop(run: str, i: int) -> None:
        return None

    app.finalize()
    task = app.tasks["instr.noop"]
    # What the tracer calls: the task if its class has its own __call__, else its body.
    fun = task if task_has_custom(task, "__call__") else task.run
    settings.freeze()  # as a worker does as it starts (worker_init): settings read once

    def call(i: int) -> None:
        task_id = f"{ids}-{i}" if ids else uuid.uuid4().hex
        args = (RUN, i)
        task.push_request(
            id=task_id,
            args=args,
            kwargs={},
            delivery_info={},
            headers={},
            retries=0,
            called_directly=False,  # (the tracer's request)
        )
        try:
            task.before_start(task_id, args, {})
            fun(*args)
            task_postrun.send(
                sender=task, task_id=task_id, task=task, args=args, kwargs={}, state="SUCCESS"
            )
        finally:
            task.pop_request()

    return call


def _pair_call(variant: str, url: str) -> Callable[[int], None]:
    """One uncontended acquire+release pair of ``lock_core.py``'s lock ``variant``."""
    import redis
    from lock_core import LOCKS

    acquire = LOCKS[variant](redis.Redis.from_url(url), f"instr:{RUN}:{variant}")

    def call(i: int) -> None:
        acquire()()

    return call


def _namespace(variant: str) -> str:
    return f"instr-unique-{RUN}" if variant in UNIQUE else f"instr-lean-{RUN}"


def _claim_all(variant: str, url: str, calls: int) -> None:
    """The claims the deliveries of a ``calls`` run hold, as their publish made them."""
    import redis

    from celery_redislock.core.claims import ClaimKind, claim

    with redis.Redis.from_url(url) as client:
        for i in range(calls):
            claim(
                client,
                _namespace(variant),
                f"instr:{RUN}:{i}",
                task_id=f"{RUN}-{calls}-{i}",
                lifetime=600,
                kind=ClaimKind.NEW,
                running_counts=True,
            )


def child(kind: str, variant: str, url: str, calls: int) -> None:
    if kind == "celery":
        call = _celery_call(variant, url, f"{RUN}-{calls}" if variant in UNIQUE else "")
    else:
        call = _pair_call(variant, url)
    for i in range(calls):
        call(i)


# -- counting, in the parent ---------------------------------------------------------------------


def count(kind: str, variant: str, url: str, calls: int) -> int:
    """Instructions of a child process running ``calls`` calls, start to end."""
    if variant in UNIQUE:
        _claim_all(variant, url, calls)
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--child",
        f"{kind}:{variant}",
        "--url",
        url,
        "--calls",
        str(calls),
    ]
    env = {**os.environ, "INSTR_RUN": RUN}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{kind}:{variant}: {done.stderr[-2000:]}")
    return int(found.group(1))


def per_call(kind: str, variant: str, url: str, n: int) -> float:
    return (count(kind, variant, url, 6 * n) - count(kind, variant, url, n)) / (5 * n)


def measure(url: str, n: int) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {"celery": {}, "pairs": {}}
    for kind, variants in (("celery", CELERY), ("pairs", PAIRS)):
        for variant in variants:
            began = time.perf_counter()
            results[kind][variant] = per_call(kind, variant, url, n)
            took = time.perf_counter() - began
            print(f"  {kind}: {variant:<20}{results[kind][variant]:>12,.0f}  ({took:.0f} s)")
    return results


# -- 3. in redis-server: a contended acquisition -------------------------------------------------


def _contended(variant: str, url: str, acquisitions: int) -> None:
    """``acquisitions`` contended acquisitions of lock ``variant``, driven from this process: a
    holder's client and a waiter's, the waiter's acquire in a thread, released once the waiter
    is about to block (its first try refused)."""
    import threading

    import redis
    from lock_core import LOCKS

    name = f"instr:{RUN}:contended:{variant}"
    holder = LOCKS[variant](redis.Redis.from_url(url), name)
    waiter_client = redis.Redis.from_url(url)
    blocking = threading.Event()
    blpop = waiter_client.blpop

    def announced_blpop(*args: Any, **kwargs: Any) -> Any:
        blocking.set()
        return blpop(*args, **kwargs)

    waiter_client.blpop = announced_blpop  # type: ignore[method-assign]
    waiter = LOCKS[variant](waiter_client, name)
    for _ in range(acquisitions):
        release_holder = holder()
        blocking.clear()
        released: list[Callable[[], None]] = []
        thread = threading.Thread(target=lambda out=released: out.append(waiter()))
        thread.start()
        if not blocking.wait(60):
            raise RuntimeError(f"{variant}: the waiter did not block")
        release_holder()
        thread.join(60)
        if not released:
            raise RuntimeError(f"{variant}: the waiter did not get the lock")
        released[0]()


def redis_count(variant: str, acquisitions: int) -> int:
    """Instructions a fresh redis-server executes, start to shutdown, while this process makes
    ``acquisitions`` contended acquisitions of ``variant`` on it."""
    import tempfile

    import redis

    from celery_redislock.contrib.redis_server import RedisServer

    plan = RedisServer()  # (not started: its binary and a free port)
    port = plan.port
    out = Path(tempfile.gettempdir()) / f"instr-redis-{RUN}-{port}.out"
    server = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            plan.binary,
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--hz",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        for _ in range(600):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"redis-server under valgrind did not answer on port {port}")
        _contended(variant, url, acquisitions)
        with contextlib.suppress(redis.RedisError):  # (it closes the connection as it answers)
            client.shutdown(nosave=True)
        server.wait(120)
        found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
        if found is None:
            raise RuntimeError(f"{variant}: no totals in {out}")
        return int(found.group(1))
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        out.unlink(missing_ok=True)


def redis_server_version() -> str:
    from celery_redislock.contrib.redis_server import RedisServer

    server = RedisServer()
    return f"{server.binary} v{server.version}"


@contextlib.contextmanager
def _helpers_defined_twice() -> Iterator[None]:
    """Our scripts as they are, but each part's text comes a second time right after it, in a
    ``do`` block: its helpers' closures are made once more per call and dropped at ``end``
    (never called). What that adds to a count is what defining the parts' helpers costs Redis
    in each call: the most that helpers made once (Redis 7 functions, made as their library
    loads) could save, the rest of the scripts' logic kept."""
    from redis.commands.core import Script

    from celery_redislock.core import scripts

    real_source, real_scripts = scripts._source, dict(scripts._SCRIPTS)

    def source(file: str) -> bytes:
        text = real_source(file)
        if not file.startswith("_"):
            return text
        again = scripts._INCLUDE.sub(b"", text).rstrip(b"\n")  # (its includes are in above)
        return text.rstrip(b"\n") + b"\ndo\n" + again + b"\nend\n"

    scripts._source = source  # type: ignore[assignment]
    try:
        # (Calls look their script up by name each time: replacing the entries is enough.)
        scripts._SCRIPTS.update(
            {name: Script(None, scripts.assembled(name)) for name in scripts.NAMES}
        )  # type: ignore[arg-type]
        yield
    finally:
        scripts._source = real_source  # type: ignore[assignment]
        scripts._SCRIPTS.update(real_scripts)


def redis_per_acquisition(variant: str, n: int) -> float:
    if variant == HELPERS_TWICE:
        with _helpers_defined_twice():
            return redis_per_acquisition("celery_redislock", n)
    return (redis_count(variant, 6 * n) - redis_count(variant, n)) / (5 * n)


def report(results: dict[str, dict[str, float]]) -> None:
    celery = results["celery"]
    section("1. One Celery task delivery in a pool child: instructions (this process)")
    base = celery["plain"]
    print(f"  {'variant':<20}{'per delivery':>14}{'above plain':>14}{'vs floor':>10}")
    for variant in CELERY:
        above = celery[variant] - base
        ratio = above / (celery["floor"] - base) if variant != "plain" else 0.0
        print(f"  {variant:<20}{celery[variant]:>14,.0f}{above:>+14,.0f}{ratio:>9.2f}x")
    print(
        "  vs floor: the instructions above plain, to the floor's (two PINGs); floor_fenced: "
        "a fenced lease taken and given back (two small scripts, celery_overhead.py's)"
    )
    pairs = results["pairs"]
    section("2. One uncontended acquire+release pair: instructions (this process)")
    print(f"  {'lock':<20}{'per pair':>14}{'vs fenced floor':>17}")
    for variant in PAIRS:
        ratio = pairs[variant] / pairs["fenced_floor"]
        print(f"  {variant:<20}{pairs[variant]:>14,.0f}{ratio:>16.2f}x")
    contended = results.get("contended_in_redis")
    if contended:
        section("3. One contended acquisition: instructions in redis-server")
        print(
            f"  {'lock':<32}{'per acquisition':>16}{'vs waiting floor':>18}"
            f"{'vs python-redis-lock':>22}"
        )
        for variant in CONTENDED:
            floor = contended[variant] / contended["waiting_floor"]
            peer = contended[variant] / contended["python_redis_lock"]
            print(f"  {variant:<32}{contended[variant]:>16,.0f}{floor:>17.2f}x{peer:>21.2f}x")
        ours = contended["celery_redislock"]
        helpers = contended[HELPERS_TWICE] - ours
        print(
            f"  defining the parts' helpers: {helpers:,.0f} per acquisition, "
            f"{helpers / ours:.1%} of ours; ours without it would be "
            f"{(ours - helpers) / contended['python_redis_lock']:.2f}x python-redis-lock"
        )


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and "--child" in sys.argv:
        child_args = argparse.ArgumentParser()
        child_args.add_argument("--child")
        child_args.add_argument("--url")
        child_args.add_argument("--calls", type=int)
        args = child_args.parse_args()
        kind, variant = args.child.split(":")
        child(kind, variant, args.url, args.calls)
        return 0
    parser = base_parser(__doc__ or "", "N = 100 calls instead of 200 (about 2.5 minutes)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    n = 100 if args.quick else 200
    with redis_target(args.url or os.environ.get("REDIS_URL")) as (url, origin):
        print(
            f"Instructions per call (valgrind --tool=callgrind, {6 * n} minus {n} calls); "
            f"Redis at {url} ({origin}); Python {sys.version.split()[0]}",
            flush=True,
        )
        results = measure(url, n)
        contended = n // 100 * 30
        results["contended_in_redis"] = {}
        print(
            f"Contended acquisitions counted in {redis_server_version()} under callgrind "
            f"({6 * contended} minus {contended})",
            flush=True,
        )
        for variant in CONTENDED:
            began = time.perf_counter()
            results["contended_in_redis"][variant] = redis_per_acquisition(variant, contended)
            took = time.perf_counter() - began
            print(
                f"  contended, in redis-server: {variant:<22}"
                f"{results['contended_in_redis'][variant]:>12,.0f}  ({took:.0f} s)",
                flush=True,
            )
        if args.url or os.environ.get("REDIS_URL"):
            import redis

            with redis.Redis.from_url(url) as client:
                delete_keys(client, RUN)
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
