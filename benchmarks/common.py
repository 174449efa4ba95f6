"""What both benchmark scripts share: the Redis they run on, section headings, target lines."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from celery_redislock.contrib.redis_server import RedisServer


@dataclass(frozen=True)
class Target:
    label: str
    value: float
    limit: float
    at_least: bool = False  # True: value >= limit passes; False: value <= limit passes
    unit: str = ""

    @property
    def passed(self) -> bool:
        return self.value >= self.limit if self.at_least else self.value <= self.limit

    def line(self) -> str:
        mark = "pass" if self.passed else "MISS"
        op = ">=" if self.at_least else "<="
        shown = f"{self.value:,.0f}" if float(self.value).is_integer() else f"{self.value:.3g}"
        value = f"{shown}{self.unit}"
        return f"  [{mark}] {self.label:<62} {value:>10}  (target {op} {self.limit:g}{self.unit})"


def section(title: str) -> None:
    print(f"\n{title}\n{'-' * len(title)}", flush=True)


def print_targets(checks: Sequence[Target], began: float) -> None:
    section("Targets")
    for check in checks:
        print(check.line())
    misses = sum(not c.passed for c in checks)
    print(
        f"\n{len(checks) - misses} of {len(checks)} targets met; total runtime "
        f"{time.perf_counter() - began:.1f} s"
    )


@contextlib.contextmanager
def redis_target(url: str | None) -> Iterator[tuple[str, str]]:
    """The URL to benchmark and where it came from; starts (and stops) a server unless given."""
    if url:
        yield url, "given"
        return
    with RedisServer() as server:
        yield server.url, f"started here: {server.binary} v{server.version}"


def base_parser(doc: str, quick_help: str) -> argparse.ArgumentParser:
    """The options every benchmark takes: --json, --quick, --url."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results here")
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument(
        "--url", help="benchmark this Redis (default: $REDIS_URL, else a fresh redis-server)"
    )
    return parser


def redis_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def delete_keys(client: redis.Redis, run: str) -> int:
    """Deletes every key whose name contains the run id; returns how many."""
    keys = list(client.scan_iter(match=f"*{run}*", count=1000))
    for start in range(0, len(keys), 1000):
        client.unlink(*keys[start : start + 1000])
    return len(keys)


def version_of(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def print_header(
    title: str, url: str, origin: str, client: redis.Redis, quick: bool, tail: str
) -> None:
    """The first lines of a Celery benchmark's output: where it ran, and on what versions."""
    import os
    import platform

    import celery

    import celery_redislock

    version = client.info("server")["redis_version"]
    print(
        f"{title}: Redis {version} at {url} ({origin}); Python "
        f"{platform.python_version()}, Celery {celery.__version__}, {os.cpu_count()} "
        f"CPU(s), load average {os.getloadavg()[0]:.2f}" + ("; --quick" if quick else ""),
        flush=True,
    )
    print(
        f"celery_redislock {celery_redislock.__version__}, celery-singleton "
        f"{version_of('celery-singleton')}, celery-once {version_of('celery_once')}; {tail}",
        flush=True,
    )
