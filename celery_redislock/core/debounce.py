"""Debounced calls (``unique={"lifecycle": "debounce", ...}``), once for every framework: a
call of a debounced key is kept in Redis as the key's pending call (or updates it: latest
wins), and nothing is published until the key has been quiet for its period (or ``max_wait``
passed since the pending call's first); then a worker's sweeper publishes it, with the id
every caller was handed. The payload is the framework's (the adapter encodes the call and
publishes it); the scripts are ``pending_call.lua``, ``pending_take.lua`` and
``pending_sent.lua``."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import NamedTuple

from .forkguard import FORK_GUARD
from .keys import LockKeys
from .protocol import text
from .scripts import run
from .store import RedisClient, backend_errors

__all__ = ["PUBLISH_WINDOW_S", "Deferred", "defer", "pending_key", "sweep_pending"]

log = logging.getLogger(__name__)

PUBLISH_WINDOW_S = 30.0
"""Seconds a call taken for publishing stays taken: past it (its publisher died before it
confirmed the publish) a sweeper takes it again."""

# A listed key is forgotten only if its listing is older than this: a call lists its key just
# before it writes its pending call, so a younger listing may name a call not yet written.
_FORGET_AFTER_S = 10.0


class Deferred(NamedTuple):
    """A debounced call kept: ``id`` is the pending call's (what the caller is handed), ``due``
    the server time (ms) it is published at unless another call moves it, ``made`` whether
    this call made the pending call (else it updated it)."""

    id: str
    due_ms: int
    made: bool


def pending_key(namespace: str) -> str:
    """The hash of debounced keys with a pending call (name -> when to look), for sweepers."""
    return f"{namespace}:{{pending}}"


def defer(
    client: RedisClient,
    namespace: str,
    name: str,
    call_id: str,
    payload: str,
    *,
    quiet: float,
    max_wait: float | None,
) -> Deferred:
    """Keeps a call of the debounced key ``name`` as its pending call, or updates the pending
    one with ``payload`` (latest wins); due ``quiet`` seconds from now, but at most
    ``max_wait`` seconds after the pending call's first. Three round trips: the key is listed
    for sweepers first (to look at now: a producer may die before the last step), so that no
    pending call is ever unlisted; then listed again with its due time.

    >>> defer(r, "redislock", "sync:7", "id-1", payload, quiet=5.0, max_wait=60.0)  # doctest: +SKIP
    Deferred(id='id-1', due_ms=1795000005000, made=True)
    """
    _list(client, namespace, name, time.time())
    with backend_errors(name):
        raw = run(
            "pending_call",
            client,
            [LockKeys.of(namespace, name).pending],
            [call_id, payload, str(_ms(quiet)), str(_ms(max_wait or 0.0))],
        )
    kept = Deferred(text(raw[0]), int(raw[1]), text(raw[2]) == "1")
    _list(client, namespace, name, kept.due_ms / 1000)
    return kept


def sweep_pending(
    client: RedisClient,
    namespace: str,
    publish: Callable[[str, str], None],
    *,
    window: float = PUBLISH_WINDOW_S,
) -> int:
    """Publishes the debounced calls of ``namespace`` that are due (``publish(id, payload)``,
    the framework's); returns how many. A publish that raises is logged and tried again after
    ``window`` seconds; nothing is dropped. Workers run this with the task lines' sweep.

    >>> sweep_pending(redis.Redis(), "redislock", publish)   # doctest: +SKIP
    1
    """
    key = pending_key(namespace)
    with FORK_GUARD.held(), backend_errors(None):
        listed = client.hgetall(key)
    now = time.time()
    published = 0
    for raw_name, raw in listed.items():
        name, record = text(raw_name), json.loads(raw)
        if record["look"] > now:
            continue
        # Under the fork guard, one key at a time: a worker forking meanwhile (a pool child, a
        # work horse) waits for this key's calls to Redis and the broker, not for the sweep's.
        with FORK_GUARD.held():
            published += _publish_due(
                client, namespace, name, text(raw), record, now, publish, window
            )
    return published


def _publish_due(
    client: RedisClient,
    namespace: str,
    name: str,
    raw: str,
    record: dict[str, float],
    now: float,
    publish: Callable[[str, str], None],
    window: float,
) -> int:
    """Publishes the call of key ``name`` if it is due; returns how many it published (0, 1)."""
    keys = [LockKeys.of(namespace, name).pending]
    with backend_errors(name):
        taken = run("pending_take", client, keys, [str(_ms(window)), os.urandom(8).hex()])
    what = text(taken[0])
    if what == "n":
        if now - record["at"] > _FORGET_AFTER_S:
            with backend_errors(name):
                run("line_forget", client, [pending_key(namespace)], [name, raw])
        return 0
    if what == "w":
        _list(client, namespace, name, int(taken[1]) / 1000)
        return 0
    call_id, payload = text(taken[1]), text(taken[2])
    try:
        publish(call_id, payload)
    except Exception:
        log.exception(
            "debounced key %r: could not publish call %s (tried again in %.0fs)",
            name,
            call_id,
            window,
        )
        _list(client, namespace, name, time.time() + window)
        return 0
    with backend_errors(name):
        next_due = int(run("pending_sent", client, keys, [call_id]))
    if next_due:
        _list(client, namespace, name, next_due / 1000)
    return 1


def _list(client: RedisClient, namespace: str, name: str, look: float) -> None:
    """Lists the key for sweepers, to look at from ``look`` (seconds since the epoch)."""
    with backend_errors(name):
        client.hset(pending_key(namespace), name, json.dumps({"look": look, "at": time.time()}))


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))
