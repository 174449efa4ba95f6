"""The logger of each way a locked run ends other than by running (skipped, superseded, retried,
parked, dropped...): :class:`~celery_redislock.core.run.run.LockedRun` words each line once, so a
Celery task and an RQ job that end the same way log the same line, at the same level, here."""

from __future__ import annotations

import logging
from collections.abc import Sequence

__all__ = ["held_by", "log"]

log = logging.getLogger(__name__)


def held_by(holders: Sequence[str]) -> str:
    """Who holds a lock, as the lines say it (no holder left: it was just released)."""
    return ", ".join(holders) or "a task that just finished"
