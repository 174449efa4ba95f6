"""Who leads a fleet of beats, read from outside (``redislock beat``, the web view): the leader
lock's name and its holder's record; and what the leader's side and a framework's scheduler
share: the missed-tick policies, and a moment as exact microseconds since the epoch (how a run
is named in Redis: see :mod:`.beat`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from ..errors import LockConfigError
from .keys import DEFAULT_NAMESPACE, check_name
from .lock import Lock
from .store import RedisClient

__all__ = [
    "MISSED_POLICIES",
    "LeaderInfo",
    "check_missed",
    "from_micros",
    "leader_lock_name",
    "leader_of",
    "micros",
]

MISSED_POLICIES = ("send", "skip")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros(moment: datetime) -> int:
    """``moment`` (naive: UTC) as whole microseconds since the epoch, exactly (no float)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(value: int) -> datetime:
    """The UTC moment ``value`` microseconds after the epoch (the inverse of :func:`micros`)."""
    seconds, rest = divmod(value, 1_000_000)
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=rest)


def check_missed(value: object, what: str) -> str:
    """A missed-tick policy, ``"send"`` or ``"skip"``; else :class:`LockConfigError` saying
    ``what``."""
    if value not in MISSED_POLICIES:
        raise LockConfigError(f"{what}: must be one of 'send', 'skip', got {value!r}")
    return str(value)


def leader_lock_name(name: str) -> str:
    """The leader lock's name for a fleet of beats called ``name``."""
    return f"beat:{check_name(name, what='beat name')}"


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """The leader of a fleet of beats, as its lease's holder record says."""

    name: str
    host: str | None
    pid: str | None
    since: str | None
    expires_in: float


def leader_of(
    client: RedisClient, name: str, namespace: str = DEFAULT_NAMESPACE
) -> LeaderInfo | None:
    """The fleet ``name``'s leader now, or ``None`` while no beat leads."""
    lock = Lock(client, leader_lock_name(name), ttl=1, namespace=namespace)
    for holder in lock.holders():
        info = holder.info
        return LeaderInfo(
            name,
            _str_or_none(info.get("host")),
            _str_or_none(info.get("pid")),
            _str_or_none(info.get("since")),
            holder.expires_in,
        )
    return None


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)
