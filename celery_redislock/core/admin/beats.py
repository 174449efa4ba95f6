"""The leaders of beat fleets (``LeaderScheduler``): which beat leads each, where, since when,
read from the leader lease's holder record (see :mod:`celery_redislock.core.beat`)."""

from __future__ import annotations

from ..beat_leader import LeaderInfo, leader_of
from ..keys import DEFAULT_NAMESPACE
from ..lease import RedisClient
from .listing import iter_locks

__all__ = ["list_beats"]


def list_beats(
    client: RedisClient, pattern: str = "*", namespace: str = DEFAULT_NAMESPACE
) -> list[LeaderInfo]:
    """The leader of each beat fleet whose name matches the glob ``pattern``, by name; a fleet
    whose leader's lease lapsed (no beat leads now) is left out.

    >>> [(b.name, b.host) for b in list_beats(redis.Redis())]   # doctest: +SKIP
    [('proj', 'web-1')]
    """
    names = sorted(
        {n.removeprefix("beat:") for n in iter_locks(client, namespace, f"beat:{pattern}")}
    )
    found = [leader_of(client, name, namespace) for name in names]
    return [leader for leader in found if leader is not None]
