"""Reading a lock's live leases (``holders.lua``) as :class:`~celery_redislock.Holder` records:
shared by :meth:`Lock.holders` and the admin API, so both report a lease alike."""

from __future__ import annotations

from typing import NamedTuple

from .keys import LockKeys
from .protocol import HoldersReply
from .scripts import run
from .store import Holder, RedisClient, backend_errors

__all__ = ["LiveHolders", "holders_of", "read_holders"]


class LiveHolders(NamedTuple):
    """The live leases of one lock, oldest fence first, and the server's clock as they were
    read (ms since the epoch)."""

    holders: list[Holder]
    server_ms: int


def holders_of(reply: HoldersReply) -> list[Holder]:
    """The leases of one ``holders.lua`` reply, oldest fence first (expiry by its clock)."""
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
    return sorted(holders, key=lambda h: h.fence)


def read_holders(client: RedisClient, keys: LockKeys, name: str) -> LiveHolders:
    """The live leases of the lock ``name`` whose keys are ``keys``, read in one script call;
    a Redis failure is a ``LockBackendError`` naming ``name``."""
    with backend_errors(name):
        reply = HoldersReply.decode(run("holders", client, [keys.leases, keys.meta], []))
    return LiveHolders(holders_of(reply), reply.now_ms)
