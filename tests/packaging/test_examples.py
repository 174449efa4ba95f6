"""The examples run as a user would run them.

The Celery examples start their own workers (and beat), so like the other worker tests they run
on one Redis version (``celery_server``), each in a database of its own, emptied first. Each
asserts on the numbers the example printed, not only on its exit status.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from celery_redislock.contrib.redis_server import RedisServer

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_lock_basics(redis_server: RedisServer) -> None:
    env = {**os.environ, "REDIS_URL": redis_server.url}
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "lock_basics.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "stripe-api: 3 of 3 slots taken" in out
    assert "sync:42: re-entered, count 2" in out
    assert "sync:42: free again: True" in out


def run_example(server: RedisServer, name: str, db: int) -> str:
    """Runs ``python examples/<name>.py`` on database ``db`` of ``server``; returns its output
    once it exited 0 (the example's own check of its invariant)."""
    url = f"redis://127.0.0.1:{server.port}/{db}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py")],
        env={**os.environ, "REDIS_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


def summary(out: str) -> dict[str, str]:
    """The printed ``what: value`` lines, by what."""
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


def number(text: str) -> int:
    """The first whole number in ``text``."""
    found = re.search(r"\d+", text)
    assert found is not None, f"no number in {text!r}"
    return int(found.group())


@pytest.mark.slow
def test_singleton_report(celery_server: RedisServer) -> None:
    s = summary(run_example(celery_server, "singleton_report", db=1))
    fired, queued = number(s["beat fired"]), number(s["reports queued"])
    refused, runs = number(s["refused as duplicates"]), number(s["report runs"])
    assert fired == queued + refused
    # Beat fires every 0.5 s, a report takes 3 s: most firings find the report in progress.
    assert refused >= queued >= 2
    assert queued - runs in (0, 1)  # the last one queued may not have started yet
    assert number(s["max running at once"]) == 1
    assert number(s["max queued or running at once"]) == 1
    assert number(s["max queue length"]) <= 1
    assert s["invariant"] == "held"


@pytest.mark.slow
def test_customer_sync(celery_server: RedisServer) -> None:
    out = run_example(celery_server, "customer_sync", db=2)
    customers = re.findall(r"^customer:(\d+): (\d+) syncs, at most (\d+) at once$", out, re.M)
    assert [c for c, _, _ in customers] == ["101", "102", "103", "104", "105"]
    assert all(syncs == "4" and most == "1" for _, syncs, most in customers)
    s = summary(out)
    assert s["syncs run"] == "20 of 20"
    assert s["api calls run"] == "40 of 40"
    assert number(s["max syncs at once of one customer"]) == 1
    assert number(s["max syncs at once, all customers"]) >= 2  # customers side by side
    assert number(s["max api calls at once"]) == 2  # the cap, reached and never passed
    assert s["invariant"] == "held"


@pytest.mark.slow  # about 7 s on 2 quiet cores
def test_cache_rebuild(celery_server: RedisServer) -> None:
    s = summary(run_example(celery_server, "cache_rebuild", db=3))
    assert s["readers run"] == "12 of 12"
    assert s["rebuilds run"] == "1 of 1"
    assert number(s["max readers at once"]) >= 2
    assert number(s["readers beside the rebuild"]) == 0
    assert s["invariant"] == "held"


@pytest.mark.slow
def test_fenced_writes(celery_server: RedisServer) -> None:
    out = run_example(celery_server, "fenced_writes", db=4)
    writes = re.findall(r"^write ([AB]) \(fence (\d+)\): (accepted|rejected)$", out, re.M)
    # B writes first (A is still stalled), then A's late write comes and is refused.
    assert [(w, verdict) for w, _, verdict in writes] == [("B", "accepted"), ("A", "rejected")]
    fences = {w: int(fence) for w, fence, _ in writes}
    assert fences["B"] > fences["A"]
    stored = re.search(r"^stored: balance (\d+) by (\w+), fence (\d+)$", out, re.M)
    assert stored is not None, out
    assert stored.groups() == ("250", "B", str(fences["B"]))
    assert summary(out)["invariant"] == "held"


@pytest.mark.slow  # about 7 s on 2 quiet cores
def test_rq_singleton(celery_server: RedisServer) -> None:
    s = summary(run_example(celery_server, "rq_singleton", db=5))
    assert s["enqueue calls through UniqueQueue"] == "21"
    # One job while queued or running, a new one once it finished.
    assert s["jobs queued"] == "2"
    assert s["refused while queued"] == "9"
    assert s["refused while running"] == "10"
    assert s["copy around UniqueQueue"] == "SKIPPED, its lock held by the running report"
    assert s["report runs"] == "2"
    assert number(s["max running at once"]) == 1
    assert s["invariant"] == "held"
