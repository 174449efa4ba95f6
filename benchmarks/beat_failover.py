"""One beat for the fleet, measured with real processes: three ``celery beat`` processes
(``LeaderScheduler`` over Celery's ``PersistentScheduler``, the app ``tests/beatleader.py``) on
one schedule of a 1 s and a 5 s entry for 60 s; the leader SIGKILLed twice (each killed beat
started again, as a supervisor would), and with ``--sentinel`` the lock Redis failed over once
(1 master, 1 replica, 3 sentinels; ``min_replicas=1``). No worker reads the broker: the messages
are counted there at the end, each naming its tick (``redislock_beat`` header), and each entry's
chain of ticks is checked (``tests/beatcheck.py``): no tick sent twice, none lost. Takeover: from
the kill to the moment a new beat holds the leader lease (the lease read every 20 ms).
``--django``: django-celery-beat's ``DatabaseScheduler`` instead (its table in SQLite).
``--baseline`` first runs three plain beats (Celery's scheduler, no leader) for 10 s: what a
fleet sends without this package.

    python benchmarks/beat_failover.py [--seconds 60] [--ttl 3] [--sentinel] [--django]
                                       [--baseline] [--quick] [--logs DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from beatcheck import Beat, chains, sent, skips
from topologies import SentinelGroup, wait_until

from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.beat_leader import leader_of

ENTRIES = {"1s": 1.0, "5s": 5.0}
MAX_INTERVAL = 1.0  # tests/beatleader.py's beat_max_loop_interval: one beat interval


class Watch(threading.Thread):
    """Reads the leader lease every 20 ms: (time, pid) each time the leader changes."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.changes: list[tuple[float, int | None]] = []
        self.done = threading.Event()

    def run(self) -> None:
        last: int | None = -1
        while not self.done.is_set():
            try:
                info = leader_of(self.client, "beatleader")
            except Exception:  # (the lock Redis failing over)
                time.sleep(0.02)
                continue
            pid = None if info is None or info.pid is None else int(info.pid)
            if pid != last:
                self.changes.append((time.monotonic(), pid))
                last = pid
            time.sleep(0.02)

    def leader(self) -> int | None:
        return self.changes[-1][1] if self.changes else None

    def took_over(self, after: float, old: int) -> float | None:
        """Seconds from ``after`` until a beat other than ``old`` led."""
        for at, pid in self.changes:
            if at >= after and pid not in (None, old):
                return at - after
        return None


def baseline(seconds: float, tmp: Path) -> dict[str, Any]:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        fleet = [Beat(server.url, tmp, f"plain{i}", {"BEAT_PLAIN": "1"}) for i in (1, 2, 3)]
        for beat in fleet:
            beat.start()
        time.sleep(seconds)
        for beat in fleet:
            beat.stop()
        names = [json.loads(raw)["headers"]["argsrepr"] for raw in client.lrange("celery", 0, -1)]
        client.close()
    counts = {entry: names.count(repr([entry])) for entry in ENTRIES}
    expected = {entry: int(seconds // every) for entry, every in ENTRIES.items()}
    return {"seconds": seconds, "messages": counts, "ticks_due": expected}


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    with ExitStack() as stack:
        broker = stack.enter_context(RedisServer())
        env = {"BEAT_TTL": str(args.ttl), "BEAT_BROKER_URL": broker.url}
        group = None
        if args.sentinel:
            group = stack.enter_context(SentinelGroup())
            sentinels = ",".join(f"{h}:{p}" for h, p in group.addresses)
            env |= {"BEAT_SENTINELS": sentinels, "BEAT_MIN_REPLICAS": "1"}
            locks = group.sentinel().master_for(group.service)
        else:
            locks = redis.Redis.from_url(broker.url)
        app = "beatleader"
        if args.django:  # django-celery-beat's DatabaseScheduler, its table in SQLite
            app, env["BEAT_DB"] = "beatdjango", str(tmp / "beat.sqlite3")
            migrate = "import beatdjango; from django.core.management import call_command; "
            subprocess.run(
                [sys.executable, "-c", migrate + "call_command('migrate', verbosity=0)"],
                check=True,
                env={**os.environ, "BEAT_REDIS_URL": broker.url, **env, "PYTHONPATH": sys.path[0]},
            )
        fleet = {f"b{i}": Beat(broker.url, tmp, f"b{i}", env, app).start() for i in (1, 2, 3)}
        watch = Watch(locks)
        watch.start()
        began = time.monotonic()
        events: list[tuple[float, str]] = []
        takeovers: list[float | None] = []
        kills = [args.seconds / 3, 2 * args.seconds / 3]
        failover_at = args.seconds / 2 if args.sentinel else None
        while time.monotonic() - began < args.seconds:
            now = time.monotonic() - began
            if kills and now >= kills[0]:
                kills.pop(0)
                old = watch.leader()
                name = next(n for n, b in fleet.items() if old in b.pids())
                at = time.monotonic()
                fleet[name].signal(signal.SIGKILL)
                fleet[name].proc.wait(10)  # type: ignore[union-attr]
                events.append((now, f"SIGKILL leader {name} (pid {old})"))
                while watch.took_over(at, old) is None and time.monotonic() - at < 60:
                    time.sleep(0.02)
                takeovers.append(watch.took_over(at, old))
                again = Beat(broker.url, tmp, f"{name}-{len(takeovers)}", env, app).start()
                fleet[name] = again  # (started again, as a supervisor would)
            if failover_at is not None and group is not None and now >= failover_at:
                failover_at = None
                at = time.monotonic()
                old = group.master()
                new = group.failover_after_kill()
                events.append((now, f"lock Redis failed over in {time.monotonic() - at:.1f} s"))
                # The old master comes back as the new one's replica (min_replicas=1 holds again).
                old.start()
                wait_until(old.ready, "the old master answers", 30)
                old.client().replicaof("127.0.0.1", new.port)
                wait_until(
                    lambda master=new: master.client().info("replication")["connected_slaves"],
                    "the old master replicates the new one",
                    30,
                )
                group.servers.append(old)
                events.append((time.monotonic() - began, "the old master is a replica again"))
            time.sleep(0.05)
        for beat in fleet.values():
            beat.stop()
        if args.logs:
            for log in tmp.glob("beat-*.log"):
                (args.logs / log.name).write_text(log.read_text(errors="replace"))
        watch.done.set()
        watch.join(5)
        client = redis.Redis.from_url(broker.url)
        messages = sent(client)
        skipped = skips(locks)
        client.close()
    found = chains(messages, skipped)
    return {
        "seconds": args.seconds,
        "ttl": args.ttl,
        "events": [f"{at:5.1f} s: {what}" for at, what in events],
        "takeovers": takeovers,
        "entries": {
            entry: {
                "messages": len(chain.messages),
                "sent_twice": len(chain.doubled),
                "lost": len(chain.broken),
                "skipped": len(chain.skipped),
                "max_late": round(max(chain.late), 3) if chain.late else None,
                "late_over_1s": [round(x, 3) for x in chain.late if x > 1.0],
            }
            for entry, chain in sorted(found.items())
        },
        "leader_changes": len(watch.changes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--ttl", type=float, default=3.0)
    parser.add_argument("--sentinel", action="store_true")
    parser.add_argument("--django", action="store_true", help="django-celery-beat's scheduler")
    parser.add_argument("--baseline", action="store_true")
    parser.add_argument("--quick", action="store_true", help="30 s instead of --seconds")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--logs", type=Path, help="keep the beats' logs in this directory")
    args = parser.parse_args()
    if args.quick:
        args.seconds = 30.0
    results: dict[str, Any] = {}
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.logs) as tmp:
        if args.baseline:
            results["baseline"] = baseline(10.0, Path(tmp))
            print(f"three plain beats, 10 s: {results['baseline']}", flush=True)
        results["leader"] = measure(args, Path(tmp))
    run = results["leader"]
    inner = "DatabaseScheduler" if args.django else "PersistentScheduler"
    print(f"\nthree leader beats ({inner}), {run['seconds']:g} s, ttl {run['ttl']:g} s")
    for line in run["events"]:
        print(f"  {line}")
    bound = run["ttl"] + MAX_INTERVAL
    for i, took in enumerate(run["takeovers"], 1):
        shown = "none" if took is None else f"{took:.2f} s"
        print(f"  takeover {i}: {shown} (bound: ttl + one beat interval = {bound:g} s)")
    for entry, figures in run["entries"].items():
        print(f"  entry {entry}: {figures}")
    ok = all(f["sent_twice"] == 0 and f["lost"] == 0 for f in run["entries"].values()) and all(
        t is not None and t <= bound for t in run["takeovers"]
    )
    print(f"\nevery tick sent once, takeovers within the bound: {'yes' if ok else 'NO'}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
