"""How much work the demo does, and the timings and limits its scenarios are judged by."""

from __future__ import annotations

from dataclasses import dataclass

PROCESSES = 4
# A worker that waits this long for a lock gives up: the scenario then fails instead of hanging.
ACQUIRE_TIMEOUT_S = 30.0
SCENARIO_TIMEOUT_S = 120.0
# Leases in the load scenarios are held for milliseconds: this ttl needs no renewal.
WORK_TTL_S = 10.0
CRASH_TTL_S = 1.0
# A process blocked on a dead holder's lock should get it this soon after the lease lapses.
CRASH_SLACK_MS = 500.0
COUNTER_SLEEP_MS = 2.0  # between the GET and the SET: the window a lost update would need
CAP_LIMIT = 3
READER_HOLD_MS = 15.0
WRITER_HOLD_MS = 5.0
WRITER_PAUSE_MS = 25.0
WRITER_MAX_WAIT_MS = 500.0
FAIR_HOLD_MS = 2.0


@dataclass(frozen=True, slots=True)
class Settings:
    """How much work each scenario does."""

    mutex_rounds: int
    cap_rounds: int
    cap_hold_ms: float
    writes: int
    fair_seconds: float
    crash_hold_s: float


QUICK = Settings(
    mutex_rounds=25, cap_rounds=15, cap_hold_ms=20, writes=12, fair_seconds=1.5, crash_hold_s=1.5
)
FULL = Settings(
    mutex_rounds=300, cap_rounds=120, cap_hold_ms=20, writes=80, fair_seconds=5, crash_hold_s=2.5
)
