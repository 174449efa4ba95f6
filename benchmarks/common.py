"""What the benchmark scripts share: the Redis they run on, section headings, target lines, CPU
load, and the choice of redis-py's reply parser."""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import redis.connection
import redis.utils
from redis._parsers import _HiredisParser, _RESP2Parser
from redis._parsers.encoders import Encoder

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


# -- CPU load ------------------------------------------------------------------------------------


def _burn(parent: int) -> None:
    # Stops by itself once orphaned: a burner must never outlive a benchmark killed with SIGKILL.
    while os.getppid() == parent:
        for _ in range(1_000_000):
            pass


class Load:
    """``count`` processes that burn CPU until stopped (a loaded machine)::

    with Load(2):
        ...  # measured with two cores' worth of busy loops competing
    """

    def __init__(self, count: int) -> None:
        ctx = mp.get_context("fork")
        self.processes = [
            ctx.Process(target=_burn, args=(os.getpid(),), daemon=True) for _ in range(count)
        ]

    def __enter__(self) -> Load:
        for process in self.processes:
            process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.join(5)


def add_load_option(parser: argparse.ArgumentParser, during: str = "throughout") -> None:
    """``--load N``: N CPU-burning processes (:class:`Load`) ``during`` the measurements."""
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        metavar="N",
        help=f"run N CPU-burning processes {during} (default 0)",
    )


def load_list(text: str) -> list[int]:
    """``--loads 0,2`` -> [0, 2]."""
    try:
        loads = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from exc
    if not loads or any(n < 0 for n in loads):
        raise argparse.ArgumentTypeError(f"expected counts >= 0: {text!r}")
    return loads


# -- redis-py's parser ---------------------------------------------------------------------------

# redis-py uses hiredis (a C parser, also for packing commands) when a recent enough one is
# installed (>= 1.0 for redis-py 5.x, >= 3.2 for 8.x), else its pure-Python parser: RESP2, or
# RESP3 when the connection speaks it (redis-py swaps _RESP2Parser for _RESP3Parser itself).
PARSERS = ("auto", "python", "hiredis", "both")


def parsers_of(choice: str) -> list[str]:
    """``--parser`` -> the parsers to measure side by side; ``auto`` is redis-py's own pick."""
    chosen = ["python", "hiredis"] if choice == "both" else [choice]
    if "hiredis" in chosen and not redis.utils.HIREDIS_AVAILABLE:
        raise SystemExit(
            f"--parser {choice}: redis-py does not find a usable hiredis "
            "(pip install 'celery-redislock[hiredis]')"
        )
    return chosen


def default_parser() -> str:
    """The parser redis-py picks by itself in this process."""
    return "hiredis" if redis.utils.HIREDIS_AVAILABLE else "python"


def parser_kwargs(parser: str) -> dict[str, Any]:
    """Connection keyword arguments that make a client use ``parser`` whatever is installed:
    the reply parser and the command packer (hiredis packs commands too)."""
    if parser == "python":
        encode = Encoder("utf-8", "strict", False).encode  # type: ignore[no-untyped-call]
        # 6000: redis-py's own cutoff between joining a command's pieces and sending them apart.
        packer = redis.connection.PythonRespSerializer(6000, encode)
        return {"parser_class": _RESP2Parser, "command_packer": packer}
    if parser == "hiredis":
        # redis-py packs commands with hiredis whenever it parses with it.
        return {"parser_class": _HiredisParser}
    return {}


def redis_client(url: str, parser: str = "auto", **kwargs: Any) -> redis.Redis:
    """A client on ``url`` with the given parser (``auto``: redis-py's own pick)."""
    return redis.Redis.from_url(url, **parser_kwargs(parser), **kwargs)
