"""Renewing RedLock leases: every master renews the whole batch in one call, all masters at once,
and a lease stays held only if a majority renewed it before its current validity ran out.

The validity of a lease taken or renewed at (local, monotonic) time ``t`` ends at
``t + ttl - drift``, with ``drift = 1% of ttl + 2 ms``: the masters' clocks may run a little
faster than this process's, and a lease must be known lost here before any master can drop it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis

from .protocol import RenewReply
from .redlock_masters import gather, on_each, quorum
from .replicas import pipelined
from .server_store import renew_calls
from .store import LeaseView, Renewals

__all__ = ["DRIFT_FACTOR", "DRIFT_FLOOR", "drift", "renew_on_masters"]

DRIFT_FACTOR = 0.01
"""The masters' clocks may gain this fraction of a ttl on this process's clock."""
DRIFT_FLOOR = 0.002
"""Seconds of drift allowed on top (timer resolution)."""


def drift(ttl: float) -> float:
    """The part of ``ttl`` a lease is not counted on for: ``1% of ttl + 2 ms``.

    >>> from celery_redislock.core.redlock_renew import drift
    >>> round(drift(10.0), 3)
    0.102
    """
    return ttl * DRIFT_FACTOR + DRIFT_FLOOR


def renew_on_masters(
    masters: Sequence[redis.Redis], leases: Sequence[LeaseView], ttl: float | None = None
) -> Renewals:
    """Renews ``leases`` (of RedLocks over ``masters``) on every master at once: for each, in
    order, its expiry (> 0: renewed on a majority in time, the server time until which a
    majority has it; 0: lost, as a majority no longer has it or the answer came after its
    validity; -1: not known, too few masters answered), its validity's end, and why it was not
    renewed. Touches no lease, so it may run on any thread."""
    need = quorum(len(masters))
    calls = renew_calls(leases, ttl)  # one per distinct ttl: usually one
    batch = [(keys, args) for _, keys, args in calls]
    indexes = [which for which, _, _ in calls]

    def renew(master: redis.Redis) -> list[int]:
        replies, _ = pipelined(master, "renew", batch, None)
        out = [0] * len(leases)
        for which, raw in zip(indexes, replies, strict=True):
            for i, expiry in zip(which, RenewReply.decode(raw).expiries, strict=True):
                out[i] = expiry
        return out

    sent = time.monotonic()
    futures = on_each(masters, renew)
    # Past the last validity nothing can be renewed in time: stop waiting there.
    gather(futures, lambda: False, max(lease.valid_until for lease in leases))
    answered = time.monotonic()
    per_master: list[list[int] | None] = []
    errors: list[str] = []
    for future in futures:
        if future.done() and future.exception() is None:
            per_master.append(future.result())
        else:
            per_master.append(None)
            error = future.exception() if future.done() else None
            errors.append(
                f"{type(error).__name__}: {error}" if error is not None else "no answer in time"
            )
    expiries_out: list[int] = []
    valid_out: list[float] = []
    whys: list[str | None] = []
    for i, lease in enumerate(leases):
        got = [expiries[i] for expiries in per_master if expiries is not None]
        renewed = sorted((e for e in got if e > 0), reverse=True)
        gone = sum(1 for e in got if e == 0)
        held_for = ttl if ttl is not None else lease.lock.ttl
        expiry, valid_until, why = -1, lease.valid_until, None
        if answered >= lease.valid_until:
            expiry, why = 0, "the renewal answered after its validity"
        elif len(renewed) >= need:
            expiry, valid_until = renewed[need - 1], sent + held_for - drift(held_for)
        elif gone > len(masters) - need:
            expiry, why = 0, f"{gone} of {len(masters)} masters no longer hold it"
        else:
            why = (
                f"renewed on {len(renewed)} of {len(masters)} masters, a majority ({need}) is "
                f"needed ({'; '.join(errors) or 'no answer'})"
            )
        expiries_out.append(expiry)
        valid_out.append(valid_until)
        whys.append(why)
    return Renewals(expiries_out, valid_out, whys)
