"""Which key layout a namespace's locks use: the fast path (``lua/lean_*.lua``: a plain mutex's
one lease in its meta hash) or the general path only.

A lease taken on the fast path lives in the lock's meta hash alone, where earlier releases
never look: a worker of an earlier release would take a lock such a lease holds. A namespace is
therefore switched to the fast path only once no such worker runs, by the key
``<namespace>:layout``: ``lean`` lets the fast path run; anything else, or no key, keeps every
lock on the general path, whose leases every release sees (and which sees the fast path's: a
namespace can be switched back). Each process reads it at most every :data:`CHECK_S` seconds,
per Redis client: within that time of a switch, every process follows.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import redis

from ..errors import LockConfigError

__all__ = [
    "CHECK_S",
    "SHARED",
    "layout_key",
    "lean_allowed",
    "lean_allowed_async",
    "read_layout",
    "set_layout",
]

CHECK_S = 30.0
"""How long a process trusts what it read of a namespace's layout."""

SHARED = b"shared"
LEAN = b"lean"

# client -> namespace -> (fast path allowed, when it was read: time.monotonic()).
_seen: weakref.WeakKeyDictionary[Any, dict[str, tuple[bool, float]]] = weakref.WeakKeyDictionary()


def layout_key(namespace: str) -> str:
    return f"{namespace}:layout"


def _cached(client: Any, namespace: str) -> bool | None:
    seen = _seen.get(client, {}).get(namespace)
    if seen is not None and time.monotonic() - seen[1] < CHECK_S:
        return seen[0]
    return None


def _note(client: Any, namespace: str, value: Any) -> bool:
    allowed = bool(value == LEAN or value == LEAN.decode())
    _seen.setdefault(client, {})[namespace] = (allowed, time.monotonic())
    return allowed


def lean_allowed(client: Any, namespace: str) -> bool:
    """Whether locks of ``namespace`` on ``client`` may take the fast path. A failure to read it
    says no, unremembered (the general path then reports the failure, or works)."""
    known = _cached(client, namespace)
    if known is not None:
        return known
    try:
        value = client.get(layout_key(namespace))
    except redis.RedisError:
        return False
    return _note(client, namespace, value)


async def lean_allowed_async(client: Any, namespace: str) -> bool:
    """:func:`lean_allowed` for redis-py's asyncio client."""
    known = _cached(client, namespace)
    if known is not None:
        return known
    try:
        value = await client.get(layout_key(namespace))
    except redis.RedisError:
        return False
    return _note(client, namespace, value)


def read_layout(client: Any, namespace: str) -> str:
    """``namespace``'s layout as its key says: ``"lean"`` or ``"shared"`` (the default)."""
    allowed = _note(client, namespace, client.get(layout_key(namespace)))
    return "lean" if allowed else "shared"


def set_layout(client: Any, namespace: str, layout: str) -> None:
    """Writes ``namespace``'s layout, ``"shared"`` or ``"lean"``: every process follows within
    :data:`CHECK_S` seconds (and this one at once)."""
    if layout not in ("shared", "lean"):
        raise LockConfigError(f"layout must be 'shared' or 'lean', got {layout!r}", name=None)
    client.set(layout_key(namespace), layout)
    _seen.get(client, {}).pop(namespace, None)
