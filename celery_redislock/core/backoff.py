"""How long a job that found its lock held stays away before it tries again: the same rule for
every integration, so a Celery task and an RQ job back off alike."""

from __future__ import annotations

import random

__all__ = ["conflict_delay", "first_delivery_delay"]

# Past 2**5 the delay stops growing: a long-held lock is polled, at worst, every 32 countdowns.
MAX_DOUBLINGS = 5


def conflict_delay(countdown: float, conflicts: int) -> float:
    """Seconds until the next try after ``conflicts`` earlier ones: ``countdown`` doubled per
    conflict, drawn from its upper half so duplicates do not come back together.

    >>> 1.0 <= conflict_delay(2.0, 0) <= 2.0
    True
    """
    base = countdown * float(2 ** min(conflicts, MAX_DOUBLINGS))
    return random.uniform(base / 2, base)


def first_delivery_delay(ttl: float, expires_in: float, waits: int) -> float:
    """Seconds until a copy of a job whose first delivery still holds its lease looks again:
    when that lease would lapse (its holder died) or a third of the ttl, doubled per wait, if
    sooner, plus a little jitter.

    >>> 0.1 <= first_delivery_delay(15.0, 0.0, 0) <= 0.5
    True
    """
    backoff = ttl / 3 * float(2 ** min(waits, MAX_DOUBLINGS))
    return min(max(expires_in, 0.0), backoff) + random.uniform(0.1, 0.5)
