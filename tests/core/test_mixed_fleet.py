"""A mixed fleet: processes running the release before the lean layout (the package as it was
at OLD, taken from git) and this one, contending for one lock name in the default layout. Their
leases must never overlap: each holder records its start and end with Redis's clock, and the
records must alternate, one holder at a time. Then the layout is switched to lean once only
this release runs (docs/core.md "The lean layout"), and the new processes go on alone."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core import layout

ROOT = Path(__file__).resolve().parents[2]
OLD = "7fbb81c"  # the last commit whose layout has no fast path
ROUNDS = 15

# A holder's loop: takes the lock (trying until it gets it), notes its start and end in Redis
# (server time, under the lease), and gives it back. The old release is imported from `old`
# when given (setuptools' editable finder, which maps the name to this checkout, set aside).
HOLDER = textwrap.dedent(
    """
    import sys
    import time
    url, name, who, old = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[5]
    rounds = int(sys.argv[4])
    if old:
        def mapped(f): return "__editable__" in (getattr(f, "__module__", "") + type(f).__module__)
        sys.meta_path[:] = [f for f in sys.meta_path if not mapped(f)]
        sys.path.insert(0, old)
    import redis
    import celery_redislock
    from celery_redislock import Lock
    assert bool(old) == bool(old and celery_redislock.__file__.startswith(old))
    client = redis.Redis.from_url(url)
    lock = Lock(client, name, ttl=10)
    for _ in range(rounds):
        while True:  # tries without waiting in line: a line would send every call one way
            try:
                lease = lock.acquire(blocking=False)
                break
            except celery_redislock.LockNotAcquired:
                time.sleep(0.001)
        with lease:
            client.rpush("events", f"start {who} {lease.fence}")
            time.sleep(0.005)
            client.rpush("events", f"end {who}")
    """
)


@pytest.fixture(scope="module")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> str:
    where = tmp_path_factory.mktemp("old")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", OLD, "celery_redislock"],
        capture_output=True,
        check=False,
    )
    assert archive.returncode == 0, (
        f"git archive {OLD} failed (a full clone is needed): {archive.stderr!r}"
    )
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    return str(where)


def _holders(url: str, name: str, fleet: list[tuple[str, str]]) -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", HOLDER, url, name, who, str(ROUNDS), old])
        for who, old in fleet
    ]
    for proc in procs:
        assert proc.wait(timeout=300) == 0


def _one_at_a_time(client: redis.Redis, runs: int) -> list[int]:
    events = [e.decode().split() for e in client.lrange("events", 0, -1)]
    assert len(events) == 2 * runs
    fences = []
    for start, end in zip(events[::2], events[1::2], strict=True):
        assert start[0] == "start" and end == ["end", start[1]], (start, end)
        fences.append(int(start[2]))
    assert fences == sorted(set(fences)), "fences must grow"
    return fences


def test_old_and_new_workers_never_overlap_in_the_default_layout(
    client: redis.Redis, redis_server: RedisServer, old_release: str
) -> None:
    url = redis_server.url
    fleet = [("old-1", old_release), ("new-1", ""), ("old-2", old_release), ("new-2", "")]
    _holders(url, "mixed", fleet)
    fences = _one_at_a_time(client, len(fleet) * ROUNDS)
    # The old release gone, the fleet switches to the lean layout and goes on.
    layout.set_layout(client, "redislock", "lean")
    client.delete("events")
    _holders(url, "mixed", [("new-1", ""), ("new-2", "")])
    after = _one_at_a_time(client, 2 * ROUNDS)
    assert after[0] > fences[-1]
    assert client.hget("redislock:{mixed}:meta", "L") == b""  # taken on the fast path
