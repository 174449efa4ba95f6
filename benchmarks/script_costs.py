"""What each path of the lock scripts costs Redis, beside the commands redis-py's ``Lock`` sends.

One process, one Redis (a throwaway ``redis-server`` started here, unless ``--url`` or
``REDIS_URL`` names one), no contention: each path is driven on its own, many times, and Redis's
own accounting says what it cost (``INFO commandstats`` after ``CONFIG RESETSTAT``): the time
spent inside the command (``usec`` per call; for a script, everything it ran) and the commands it
ran (a script's own ``redis.call``s included). The paths:

* ``acquire, free lock``: a lock with no lease and nobody in line (the fast path);
* ``release, nobody waits``: the only lease of a lock given back (the fast path);
* ``acquire, held: joins the line``: a blocking acquire's first try at a held lock;
* ``release, to a waiter``: the holder gives back the lease while one waits (a wake-up);
* ``acquire, woken``: the waiter's try after its wake-up, which takes the lease;
* the same three in fair mode, where the release hands the lease to the waiter;
* ``acquire_all``, two locks taken at once (a task's ``lock=`` list), both free; and refused
  by the second, held (nothing written);
* for comparison, redis-py's ``Lock``: ``SET NX PX`` and its compare-and-delete script.

The waiter's wake-up itself (a ``BLPOP`` that returns at once) is left out: it is a plain
command, the same for every lock that wakes its waiters by a push.

Run from the repository root::

    python benchmarks/script_costs.py [--calls N] [--url redis://...]

It takes a few seconds. Against ``--url`` the benchmark resets the server's statistics and, at
the end, deletes the keys it created (every one contains ``scriptcost-<run id>``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import redis

from celery_redislock import Lease, Lock, LockNotAcquired, acquire_all
from celery_redislock.core.protocol import AcquireArgs, AcquireReply, AcquireStatus
from celery_redislock.core.scripts import run

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import base_parser, delete_keys, redis_target, section

CALLS = 2000


@dataclass(frozen=True)
class Cost:
    usec: float  # inside Redis, per call of the path
    commands: float  # Redis ran, per call of the path (inside scripts too)


def _stats(client: redis.Redis) -> tuple[int, int]:
    """(usec, calls) since the last reset, but INFO and CONFIG. A script's own time includes
    the commands it ran, which Redis also counts apart: usec is then the scripts' alone."""
    stats = {
        key: value
        for key, value in client.info("commandstats").items()
        if not key.startswith(("cmdstat_info", "cmdstat_config"))
    }
    calls = sum(int(value["calls"]) for value in stats.values())
    scripts = stats.get("cmdstat_evalsha")
    usec = int(scripts["usec"]) if scripts else sum(int(v["usec"]) for v in stats.values())
    return usec, calls


def _one(client: redis.Redis, step: Callable[[], object]) -> tuple[int, int]:
    """What ``step`` cost inside Redis: (usec, commands)."""
    client.config_resetstat()
    step()
    return _stats(client)


def _try(lock: Lock, token: str, *, woke: bool = False) -> AcquireReply:
    """A blocking acquire's try, as ``Lock.acquire`` sends it (no owner, no job)."""
    args = AcquireArgs(
        token=token, spec=lock._spec, wait=True, once=False, owner=None, info="{}", job=None
    )
    return AcquireReply.decode(
        run("acquire", lock.client, lock.encoded_keys, args._replace(woke=woke).encode())
    )


def _path(client: redis.Redis, lock: Lock) -> dict[str, tuple[int, int]]:
    """One round of every path on ``lock``: what each cost."""
    out: dict[str, tuple[int, int]] = {}
    leases: list[Lease] = []
    out["acquire, free lock"] = _one(client, lambda: leases.append(lock.acquire()))
    out["release, nobody waits"] = _one(client, leases[0].release)
    holder = lock.acquire()
    token = os.urandom(16).hex()
    replies: list[AcquireReply] = []
    out["acquire, held: joins the line"] = _one(client, lambda: replies.append(_try(lock, token)))
    assert replies[-1].status is AcquireStatus.NOT_HELD, replies[-1]
    out["release, to a waiter"] = _one(client, holder.release)
    client.delete(lock.keys.all[4], lock.keys.waiter(token))  # the wake-up the BLPOP takes
    out["acquire, woken"] = _one(client, lambda: replies.append(_try(lock, token, woke=True)))
    got = replies[-1]
    assert got.status is AcquireStatus.HELD, got
    lock._lease(got.token, got.fence, got.expires_at_ms, got.mode, None, 0.0).release()
    return out


def _refused(locks: list[Lock]) -> None:
    try:
        acquire_all(locks, blocking=False)
    except LockNotAcquired:
        return
    raise AssertionError("acquire_all took a held lock")


def costs(client: redis.Redis, prefix: str, calls: int) -> dict[str, Cost]:
    totals: dict[str, list[int]] = {}
    for fair in (False, True):
        lock = Lock(client, f"{prefix}:{'fair' if fair else 'plain'}", ttl=30, fair=fair)
        for _ in range(calls):
            for path, (usec, count) in _path(client, lock).items():
                if fair and ("free" in path or "nobody" in path):
                    continue  # the same fast path as without fairness
                label = path + (", fair" if fair else "")
                total = totals.setdefault(label, [0, 0])
                total[0] += usec
                total[1] += count
    pair = [Lock(client, f"{prefix}:pair{n}", ttl=30) for n in (1, 2)]
    taken: list[Lease] = []
    for _ in range(calls):
        taken.clear()
        usec, count = _one(client, lambda: taken.extend(acquire_all(pair)))
        total = totals.setdefault("acquire_all, two free locks", [0, 0])
        total[0] += usec
        total[1] += count
        for lease in taken:
            lease.release()
        held = pair[1].acquire()
        usec, count = _one(client, lambda: _refused(pair))
        total = totals.setdefault("acquire_all, refused by the second", [0, 0])
        total[0] += usec
        total[1] += count
        held.release()
    peer = client.lock(f"{prefix}:redis-py", timeout=30)
    for _ in range(calls):
        for label, step in (("acquire (SET NX PX)", peer.acquire), ("release", peer.release)):
            usec, count = _one(client, step)
            total = totals.setdefault(f"redis-py Lock: {label}", [0, 0])
            total[0] += usec
            total[1] += count
    return {label: Cost(u / calls, c / calls) for label, (u, c) in totals.items()}


def main() -> int:
    parser = base_parser(__doc__ or "", "500 calls per path")
    parser.add_argument("--calls", type=int, default=CALLS, help=f"calls per path ({CALLS})")
    args = parser.parse_args()
    calls = 500 if args.quick else args.calls
    run_id = f"scriptcost-{os.getpid()}"
    with redis_target(args.url or os.environ.get("REDIS_URL")) as (url, origin):
        client = redis.Redis.from_url(url)
        version = client.info("server")["redis_version"]
        print(f"Lock script costs: Redis {version} at {url} ({origin}); {calls} calls per path")
        try:
            found = costs(client, run_id, calls)
        finally:
            if args.url or os.environ.get("REDIS_URL"):
                delete_keys(client, run_id)
            client.close()
    section("Inside Redis, per call (INFO commandstats)")
    print(f"  {'path':<44}{'us':>8}{'commands':>10}")
    for label, cost in found.items():
        print(f"  {label:<44}{cost.usec:>8.1f}{cost.commands:>10.1f}")
    print(
        "  us: time Redis spent inside the call (a script: everything it ran); commands: the "
        "call and, for a script, the commands it ran"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
