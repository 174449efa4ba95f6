"""The rate slot and the lease of the run going on in this thread, for the task's body: what it
waited, the limits in effect, and the two things a body may tell its limit: what the call really
cost (:meth:`RateSlot.settle`) and that the upstream said 429 (:meth:`RateSlot.pause`); and the
lease it holds (``lock=``), whose lock it may pause too (:meth:`Lease.pause`).

>>> slot = current_rate()          # doctest: +SKIP
>>> slot.settle(response.usage.total_tokens) if slot else None   # doctest: +SKIP
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ...errors import LockConfigError
from ..lock import Lease
from ..rate import RateLimit, Reservation

__all__ = ["RateSlot", "current_lease", "current_rate", "set_current_lease", "set_current_rate"]


@dataclass(frozen=True, slots=True)
class RateSlot:
    """The rate slot a running task took (``rate=``): ``limits`` it took it in (one, or
    several taken all or nothing) with their ``costs``, ``reservation`` (its slot and the
    figures of the limit that set it), ``waited`` (seconds from its first try to its start, in
    this delivery)."""

    limits: tuple[RateLimit, ...]
    request_id: str
    reservation: Reservation
    costs: tuple[float, ...]
    waited: float

    @property
    def name(self) -> str:
        """The name of the (first) limit."""
        return self.limits[0].name

    def _chosen(self, name: str | None) -> list[tuple[RateLimit, float]]:
        chosen = [
            (limit, cost)
            for limit, cost in zip(self.limits, self.costs, strict=True)
            if name is None or limit.name == name
        ]
        if not chosen:
            names = [limit.name for limit in self.limits]
            raise LockConfigError(f"this task's rate limits are {names}, not {name!r}", name=name)
        return chosen

    def settle(self, cost: float, *, name: str | None = None) -> None:
        """Tells the limit what this call really cost (see :meth:`RateLimit.settle`): more
        than reserved is owed by later calls, less is given back. Safe to call again. With
        several limits: each of them, or the one ``name``."""
        for limit, reserved in self._chosen(name):
            limit.settle(self.request_id, cost, estimate=reserved)

    def pause(self, seconds: float, *, name: str | None = None) -> None:
        """Pauses the limit for ``seconds`` (the upstream answered 429 with a Retry-After):
        no call under it starts until then, on any worker (see :meth:`RateLimit.pause`). With
        several limits: each of them, or the one ``name``."""
        for limit, _ in self._chosen(name):
            limit.pause(seconds)


_local = threading.local()


def current_rate() -> RateSlot | None:
    """The rate slot of the task running in this thread (``None`` outside a task with
    ``rate=``, or before it started).

    >>> @app.task(rate={"rate": "90000/m", "burst": 20000, "cost": 4000})   # doctest: +SKIP
    ... def summarize(doc_id):
    ...     reply = llm.complete(...)
    ...     current_rate().settle(reply.usage.total_tokens)
    """
    slot = getattr(_local, "slot", None)
    return slot if isinstance(slot, RateSlot) else None


def set_current_rate(slot: RateSlot | None) -> None:
    """Called by the run as it takes (or gives up) a slot."""
    _local.slot = slot


def current_lease() -> Lease | None:
    """The lease of the task running in this thread (``None`` outside a task with ``lock=``,
    or while it runs without one; of a ``lock=`` list, the first lock's), on every framework.

    >>> @app.task(lock={"key": "partner-api", "limit": 5})   # doctest: +SKIP
    ... def call_partner(order_id):
    ...     try:
    ...         partner.post(order_id)
    ...     except TooManyRequests as exc:
    ...         current_lease().pause(exc.retry_after)  # no new call on any worker meanwhile
    ...         raise
    """
    lease = getattr(_local, "lease", None)
    return lease if isinstance(lease, Lease) else None


def set_current_lease(lease: Lease | None) -> None:
    """Called by the run as it takes (or gives back) its lease."""
    _local.lease = lease
