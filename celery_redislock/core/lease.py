"""A lease and what holds it (:class:`Lease`, :class:`Holder`, :func:`renew_leases`), gathered
from :mod:`.lock` and :mod:`.store` where users import them from."""

from __future__ import annotations

from .lock import Lease, RenewReport, renew_leases
from .protocol import Mode
from .store import Holder, RedisClient, backend_errors

__all__ = [
    "Holder",
    "Lease",
    "Mode",
    "RedisClient",
    "RenewReport",
    "backend_errors",
    "renew_leases",
]
