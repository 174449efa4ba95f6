"""The asyncio lock (``celery_redislock.asyncio.AsyncLock``) beside the synchronous ``Lock``,
redis-py's asyncio ``Lock`` and a floor (``SET NX PX`` then a compare-and-delete script), in one
run on one Redis: uncontended acquire+release pairs per second, one caller, then 50 asyncio
tasks at once on names of their own (one client, its connection pool). Rounds take turns,
order rotated; the best round of each is kept, and ratios are to the floor of the same run.

    python benchmarks/asyncio_lock.py [--quick] [--url redis://...] [--json PATH]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis
import redis.asyncio

sys.path.insert(0, str(Path(__file__).parent))
from common import base_parser, delete_keys, redis_target, section

from celery_redislock import Lock
from celery_redislock.asyncio import AsyncLock

Pair = Callable[[], Awaitable[None]]
CONCURRENT = 50
_UNLOCK = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end"


def _ours(client: redis.asyncio.Redis, name: str) -> Pair:
    lock = AsyncLock(client, name, ttl=30)

    async def pair() -> None:
        await (await lock.acquire(blocking=False)).release()

    return pair


def _redis_py(client: redis.asyncio.Redis, name: str) -> Pair:
    lock = client.lock(name, timeout=30)

    async def pair() -> None:
        assert await lock.acquire(blocking=False)
        await lock.release()

    return pair


def _floor(client: redis.asyncio.Redis, name: str) -> Pair:
    unlock = client.register_script(_UNLOCK)

    async def pair() -> None:
        token = os.urandom(16).hex()
        assert await client.set(name, token, nx=True, px=30000)
        await unlock(keys=[name], args=[token])

    return pair


ASYNC = {"celery-redislock AsyncLock": _ours, "redis-py asyncio Lock": _redis_py, "floor": _floor}


async def _rate(
    make: Callable[[redis.asyncio.Redis, str], Pair], url: str, run: str, tasks: int, seconds: float
) -> float:
    client = redis.asyncio.Redis.from_url(url, max_connections=tasks + 4)
    try:
        pairs = [make(client, f"bench:{run}:{i}") for i in range(tasks)]
        for pair in pairs:
            await pair()  # warm: scripts loaded, connections made
        done = 0
        deadline = time.perf_counter() + seconds

        async def loop(pair: Pair) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await pair()
                done += 1

        began = time.perf_counter()
        await asyncio.gather(*(loop(p) for p in pairs))
        return done / (time.perf_counter() - began)
    finally:
        await client.aclose()


def _sync_rate(url: str, run: str, seconds: float) -> float:
    lock = Lock(redis.Redis.from_url(url), f"bench:{run}:sync", ttl=30)
    lock.acquire(blocking=False).release()
    done, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        lock.acquire(blocking=False).release()
        done += 1
    return done / (time.perf_counter() - began)


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__ or "", "1 s rounds instead of 2 s")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    seconds = 1.0 if args.quick else 2.0
    run = os.urandom(4).hex()
    best: dict[str, float] = {}
    with redis_target(args.url or os.environ.get("REDIS_URL")) as (url, origin):
        print(f"Redis: {url} ({origin})")
        names = [*ASYNC, "celery-redislock Lock (sync)"]
        for rnd in range(args.rounds):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for tasks in (1, CONCURRENT):
                for name in order:
                    key = f"{name}|{tasks}"
                    if name in ASYNC:
                        rate = asyncio.run(_rate(ASYNC[name], url, f"{run}{rnd}", tasks, seconds))
                    elif tasks == 1:
                        rate = _sync_rate(url, f"{run}{rnd}", seconds)
                    else:
                        continue
                    best[key] = max(best.get(key, 0.0), rate)
        delete_keys(redis.Redis.from_url(url), run)
    for tasks in (1, CONCURRENT):
        floor = best[f"floor|{tasks}"]
        section(f"Uncontended pairs/s, {tasks} caller(s) at once (best of {args.rounds} rounds)")
        for name in names:
            rate = best.get(f"{name}|{tasks}")
            if rate is not None:
                print(f"  {name:<30} {rate:>9,.0f} /s   {rate / floor:5.2f}x the floor")
    if args.json:
        args.json.write_text(json.dumps(best, indent=2))


if __name__ == "__main__":
    main()
