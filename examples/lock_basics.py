"""The lock core in a few lines: a mutex, a cap, a read/write lock, re-entry and fences.

Run: python examples/lock_basics.py   (uses REDIS_URL, else starts a throwaway redis-server)
"""

from __future__ import annotations

import redis

from celery_redislock import Heartbeat, Lock, LockNotAcquired
from celery_redislock.contrib.redis_server import redis_url


def main() -> None:
    with redis_url() as url:
        client = redis.Redis.from_url(url)

        # A mutex: one holder at a time. The fence grows with every acquisition.
        report = Lock(client, "nightly-report", ttl=30)
        with report.acquire(timeout=5) as lease:
            print(f"report: held, fence {lease.fence}")
            try:
                report.acquire(blocking=False)
            except LockNotAcquired as exc:
                print(f"report: second taker refused: {exc}")

        # A cap: at most 3 holders across every process using this name.
        api = Lock(client, "stripe-api", ttl=30, limit=3)
        slots = [api.acquire(blocking=False) for _ in range(3)]
        print(f"stripe-api: {len(api.holders())} of 3 slots taken")
        for slot in slots:
            slot.release()

        # Read/write: readers share, a writer is alone.
        readers = [Lock(client, "cache:eu", ttl=30, mode="read").acquire() for _ in range(2)]
        print(f"cache:eu: {len(readers)} readers share it")
        for r in readers:
            r.release()
        with Lock(client, "cache:eu", ttl=30, mode="write").acquire() as writer:
            print(f"cache:eu: rebuilt alone, fence {writer.fence}")

        # Re-entry by an explicit owner, and a lease kept alive by the process's heartbeat.
        sync = Lock(client, "sync:42", ttl=3)
        outer = sync.acquire(owner="task-1")
        inner = sync.acquire(owner="task-1")
        Heartbeat.current().register(outer)
        print(f"sync:42: re-entered, count {sync.holders()[0].count}")
        inner.release()
        Heartbeat.current().unregister(outer)
        outer.release()
        print(f"sync:42: free again: {not sync.locked()}")


if __name__ == "__main__":
    main()
