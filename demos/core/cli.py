"""The command line: ``python -m demos.core [--quick] [--json PATH]``."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from multiprocessing.context import ForkContext, SpawnContext
from pathlib import Path
from typing import Any

import redis

from celery_redislock.contrib.redis_server import redis_url

from .._common.processes import sigterm_as_interrupt
from .fleet import Run
from .report import Check, Outcome, print_checks, print_summary, say
from .scenarios import SCENARIOS
from .settings import FULL, PROCESSES, QUICK, Settings


def _context() -> ForkContext | SpawnContext:
    """fork where there is one (workers start in milliseconds), else spawn."""
    if "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _server_info(client: redis.Redis, url: str) -> dict[str, Any]:
    info = client.info("server")
    return {
        "url": url,
        "version": str(info.get("redis_version")),
        "pid": int(info.get("process_id", 0)),
        "started_here": not os.environ.get("REDIS_URL"),
    }


def run_all(url: str, settings: Settings) -> dict[str, Any]:
    """Runs every scenario on the Redis at ``url``; returns the summary."""
    client = redis.Redis.from_url(url)
    server = _server_info(client, url)
    where = "started for this run" if server["started_here"] else "from REDIS_URL"
    say(
        f"celery_redislock demo: {PROCESSES} worker processes on Redis {server['version']} at "
        f"{url} (pid {server['pid']}, {where})"
    )
    run = Run(url, client, _context(), settings)
    outcomes = []
    try:
        for scenario in SCENARIOS:
            outcomes.append(_run_scenario(run, scenario))
    finally:
        run.forget_all()
        client.close()
    return {
        "passed": all(o.passed for o in outcomes),
        "redis": server,
        "workers": run.pids,
        "settings": asdict(settings),
        "scenarios": {o.name: o.as_json() for o in outcomes},
    }


def _run_scenario(run: Run, scenario: Callable[[Run], Outcome]) -> Outcome:
    """Runs one scenario and prints its verdicts; an error fails it and the demo goes on."""
    try:
        outcome = scenario(run)
    except Exception as exc:
        say(f"  ! {type(exc).__name__}: {exc}")
        error = Check("error", f"errors ({type(exc).__name__}: {exc})", 1, 0, "==")
        outcome = Outcome(scenario.__name__, "did not complete", [error], {"error": repr(exc)})
    print_checks(outcome)
    return outcome


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m demos.core",
        description="Worker processes contend for Redis locks; each lock kind's invariant is "
        "checked and reported.",
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds (under 15 s)")
    parser.add_argument("--json", metavar="PATH", type=Path, help="write the summary here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the demo; returns 0 if every invariant held, 1 if one failed, 130 if interrupted."""
    args = _parse(argv)
    settings = QUICK if args.quick else FULL
    sigterm_as_interrupt()
    started = time.monotonic()
    try:
        with redis_url() as url:
            summary = run_all(url, settings)
    except KeyboardInterrupt:
        print(
            "\ninterrupted: workers stopped, and the Redis server if started here", file=sys.stderr
        )
        return 130
    summary["seconds"] = round(time.monotonic() - started, 2)
    summary["quick"] = bool(args.quick)
    print_summary(summary)
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if summary["passed"] else 1
