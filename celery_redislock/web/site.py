"""What one web view is made with: its Redis, namespace, guard and hand-over."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.handover import Handover
from ..core.lease import RedisClient
from .auth import Guard

__all__ = ["Site"]


@dataclass(frozen=True)
class Site:
    """The Redis and namespace the view looks at, who may act, and how a release hands the lock
    on (as the CLI's target: a framework's ``handover`` publishes the parked tasks; ``None``, a
    worker's sweeper does at its next sweep)."""

    client: RedisClient
    namespace: str
    guard: Guard
    fence_keep: float
    handover: Handover | None
    handover_window: float
    title: str
