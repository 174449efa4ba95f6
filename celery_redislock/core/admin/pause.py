"""A lock paused for a while (an upstream answered 429, or an operator says so) and resumed:
while paused, no new lease of the lock ``name`` is handed out, by any path (an acquire, a task
parking in the task line, a release handing the lock on, a sweeper); the leases held keep
running, renewing and releasing. Tasks on the key meet it as a held lock and do what their
``on_conflict`` says (skip, retry later, wait, raise, wait in the task line). The pause is the
end time in the name's ``:limits`` hash (field ``lock_paused``, read by ``fits`` in
``lua/_grant.lua``), which expires with it when it holds nothing else: it outlives no one.

>>> pause_lock(redis.Redis(), "partner-api", 30)    # doctest: +SKIP
LockPause(name='partner-api', paused_for=30.0, handed_on=0)
>>> resume_lock(redis.Redis(), "partner-api")       # doctest: +SKIP
LockPause(name='partner-api', paused_for=0.0, handed_on=1)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..handover import DEFAULT_HANDOVER_WINDOW, Handover
from ..keys import DEFAULT_NAMESPACE, check_name, check_namespace
from ..lock import DEFAULT_FENCE_KEEP, Lock, check_pause
from ..store import RedisClient, backend_errors
from .limits import call_limits

__all__ = ["LockPause", "pause_lock", "resume_lock"]


@dataclass(frozen=True, slots=True)
class LockPause:
    """The pause of the lock ``name`` after :func:`pause_lock` or :func:`resume_lock`."""

    name: str
    paused_for: float
    """Seconds left of the pause (0: not paused)."""
    handed_on: int = 0
    """:func:`resume_lock`: the waiters and parked tasks it handed the lock to."""


def pause_lock(
    client: RedisClient, name: str, seconds: float, *, namespace: str = DEFAULT_NAMESPACE
) -> LockPause:
    """Hands out no new lease of the lock ``name`` for ``seconds`` from now, on any worker
    (leases held go on); a longer pause already set is kept. Up to 30 days. Safe to call again
    (its end moves by the time between the calls at most).

    >>> pause_lock(redis.Redis(), "partner-api", 30).paused_for   # doctest: +SKIP
    30.0
    """
    name, namespace = check_name(name), check_namespace(namespace)
    ms = check_pause(seconds, name)
    found = call_limits(client, name, namespace, "p", str(ms), what="lock")
    return LockPause(name, found.lock_paused_for)


def resume_lock(
    client: RedisClient,
    name: str,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    fence_keep: float = DEFAULT_FENCE_KEEP,
    handover: Handover | None = None,
    handover_window: float = DEFAULT_HANDOVER_WINDOW,
) -> LockPause:
    """Ends a pause of the lock ``name`` now (nothing happens without one) and hands the lock on
    at once, as a release does: the next tasks in its task line are handed the lock and
    published by ``handover`` (a framework's publisher, as a lock's; without one, a worker's
    sweeper publishes them at its next sweep), and a blocked waiter is woken (a fair lock's
    waiters look again within a second, and are served in order). ``fence_keep``: as the
    lock's. Safe to call again after a lost reply: the same hand-overs are answered.

    >>> resume_lock(redis.Redis(), "partner-api").paused_for   # doctest: +SKIP
    0.0
    """
    lock = Lock(
        client,
        check_name(name),
        ttl=1,
        namespace=check_namespace(namespace),
        fence_keep=fence_keep,
        handover=handover,
        handover_window=handover_window,
    )
    request = os.urandom(8).hex()
    found = call_limits(client, lock.name, lock.namespace, "q", lock.spec, request, what="lock")
    with backend_errors(lock.name):
        lock._notify(found.granted)  # wakes the waiters, publishes the parked tasks
    return LockPause(lock.name, found.lock_paused_for, handed_on=len(found.granted))
