"""Soak under chaos: locked tasks on two real workers for N minutes while processes are killed
and lock replies are lost; then every task is accounted for, and every lock checked.

Topology (all on 127.0.0.1, every server and worker started here and stopped at the end):

* the broker (``--broker``): a throwaway ``rabbitmq-server`` (``tests/rabbit.py``; the default
  when Debian's package is installed), or ``main`` (``--broker redis``);
* ``main``: one ``redis-server`` for the result backend and the locks (and the Redis broker);
* ``ledger``: a second ``redis-server`` that the chaos never touches, where every run notes its
  start before its body and its end after it, stamped with the ledger's clock (``TIME``), and
  where the chaos notes each kill (see ``benchmarks/soak/soakapp.py``);
* a fault proxy (``tests/faultproxy.py``) in this process, between the workers' lock client and
  ``main``: the broker and the results are reached directly, and so is this process's producer;
* two ``celery worker`` processes (prefork, ``-c 2``, ``acks_late`` with
  ``task_reject_on_worker_lost``, lease ttl 15 s, lock backend errors retried; with the Redis
  broker, visibility timeout 10 s), each in a process group of its own.

For ``--minutes`` a producer publishes a steady mix: an exclusive lock per key over four keys,
a cap of two, readers and writers of one resource, and a task unique until it finishes over
three keys; every locked task retries on conflict; bodies sleep 0.05-0.5 s. Meanwhile a chaos
loop (seeded: ``--seed``) SIGKILLs pool children (preferably busy ones; the worker's parent
releases their leases) and whole workers (their process group; restarted at once), and makes
the proxy reset the connection after, or swallow the reply of, the next ``EVALSHA``.

Then the chaos stops, the proxy heals, and the workers drain: until every task sent has an
outcome, or nothing is queued nor unacknowledged for 3 s, or 60 s + ttl passed. The verdict
comes from the ledger, the result backend and the worker logs, never from what the producer
expected:

* ``tasks_sent``: messages this process published (a unique call that returned an existing
  copy's result published nothing and is not counted);
* ``tasks_completed``: sent ids with a run that noted its end, or that ended skipped;
* ``tasks_lost``: sent ids that did neither (target 0, with either broker), except the ones
  below, listed with their result state, their runs, the lock conflicts noted for them, the
  worker log lines about them and a likely cause;
* ``broker_lost`` (Redis broker only): sent ids whose message was lost in transit by kombu's
  Redis transport, which takes a message off the queue (``BRPOP``) before it records it as
  unacknowledged, so a worker killed in between loses it. Counted apart from ``tasks_lost``, and
  only when proven: a lost task still ``PENDING`` or ``RETRY`` whose last published message (the
  ledger notes every publish) no worker logged receiving (fewer receipts than publishes, none
  after that publish), that never ran nor met a conflict after it, that is neither queued nor
  unacknowledged in the broker once the workers stopped, and with a whole worker SIGKILLed
  within 1 s after that publish (a kill not over when the publish began counts: their order is
  unknown). RabbitMQ has no such window (it redelivers every unacknowledged message when the
  consumer's connection drops): with it, every loss counts in ``tasks_lost``;
* ``overlaps``: runs that started while their lock did not allow another holder (exclusive: a
  second run; the cap: a third; read/write: a writer beside anyone, a reader beside a writer)
  (target 0). A run killed mid-body ends when its process (or its worker's group) was killed;
  a run with no end and no kill is taken to run until the workers were stopped;
* ``duplicate_runs``: task ids that completed more than once, each with its cause where it can
  be told (a kill after the first run's end and before its acknowledgement, a redelivery after
  the visibility timeout): at-least-once delivery, reported, not a target;
* ``kills`` (``kills_children``, ``kills_workers``), ``reply_faults`` (faults the proxy
  injected) and ``max_recovery_s``: the longest time from a kill to the next start of a run on a
  lock that a killed run held.

With the Redis broker a lost task left in ``tasks_lost`` also gets the broker's own evidence,
which never moves it out: the workers log a message that kombu holds unread in a paused BRPOP
reply (no prefetch credit; ``soakapp.trace_paused_brpop``), and the chaos measures how long
Redis keeps a killed worker's blocked BRPOP (a message pushed meanwhile goes to the dead
connection). Whenever the logs are kept, ``ledger.json`` beside them holds the whole ledger.

Run from the repository root::

    python benchmarks/soak [--minutes 5] [--seed N] [--json out.json] [--broker redis]

``--rate``, ``--ttl``, ``--visibility-timeout`` and ``--drain`` change the load and the bounds;
``--keep-logs`` keeps the worker logs of a run that passed; ``--no-proxy`` runs without the
fault proxy (no lost replies; the lock Redis is reached directly).

``--broker`` picks RabbitMQ or Redis (default: RabbitMQ if ``rabbitmq-server`` is installed at
``RabbitServer.binary``, else Redis; the choice is printed).

Exit status 1 when a target is missed (worker logs are then kept and their folder printed),
2 when the soak could not run. Ctrl-C and SIGTERM stop every process started here.
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent  # benchmarks/soak/
BENCHMARKS, TESTS = HERE.parent, HERE.parent.parent / "tests"
# Run as `python benchmarks/soak`, this folder comes first on the path: its modules are the
# package's (soak.workers is not the tests' workers.py), so it makes way for the folders above.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(BENCHMARKS))  # the soak package and common.py live here
sys.path.insert(1, str(TESTS))  # the fault proxy and the worker helpers are test helpers
from soak.brokers import BROKERS  # noqa: E402
from soak.session import soak  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="chaos period (default 5)")
    parser.add_argument("--seed", type=int, help="seeds the chaos and the producer's mix")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results here")
    parser.add_argument("--rate", type=float, default=6.0, help="calls per second (default 6)")
    parser.add_argument("--ttl", type=float, default=15.0, help="lease ttl, s (default 15)")
    parser.add_argument(
        "--broker",
        choices=BROKERS,
        help="the workers' broker (default: rabbitmq if rabbitmq-server is installed, else redis)",
    )
    parser.add_argument(
        "--visibility-timeout",
        type=float,
        default=10.0,
        help="the Redis broker's, s (default 10)",
    )
    parser.add_argument("--drain", type=float, help="longest drain, s (default 60 + ttl)")
    parser.add_argument("--keep-logs", action="store_true", help="keep worker logs on success")
    parser.add_argument(
        "--no-proxy",
        action="store_true",
        help="no fault proxy: workers reach the lock Redis directly, no reply faults",
    )
    args = parser.parse_args(argv)
    if not args.minutes > 0 or not args.rate > 0:
        parser.error("--minutes and --rate must be positive")
    return args


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the blocks that stop every process


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    began = time.perf_counter()
    log_dir = Path(tempfile.mkdtemp(prefix="soak-"))
    keep_logs = True  # until the verdict says otherwise
    try:
        result = soak(args, seed, log_dir, began)
        keep_logs = args.keep_logs or result != 0
        return result
    except KeyboardInterrupt:
        print("\ninterrupted; every process started here is stopped", flush=True)
        return 130
    finally:
        if keep_logs:
            print(f"worker logs: {log_dir}", flush=True)
        else:
            shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
