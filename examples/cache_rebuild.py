"""Cache readers that share a region's cache, and a rebuild of it that runs alone.

``read_cache`` takes ``cache:{region}`` in read mode: readers run side by side. ``rebuild_cache``
takes it in write mode: it runs with no reader beside it. The rebuild waits for the lock
(``on_conflict="wait"``) and so stands in the lock's line: readers that come after it wait
behind it (they are retried) instead of keeping it out for ever. The producer sends a burst of
readers, the rebuild, then another burst, waits until all have run, and prints, from the
intervals each task noted in Redis, how many readers ran at once and how many ran beside the
rebuild.

Run: python examples/cache_rebuild.py           (REDIS_URL, else a throwaway redis-server;
                                                 starts two workers)
     python examples/cache_rebuild.py produce   (only the producer, against running workers)
"""

from __future__ import annotations

import json
import time

from _runner import example_app, main, noted, worker_command

# demos/ is in the checkout, not installed: importing _runner put it on sys.path.
from demos._common.spans import most_at_once, overlapping_pairs

NAME = "cache_rebuild"
REGION = "eu"
READERS = 6  # per burst
WORKERS = [worker_command(NAME, "w1", concurrency=4), worker_command(NAME, "w2", concurrency=4)]

app, r = example_app(
    NAME,
    task_ignore_result=True,  # the producer reads what the tasks noted, not their results
)


def key(what: str) -> str:
    return f"{NAME}:{what}"


@app.task(lock={"key": "cache:{region}", "mode": "read", "on_conflict": "retry", "countdown": 0.1})
def read_cache(region: str) -> None:
    """Serves from the region's cache (a sleep)."""
    with noted(r, key("intervals"), "read"):
        time.sleep(0.5)


@app.task(lock={"key": "cache:{region}", "mode": "write", "on_conflict": "wait", "timeout": 10})
def rebuild_cache(region: str) -> None:
    """Rebuilds the region's cache (a sleep); no reader may see it half-built."""
    with noted(r, key("intervals"), "rebuild"):
        time.sleep(0.5)


def produce() -> bool:
    """Readers, the rebuild, more readers; waits until all have run; prints what overlapped."""
    r.delete(key("intervals"))
    for _ in range(READERS):
        read_cache.delay(REGION)
    time.sleep(0.2)  # the first readers hold the cache when the rebuild asks for it
    rebuild_cache.delay(REGION)
    time.sleep(0.4)  # the rebuild stands in line when the second burst comes
    for _ in range(READERS):
        read_cache.delay(REGION)
    deadline = time.monotonic() + 30
    while r.llen(key("intervals")) < 2 * READERS + 1 and time.monotonic() < deadline:
        time.sleep(0.1)

    reads: list[tuple[float, float]] = []
    rebuilds: list[tuple[float, float]] = []
    for raw in r.lrange(key("intervals"), 0, -1):
        what, start, end = json.loads(raw)
        (reads if what == "read" else rebuilds).append((start, end))
    beside = overlapping_pairs(reads, rebuilds)
    before = sum(1 for _, re in reads for ws, _ in rebuilds[:1] if re <= ws)
    most_readers = most_at_once(reads)
    print(f"readers run: {len(reads)} of {2 * READERS}")
    print(f"rebuilds run: {len(rebuilds)} of 1")
    print(f"max readers at once: {most_readers}")
    print(f"readers beside the rebuild: {beside}")
    print(f"readers before the rebuild: {before}, after it: {len(reads) - before - beside}")
    held = len(reads) == 2 * READERS and len(rebuilds) == 1
    held = held and most_readers >= 2 and beside == 0
    print("invariant: " + ("held" if held else "BROKEN"))
    return held


if __name__ == "__main__":
    main(NAME, produce, WORKERS)
