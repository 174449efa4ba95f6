"""The soak's chaos (``benchmarks/soak``): SIGKILLs of pool children and of whole workers, and
lost lock replies through the fault proxy."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis

from .ledger import ledger_now
from .records import Kill
from .workers import WORKERS, Fleet

# Chaos: every action of a bag is drawn (in a seeded order) before the bag is refilled, so a
# one-minute run sees each kind of fault; one action every 1-3 s.
CHAOS_BAG = ("child",) * 3 + ("worker",) + ("reset",) * 4 + ("drop",)
CHAOS_GAP_S = (1.0, 3.0)
AIM_AT_BUSY = 0.8  # how often a child kill picks a child that is running a task


class Chaos:
    """Kills pool children and whole workers and injects reply faults, one action at a time."""

    def __init__(
        self, fleet: Fleet, ledger: redis.Redis, proxy: Any, rng: random.Random,
        broker_redis: redis.Redis | None = None,
    ) -> None:  # fmt: skip
        self.fleet, self.ledger, self.proxy, self.rng = fleet, ledger, proxy, rng
        self.broker_redis = broker_redis  # the Redis broker, to watch a dead worker's BRPOP
        self.kills: list[Kill] = []
        self.armed: Counter[str] = Counter()
        self.restart_failures: list[str] = []
        self._bag: list[str] = []

    def next_action(self) -> str:
        if not self._bag:
            self._bag = list(
                CHAOS_BAG if self.proxy else [a for a in CHAOS_BAG if a in ("child", "worker")]
            )
            self.rng.shuffle(self._bag)
        return self._bag.pop()

    def run(self, until: float) -> None:
        """Acts until the monotonic time ``until``."""
        while True:
            gap = self.rng.uniform(*CHAOS_GAP_S)
            if time.monotonic() + gap >= until:
                time.sleep(max(0.0, until - time.monotonic()))
                return
            time.sleep(gap)
            self.supervise()
            self.act(self.next_action())

    def supervise(self) -> None:
        """Restarts a worker that exited by itself (not one of our kills): noted as a failure."""
        for name in WORKERS:
            code = self.fleet.proc(name).poll()
            if code is not None:
                self.restart_failures.append(f"{self.fleet.current[name]} exited with {code}")
                self.fleet.start(name)

    def act(self, action: str) -> None:
        ready = [n for n in WORKERS if self.fleet.ready(n)]
        if action == "worker":
            if len(ready) < len(WORKERS):
                if self._bag and self._bag[0] != action:
                    self._bag.insert(0, action)  # last in this bag: both are up again by then
                action = "child"
            else:
                self.kill_worker(self.rng.choice(ready))
                return
        if action == "child":
            if ready:
                self.kill_child(self.rng.choice(ready))
        elif action == "reset":
            self.proxy.reset_after(1, command="EVALSHA")
            self.armed[action] += 1
        elif action == "drop":
            self.proxy.drop_replies(1, command="EVALSHA")
            self.armed[action] += 1

    def kill_child(self, name: str) -> None:
        pool = self.fleet.pool(name)
        if not pool:
            return
        busy = {int(p) for p in self.ledger.hkeys("soak:busy")} & set(pool)
        targets = sorted(busy) if busy and self.rng.random() < AIM_AT_BUSY else pool
        pid = self.rng.choice(targets)
        self._kill("child", name, (pid,), lambda: os.kill(pid, signal.SIGKILL))

    def kill_worker(self, name: str) -> None:
        proc = self.fleet.proc(name)
        pids = (proc.pid, *self.fleet.pool(name))
        brpop: set[int] = set()
        if self.broker_redis is not None:
            with contextlib.suppress(OSError, redis.RedisError):
                brpop = brpop_clients(self.broker_redis, proc.pid)
        self._kill("worker", name, pids, lambda: os.killpg(proc.pid, signal.SIGKILL), brpop)
        proc.wait(10)
        self.fleet.start(name)  # right away, as a supervisor would

    def _kill(
        self, kind: str, name: str, pids: tuple[int, ...], kill: Any, brpop: set[int] = frozenset()
    ) -> None:  # fmt: skip
        group = self.fleet.proc(name).pid
        before = ledger_now(self.ledger)
        try:
            kill()
        except ProcessLookupError:
            return  # it had just exited: nothing was killed
        after = ledger_now(self.ledger)
        gone = None
        if brpop and self.broker_redis is not None:
            with contextlib.suppress(redis.RedisError):
                gone = self._brpop_gone(brpop)
        record = Kill(kind, name, group, pids, before, after, gone)
        self.kills.append(record)
        self.ledger.rpush("soak:kills", json.dumps(asdict(record)))

    def _brpop_gone(self, ids: set[int], bound_s: float = 1.0) -> int | None:
        """When Redis no longer lists any of these (a killed worker's BRPOP) clients."""
        assert self.broker_redis is not None
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            listed = {int(c["id"]) for c in self.broker_redis.client_list()}
            if not ids & listed:
                return ledger_now(self.ledger)
            time.sleep(0.001)
        return None


def _socket_ports(pid: int) -> set[int]:
    """Local TCP ports of the sockets process ``pid`` has open (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def brpop_clients(broker: redis.Redis, pid: int) -> set[int]:
    """Redis client ids of the BRPOP connections of worker process ``pid``."""
    ports = _socket_ports(pid)
    return {
        int(c["id"])
        for c in broker.client_list()
        if c.get("cmd") == "brpop" and int(c["addr"].rsplit(":", 1)[1]) in ports
    }
