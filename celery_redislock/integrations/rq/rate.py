"""``rate=`` for RQ jobs: a job's start takes a slot of its fleet-wide rate limit. A slot a
moment ahead is waited for in the horse; a later one makes the job come back just before it
(RQ's ``Retry``, whole seconds, through the scheduler), keeping its reservation, and wait the
rest in place."""

from __future__ import annotations

import math
import time
import uuid
from typing import TYPE_CHECKING

from ...core import outcomes
from ...core.naming import lock_name
from ...core.rate import RateLimit
from ...errors import LockBackendError, LockNotAcquired
from ._compat import Retry, retry_after, save_meta
from .signals import lock_backend_error

if TYPE_CHECKING:
    from .running import _Run

__all__ = ["RATE_META", "take_rate_slot"]

RATE_META = "redislock_rate"
"""``job.meta`` key: the request id holding the job's reserved slot while it waits for it."""
# A slot at most this far ahead is waited for in the horse. RQ's scheduler brings a delayed
# job back in whole seconds and looks every second, so a later slot comes back this early.
_WAIT_IN_PLACE_S = 2.0
_BACK_EARLY_S = 2.0


def take_rate_slot(run: _Run) -> object:
    """``None``: the start fits the job's rate limit (waited for in place if due within 2 s);
    otherwise a ``Retry`` that brings the job back just before its slot. Fails the job past
    ``max_delay``, and on a backend error as the policy says."""
    spec, job = run.spec, run.job
    options = spec.rate
    assert options is not None
    name = lock_name(spec.name, options.keying, spec.signature, run.args, run.kwargs)
    meta = job.meta if job is not None else {}
    request_id = str(meta.get(RATE_META) or f"{run.job_id}.{uuid.uuid4().hex[:12]}")
    limit = RateLimit(run.client, name, options.reserved, namespace=run.settings.namespace)
    try:
        slot = limit.reserve(request_id, max_delay=options.max_delay, max_late=options.slack)
    except LockBackendError as exc:
        if lock_backend_error.receivers:
            lock_backend_error.send(
                sender=spec.name,
                task_id=run.job_id,
                lock=name,
                error=exc,
                policy=run.settings.on_backend_error,
            )
        return run.backend_down(name, exc)
    if not slot.granted:
        run.signal_conflict(name, "rate", [])
        raise LockNotAcquired(
            f"job {spec.name}[{run.job_id}]: rate limit {name!r} ({options.rate}) has no start "
            f"free for {slot.delay:.1f}s, past max_delay ({options.max_delay}s)",
            name=name,
        )
    # A job brought back for its slot came early on purpose: it waits the rest in place.
    in_place = _BACK_EARLY_S + _WAIT_IN_PLACE_S if RATE_META in meta else _WAIT_IN_PLACE_S
    if slot.delay <= in_place or job is None:
        if slot.delay:
            time.sleep(slot.delay)
        if job is not None and RATE_META in job.meta:
            del job.meta[RATE_META]
            save_meta(job)
        return None
    outcomes.rate_full(spec.name, run.job_id, name, options.rate, slot.delay)
    run.signal_conflict(name, "rate", [])
    job.meta[RATE_META] = request_id
    save_meta(job)
    # Whole seconds, and the scheduler looks once a second: back between 1 and 2 s early.
    come_back = float(max(1, math.floor(slot.delay - _BACK_EARLY_S)))
    run.keep_claim(come_back)
    retry: Retry = retry_after(job, come_back)
    return retry
