"""The soak's producer (``benchmarks/soak``): a steady mix of locked calls, from a thread."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import Counter
from types import ModuleType
from typing import Any

import redis

from .records import Sent

# The producer's mix: kind -> share of the calls.
MIX = {"exclusive": 0.35, "cap": 0.2, "read": 0.2, "write": 0.07, "unique": 0.18}
EXCLUSIVE_KEYS = 4
UNIQUE_KEYS = 3
RESOURCE = "doc"
BODY_S = (0.05, 0.5)


class Producer(threading.Thread):
    """Publishes a steady mix of calls at ``rate`` per second until stopped or ``duration``
    passed; a call counts as sent only if it published a message (``after_task_publish``)."""

    def __init__(
        self, soakapp: ModuleType, ledger: redis.Redis, rng: random.Random, rate: float,
        duration: float,
    ) -> None:  # fmt: skip
        super().__init__(name="soak-producer", daemon=True)
        self.soakapp, self.ledger, self.rng = soakapp, ledger, rng
        self.rate, self.duration = rate, duration
        self.stopping = threading.Event()
        self.sent: list[Sent] = []
        self.calls: Counter[str] = Counter()
        self.errors: list[str] = []
        self._published: list[str] = []

    def note_publish(self, sender: Any = None, headers: Any = None, **_: Any) -> None:
        # Called inside apply_async, in this thread, once per message really published.
        if threading.current_thread() is self and headers and headers.get("id"):
            self._published.append(headers["id"])

    def run(self) -> None:
        period = 1 / self.rate
        began = time.monotonic()
        for i in range(int(self.duration * self.rate) + 1):
            wait = began + i * period - time.monotonic()
            if self.stopping.wait(max(0.0, wait)) or time.monotonic() - began >= self.duration:
                return
            self.call(i)

    def call(self, i: int) -> None:
        app, rng = self.soakapp, self.rng
        kind = rng.choices(list(MIX), weights=list(MIX.values()))[0]
        seconds = round(rng.uniform(*BODY_S), 3)
        args: tuple[Any, ...]
        if kind == "exclusive":
            key = str(rng.randrange(EXCLUSIVE_KEYS))
            task, args, lock = app.exclusive, (key, seconds), f"k:{key}"
        elif kind == "cap":
            task, args, lock = app.capped, (i, seconds), "api"
        elif kind in ("read", "write"):
            task, args, lock = getattr(app, kind), (RESOURCE, seconds), f"rw:{RESOURCE}"
        else:
            n = rng.randrange(UNIQUE_KEYS)
            task, args, lock = app.unique, (n, seconds), f"u:{n}"
        self.calls[kind] += 1
        before = len(self._published)
        try:
            result = task.apply_async(args)
        except Exception as exc:  # counted, never a send: nothing was published
            self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
            return
        if result.id in self._published[before:]:
            self.sent.append(Sent(result.id, kind, lock, time.time_ns() // 1000))
            with contextlib.suppress(redis.RedisError):
                self.ledger.hset("soak:sent", result.id, json.dumps({"kind": kind, "lock": lock}))
