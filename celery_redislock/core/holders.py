"""Reading a lock's live leases (``holders.lua``) as :class:`~celery_redislock.Holder` records:
one function, shared by :meth:`Lock.holders` and the admin API, so both report a lease alike."""

from __future__ import annotations

from typing import NamedTuple

from .keys import LockKeys
from .protocol import HoldersReply
from .scripts import run
from .store import Holder, RedisClient, backend_errors

__all__ = ["LiveHolders", "read_holders"]


class LiveHolders(NamedTuple):
    """The live leases of one lock, oldest fence first, and the server's clock as they were
    read (ms since the epoch)."""

    holders: list[Holder]
    server_ms: int


def read_holders(client: RedisClient, keys: LockKeys, name: str) -> LiveHolders:
    """The live leases of the lock ``name`` whose keys are ``keys``, read in one script call
    (expiry by the server's clock); a Redis failure is a ``LockBackendError`` naming ``name``."""
    with backend_errors(name):
        reply = HoldersReply.decode(run("holders", client, [keys.leases, keys.meta], []))
    holders = [
        Holder(
            token=live.token,
            mode=live.mode,
            fence=live.fence,
            owner=live.owner,
            info=live.info,
            count=live.entered,
            expires_in=(live.expires_at_ms - reply.now_ms) / 1000,
        )
        for live in reply.leases
    ]
    holders.sort(key=lambda h: h.fence)
    return LiveHolders(holders, reply.now_ms)
