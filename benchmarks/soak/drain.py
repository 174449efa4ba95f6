"""The soak's drain (``benchmarks/soak``): once the chaos is over, waiting for the workers to
give every task sent an outcome."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis

from .brokers import RabbitBroker, RedisBroker
from .ledger import read_runs, read_states
from .records import FINAL_STATES, Sent

QUIET_S = 3.0  # nothing queued nor unacknowledged for this long: the drain is over


def drain(
    broker: RedisBroker | RabbitBroker,
    main: redis.Redis,
    ledger: redis.Redis,
    app: Any,
    sent: Sequence[Sent],
    bound_s: float,
) -> str:
    """Waits until every task sent has an outcome or nothing is left to run; says which."""
    deadline = time.monotonic() + bound_s
    quiet_since: float | None = None
    waiting = {s.task_id for s in sent}
    while time.monotonic() < deadline:
        done = {r.task_id for r in read_runs(ledger) if r.end is not None}
        waiting -= done
        if waiting:
            states = read_states(main, app, sorted(waiting))
            waiting -= {t for t, meta in states.items() if meta.get("status") in FINAL_STATES}
        if not waiting:
            return "every task sent has an outcome"
        if broker.backlog() == 0:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= QUIET_S:
                return f"nothing queued nor unacknowledged for {QUIET_S:g} s"
        else:
            quiet_since = None
        time.sleep(0.5)
    return f"bound of {bound_s:g} s reached"
