"""One soak (``benchmarks/soak``): starts the servers, the fault proxy and the workers, runs
the producer beside the chaos, drains, then judges, reports and returns the exit status."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from common import Target, print_targets, version_of

from .brokers import RabbitBroker, RedisBroker, pick_broker, rabbit_binary
from .chaos import Chaos
from .drain import drain
from .judge import judge
from .ledger import (
    dump_ledger,
    ledger_now,
    read_conflicts,
    read_publishes,
    read_runs,
    read_states,
)
from .logs import log_lines, receive_times
from .lost import explain_lost
from .producer import Producer
from .report import json_report, print_report
from .workers import CONCURRENCY, HERE, WORKERS, Fleet

LOCK_SOCKET_TIMEOUT_S = 1  # the workers' lock client: a swallowed reply costs 1 s, not 5


@contextlib.contextmanager
def _proxy(enabled: bool, port: int) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    from faultproxy import FaultProxy

    with FaultProxy("127.0.0.1", port) as proxy:
        yield proxy


def soak(args: argparse.Namespace, seed: int, log_dir: Path, began: float) -> int:
    from celery.signals import after_task_publish

    from celery_redislock.contrib.redis_server import RedisServer

    broker_name, why = pick_broker(args.broker)
    print(f"broker: {broker_name} ({why})", flush=True)
    if broker_name == "rabbitmq" and not os.path.exists(rabbit_binary()):
        print(f"rabbitmq-server is not installed at {rabbit_binary()}", file=sys.stderr)
        return 2

    with contextlib.ExitStack() as stack:
        rabbit = None
        if broker_name == "rabbitmq":
            from rabbit import RabbitServer

            try:
                rabbit = stack.enter_context(RabbitServer())
            except AssertionError as exc:  # RabbitServer's "did not start", with its log
                print(str(exc)[-3000:], file=sys.stderr)
                return 2
        main_server = stack.enter_context(RedisServer())
        ledger_server = stack.enter_context(RedisServer())
        try:
            proxy = stack.enter_context(_proxy(not args.no_proxy, main_server.port))
        except ImportError:
            print(
                "tests/faultproxy.py is missing: run with --no-proxy to soak without reply faults",
                file=sys.stderr,
            )
            return 2
        lock_url = main_server.url
        if proxy is not None:
            lock_url = (
                f"redis://127.0.0.1:{proxy.port}/0?socket_timeout={LOCK_SOCKET_TIMEOUT_S}"
                f"&socket_connect_timeout={LOCK_SOCKET_TIMEOUT_S}"
            )
        main = redis.Redis.from_url(main_server.url)
        broker: RedisBroker | RabbitBroker = (
            RabbitBroker(rabbit) if rabbit is not None else RedisBroker(main, main_server.url)
        )
        env = {
            "SOAK_MAIN_URL": main_server.url,
            "SOAK_BROKER_URL": broker.url,
            "SOAK_LOCK_URL": lock_url,
            "SOAK_LEDGER_URL": ledger_server.url,
            "SOAK_TTL": repr(args.ttl),
            "SOAK_VT": repr(args.visibility_timeout),
            # Redis broker: the workers log a message held in a BRPOP reply left unread.
            "SOAK_TRACE_BRPOP": "1" if broker.name == "redis" else "0",
        }
        os.environ.update(env)  # read by soakapp as this process imports it
        from soak import soakapp

        # This process publishes: its unique claims go straight to main, never faulted.
        soakapp.app.conf.redislock_url = main_server.url
        worker_env = {
            **os.environ,
            **env,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        ledger = redis.Redis.from_url(ledger_server.url)
        fleet = Fleet(log_dir, worker_env)
        stack.callback(fleet.stop)
        import celery

        print(
            f"Soak: {args.minutes:g} min of chaos, seed {seed}, {args.rate:g} calls/s, "
            f"{len(WORKERS)} workers x prefork -c {CONCURRENCY}, ttl {args.ttl:g} s; broker "
            f"{broker.describe(args.visibility_timeout)}; redis-server "
            f"{main_server.version} (main :{main_server.port}, ledger :{ledger_server.port}), "
            f"lock path {'via fault proxy :' + str(proxy.port) if proxy else 'direct'}; "
            f"Celery {celery.__version__}, kombu {version_of('kombu')}, redis-py "
            f"{redis.__version__}",
            flush=True,
        )
        for name in WORKERS:
            fleet.start(name)
        try:
            fleet.wait_ready(WORKERS)
        except RuntimeError as exc:
            print(f"workers did not start: {exc}", file=sys.stderr)
            return 2

        producer = Producer(soakapp, ledger, random.Random(seed + 1), args.rate, args.minutes * 60)
        after_task_publish.connect(producer.note_publish, weak=False)
        chaos = Chaos(
            fleet, ledger, proxy, random.Random(seed), main if broker.name == "redis" else None
        )
        producer.start()
        try:
            chaos.run(time.monotonic() + args.minutes * 60)
        finally:
            producer.stopping.set()
            producer.join(10)
            if proxy is not None:
                proxy.heal()
        faults = proxy.faults if proxy is not None else None
        print(
            f"chaos over: {len(producer.sent)} tasks sent, {len(chaos.kills)} kills, "
            f"{faults if faults is not None else 0} reply faults; draining",
            flush=True,
        )
        for name in WORKERS:  # one killed at the very end may still be starting
            if not fleet.ready(name):
                try:
                    fleet.wait_ready([name])
                except RuntimeError:
                    chaos.restart_failures.append(fleet.current[name])
        drain_began = time.monotonic()
        bound = args.drain if args.drain is not None else 60 + args.ttl
        drained = drain(broker, main, ledger, soakapp.app, producer.sent, bound)
        drain_s = time.monotonic() - drain_began
        fleet.stop()
        stopped_at = ledger_now(ledger)
        in_broker = broker.message_ids()  # after the stop: a warm shutdown requeues its own

        runs = read_runs(ledger)
        sent = list(producer.sent)
        states = read_states(main, soakapp.app, [s.task_id for s in sent])
        conflicts = read_conflicts(ledger)
        publishes = read_publishes(ledger)
        receives = receive_times(fleet.logs())
        dump_ledger(ledger, log_dir / "ledger.json")  # deleted with the logs if the soak passed
        verdict = judge(
            sent,
            runs,
            chaos.kills,
            {t: m.get("status", "PENDING") for t, m in states.items()},
            stopped_at=stopped_at,
            visibility_timeout_s=args.visibility_timeout,
            broker=broker.name,
            publishes=publishes,
            receives=receives,
            conflicts={t: [int(c["t_s"] * 1e6) for c in cs] for t, cs in conflicts.items()},
            in_broker=in_broker,
        )
        lost = explain_lost(
            verdict,
            sent,
            runs,
            chaos.kills,
            states,
            conflicts,
            log_lines(fleet.logs(), set(verdict.lost_ids)),
            stopped_at,
            broker=broker.name,
            publishes=publishes,
            receives=receives,
            in_broker=in_broker,
        )
    print_report(verdict, producer, chaos, faults, lost, drained, drain_s, broker.name)
    checks = [
        Target("tasks lost (sent, never completed nor skipped)", verdict.tasks_lost, 0),
        Target("overlaps (a run beside holders its lock forbids)", verdict.overlaps, 0),
        Target("kills (pool children and whole workers)", verdict.kills, 1, at_least=True),
    ]
    if faults is not None:
        checks.append(Target("reply faults injected on the lock path", faults, 1, at_least=True))
    print_targets(checks, began)
    passed = all(check.passed for check in checks)
    if args.json:
        report = json_report(verdict, producer, chaos, faults, lost, broker.name)
        report.update(
            drained=drained,
            drain_s=round(drain_s, 1),
            seed=seed,
            minutes=args.minutes,
            rate=args.rate,
            ttl=args.ttl,
            visibility_timeout=args.visibility_timeout if broker.name == "redis" else None,
            proxy=faults is not None,
            log_dir=str(log_dir) if args.keep_logs or not passed else None,  # else deleted
        )
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0 if passed else 1
