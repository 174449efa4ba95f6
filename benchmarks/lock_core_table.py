"""Prints the lock-core benchmark table (docs/benchmarks.md) from a ``lock_core.py --json`` file.

Run: python benchmarks/lock_core_table.py out.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

COLUMNS = (
    "celery_redislock",
    "celery_redislock_fair",
    "redis_py",
    "python_redis_lock",
    "pottery",
    "raw_floor",
    "fenced_floor",
    "waiting_floor",
    "ping_x2",
)
HEADER = (
    "| measure | celery-redislock | fair mode | redis-py `Lock` | python-redis-lock "
    "| pottery `Redlock` | raw floor | fenced floor | waiting floor | two PINGs |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def _row(label: str, cells: list[str]) -> str:
    return "| " + " | ".join([label, *cells]) + " |"


def table(b: dict[str, Any]) -> str:
    hand = b["handoff_ms"]

    def handoff(lib: str) -> str:
        return f"{hand[lib]['mean']:.2f} / {hand[lib]['p99']:.2f}" if lib in hand else ""

    def per_lib(key: str, fmt: str) -> list[str]:
        of = b.get(key, {})
        return [format(of[lib], fmt) if lib in of else "" for lib in COLUMNS]

    by_parser = b.get("pairs_per_s_by_parser", {})
    if "python" in by_parser and "hiredis" in by_parser:  # lock_core.py --parser both
        pairs_rows = [
            _row(
                "uncontended acquire+release pairs/s, pure-Python parser",
                [
                    f"{by_parser['python'][lib]:,.0f}" if lib in by_parser["python"] else ""
                    for lib in COLUMNS
                ],
            ),
            _row(
                "same, hiredis parser",
                [
                    f"{by_parser['hiredis'][lib]:,.0f}" if lib in by_parser["hiredis"] else ""
                    for lib in COLUMNS
                ],
            ),
        ]
    else:
        pairs_rows = [_row("uncontended acquire+release pairs/s", per_lib("pairs_per_s", ",.0f"))]
    rows = [
        *pairs_rows,
        _row(
            "handoff to a waiter blocked in another process, mean / p99 ms",
            [handoff(lib) for lib in COLUMNS],
        ),
        _row(
            "4 processes, 10 ms hold: min/max acquisitions per process",
            per_lib("fairness_min_over_max", ".3f"),
        ),
        _row("same: commands sent per acquisition", per_lib("commands_per_acquisition", ".1f")),
        _row(
            "same: commands Redis ran per acquisition, inside scripts too (INFO commandstats)",
            per_lib("commands_per_acquisition_in_redis", ".0f"),
        ),
        _row(
            "same: Redis CPU per acquisition, µs (INFO cpu)",
            per_lib("server_cpu_us_per_acquisition", ".0f"),
        ),
        _row(
            "renew 10,000 leases in one process",
            [
                f"{b['renew_10k']['seconds'] * 1000:.0f} ms, "
                f"{b['renew_10k']['round_trips']} round trip",
                *[""] * (len(COLUMNS) - 1),
            ],
        ),
    ]
    return "\n".join([HEADER, *rows])


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(table(json.load(f)))
