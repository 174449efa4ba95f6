"""A lease and what holds it: a lock's token with its fence, expiry and owner (:class:`Lease`,
made by :class:`~celery_redislock.core.lock.Lock`); :class:`Holder`, a live lease as read back;
and :func:`renew_leases`, the batch renewal that extends many leases in one round trip per Redis
node. The names live in :mod:`.lock` and :mod:`.store` (a lease and its lock refer to each
other); this module gathers them where users import them from."""

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
