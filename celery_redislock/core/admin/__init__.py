"""Operating on locks from outside their holders (the CLI, the pytest plugin, the
integrations; no framework): :mod:`.reading` what a lock's records say, :mod:`.listing` finding
locks by pattern, :mod:`.release` freeing leases (by token, task id, or a whole namespace),
:mod:`.claims` unique tasks' queued claims, :mod:`.beats` the leaders of beat fleets,
:mod:`.limits` limits set and rate limits paused live, :mod:`.pause` locks paused and resumed.
Import the names from here.

>>> from celery_redislock.core import admin
>>> [s.name for s in admin.list_locks(redis.Redis(), "sync:*")]   # doctest: +SKIP
['sync:42']
"""

from __future__ import annotations

from .beats import list_beats
from .claims import ClaimState, describe_claim, force_release_claim, iter_claims, list_claims
from .limits import (
    RateState,
    clear_limits,
    describe_rate,
    list_rates,
    pause_rate,
    resume_rate,
    set_limits,
)
from .listing import iter_locks, list_locks
from .pause import LockPause, pause_lock, resume_lock
from .reading import TEST_HOLDER, LockState, Waiter, describe_holder, describe_lock
from .release import Released, force_release, release_all

__all__ = [
    "TEST_HOLDER",
    "ClaimState",
    "LockPause",
    "LockState",
    "RateState",
    "Released",
    "Waiter",
    "clear_limits",
    "describe_claim",
    "describe_holder",
    "describe_lock",
    "describe_rate",
    "force_release",
    "force_release_claim",
    "iter_claims",
    "iter_locks",
    "list_beats",
    "list_claims",
    "list_locks",
    "list_rates",
    "pause_lock",
    "pause_rate",
    "release_all",
    "resume_lock",
    "resume_rate",
    "set_limits",
]
