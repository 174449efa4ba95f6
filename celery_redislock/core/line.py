"""The task line: a task that finds its lock taken waits in Redis as an entry of the lock's
waiting line (behind blocked waiters alike) with a payload its framework publishes again, not
in a worker slot or on a retry timer. A release or a lapse (seen by any later call, or by
:func:`sweep_lines`) hands the lock to the next entries that fit with a short lease; the caller
publishes their payloads (the lock's ``handover``) and confirms (``line_sent.lua``). A payload
leaves Redis only once confirmed: if its publisher dies, the short lease lapses and the entry
goes back in line at its old place. A hand-over published twice is claimed by its first delivery.

Tenants: tasks parked with a ``tenant`` are served tenant by tenant in turn (one task each,
however many each has waiting; within a tenant by ``priority``, then arrival), so that one
tenant's flood does not hold up another's few (see ``lua/_line.lua``).

>>> lock = Lock(client, "sync:42", ttl=30, handover=publish)   # doctest: +SKIP
>>> got = park(lock, payload, owner=task_id)                     # doctest: +SKIP
>>> got = park(lock, payload, owner=task_id, tenant="acme")      # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

import redis

from ..errors import JobFinished, LineFull, LockConfigError, LockNotAcquired
from ._validate import int_at_least
from .durations import MAX_WAIT, seconds
from .forkguard import FORK_GUARD
from .handover import (
    DEFAULT_HANDOVER_WINDOW,
    PUBLISH_WINDOW_S,
    Handed,
    Handover,
    hand_over,
    is_line_token,
    line_token,
)
from .lock import Lease, Lock
from .lock_base import info_json
from .protocol import (
    PRIORITIES,
    AcquireArgs,
    AcquireReply,
    AcquireStatus,
    Grant,
    ParkArgs,
    SweepReply,
    text,
)
from .scripts import run
from .signal import Signal
from .store import RedisClient, backend_error, backend_errors

__all__ = [
    "DEFAULT_HANDOVER_WINDOW",
    "Handed",
    "Handover",
    "Parked",
    "drop_hand_over",
    "is_line_token",
    "line_token",
    "lines_key",
    "lines_swept",
    "park",
    "sweep",
    "sweep_lines",
    "tenant_key",
]

log = logging.getLogger(__name__)

lines_swept = Signal("lines_swept")
"""Sent by :func:`sweep_lines` after each sweep: ``namespace``, ``parked`` (tasks waiting in
lines now), ``lines`` (locks with a line). Metrics take the line length from it."""


@dataclass(frozen=True, slots=True)
class Parked:
    """The task waits in the lock's line (:func:`park`): it is published again when handed
    the lock, or as expired after ``max_wait``."""

    name: str
    token: str
    parked: int
    """Parked entries in line, this one included."""


def tenant_key(tenant: str, priority: int = 0, *, name: str | None = None) -> str:
    """The tenant's id and the priority within it, as a parked task's entry sorts by them: 16
    hex of a hash of ``tenant`` (any text: equal texts, one tenant), then 8 hex that sort the
    highest priority first. Raises :class:`LockConfigError` for a priority that is not an
    ``int`` in :data:`PRIORITIES`.

    >>> tenant_key("acme", 0)[16:], tenant_key("acme", 1)[16:]
    ('7fffffff', '7ffffffe')
    """
    if not isinstance(tenant, str):
        raise LockConfigError(f"a tenant must be a str, got {type(tenant).__name__}", name=name)
    low, high = PRIORITIES
    if isinstance(priority, bool) or not isinstance(priority, int) or not low <= priority <= high:
        raise LockConfigError(
            f"a priority must be an int from {low} to {high}, got {priority!r}", name=name
        )
    ident = hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{ident}{high - priority:08x}"


def lines_key(namespace: str) -> str:
    """The hash of locks with a task line (name -> the lock's settings), for sweepers."""
    return f"{namespace}:{{lines}}"


def park(
    lock: Lock,
    payload: str,
    *,
    token: str | None = None,
    owner: str,
    info: Mapping[str, object] | None = None,
    job: str | None = None,
    max_wait: float = 3600.0,
    max_waiting: int | None = None,
    tenant: str | None = None,
    priority: int = 0,
) -> Lease | Parked:
    """Takes a lease on ``lock``, or parks ``payload`` in its task line.

    ``token``: the token of a hand-over this task was published for (claims that lease), else
    a new entry. ``owner`` holds at most one lease (a second delivery of a running task raises
    :class:`LockNotAcquired` with ``owner_expires_in``). Raises :class:`LineFull` when
    ``max_waiting`` tasks are parked already, :class:`JobFinished` as ``acquire(job=)`` does.
    ``tenant``: the parked tasks of each tenant take turns with the other tenants' (and with
    each task parked without one), highest ``priority`` first within a tenant, then by arrival
    (see :func:`tenant_key`); the holder's ``info`` gets ``tenant`` (and ``priority``).
    """
    wait = seconds(max_wait, MAX_WAIT, "max_wait", name=lock.name)
    max_waiting = int_at_least(max_waiting, 1, "max_waiting", name=lock.name, or_none=True)
    tenant_id = ""
    if tenant is not None:
        tenant_id = tenant_key(tenant, priority, name=lock.name)
        info = {**(info or {}), "tenant": tenant, **({"priority": priority} if priority else {})}
    if not lock.store.queues:
        # The line lives in one lock's keys on one server: over independent masters (RedLock)
        # no single server could hand the lock over.
        raise LockConfigError(
            "the task line (on_conflict='queue') is not available over RedLock masters; use "
            "'retry' or 'wait'",
            name=lock.name,
        )
    if token is not None and not is_line_token(token):
        raise LockConfigError(f"not a task line token: {token!r}", name=lock.name)
    request = AcquireArgs(
        token=token or line_token(),
        spec=lock._spec,
        wait=False,
        once=True,
        owner=owner,
        info=info_json(info, lock.info_limit),
        job=job,
        claim=os.urandom(8).hex(),
        park=ParkArgs(
            payload=payload,
            wait_ms=max(1, round(wait * 1000)),
            max_parked=max_waiting or 0,
            publish_ms=round(PUBLISH_WINDOW_S * 1000),
            tenant=tenant_id,
        ),
    )
    sent = time.monotonic()
    try:
        reply = lock._run_acquire(request.encode())
    except redis.RedisError as exc:
        lock._abandon(request.token)  # drops its lease or its place in line, if it made one
        raise backend_error(lock.name, exc) from exc
    lock._notify(reply.granted)
    return _parked_or_held(lock, request, reply, sent)


def _parked_or_held(
    lock: Lock, request: AcquireArgs, reply: AcquireReply, sent: float
) -> Lease | Parked:
    status = reply.status
    if status is AcquireStatus.HELD:
        return lock._lease(
            reply.token, reply.fence, reply.expires_at_ms, reply.mode, request.owner, sent
        )
    if status is AcquireStatus.PARKED:
        _note_line(lock)
        return Parked(name=lock.name, token=request.token, parked=reply.entered)
    if status is AcquireStatus.LINE_FULL:
        raise LineFull(
            f"lock {lock.name!r}: its task line holds {reply.entered} parked tasks (max_waiting)",
            name=lock.name,
            parked=reply.entered,
        )
    if status is AcquireStatus.JOB_FINISHED:
        raise JobFinished(
            f"lock {lock.name!r}: job {request.job!r} is recorded as finished",
            name=lock.name,
            job=request.job or "",
        )
    raise LockNotAcquired(
        f"lock {lock.name!r} is held by owner {request.owner!r} already",
        name=lock.name,
        owner_expires_in=reply.ms_left / 1000,
    )


def _note_line(lock: Lock) -> None:
    """Lists the lock for sweepers (a lapse nobody else sees is handed on by them). At every
    park: a sweeper forgets a lock only when its record is unchanged since it looked."""
    record = {
        "mode": lock.mode,
        "limit": lock.limit,
        "ttl": lock.ttl,
        "fair": lock.fair,
        "fence_keep": lock.fence_keep,
        "at": time.time(),
    }
    try:
        lock.client.hset(lines_key(lock.namespace), lock.name, json.dumps(record))
    except redis.RedisError as exc:
        # Parked all the same: a release hands it on; only a lapse then waits for another call.
        log.warning("lock %r: could not list its task line for sweepers: %s", lock.name, exc)


def drop_hand_over(lock: Lock, token: str) -> bool:
    """The task of hand-over ``token`` will not run (its message was revoked or expired): its
    unclaimed lease (or its place in line) goes now and the lock is handed on. Returns whether
    anything was dropped; a claimed hand-over (a delivery runs it) is left alone."""
    with backend_errors(lock.name):
        raw = run("line_drop", lock.client, lock.encoded_keys, [lock._spec, token])
    parts = raw.split()
    lock._notify(Grant.decode_all(parts[1:]))
    return int(parts[0]) == 1


def sweep(lock: Lock) -> SweepReply:
    """Hands on what lapsed on ``lock`` and publishes its expired parked tasks (one script
    call, then the publishes)."""
    with backend_errors(lock.name):
        reply = SweepReply.decode(run("line_sweep", lock.client, lock.encoded_keys, [lock._spec]))
    lock._notify(tuple(g for g in reply.granted if not is_line_token(g.token)))
    hand_over(lock, [g for g in reply.granted if is_line_token(g.token)], reply.expired)
    return reply


def sweep_lines(
    client: RedisClient,
    namespace: str,
    handover: Handover,
    *,
    handover_window: float = DEFAULT_HANDOVER_WINDOW,
) -> int:
    """Sweeps every lock with a task line in ``namespace`` (see :func:`sweep`); forgets the
    locks left with nothing held or parked. Returns the parked tasks left. Workers run this
    every second or so: it is what hands a lock on after its holder died unseen.

    >>> sweep_lines(redis.Redis(), "redislock", publish)   # doctest: +SKIP
    0
    """
    key = lines_key(namespace)
    # Under the fork guard, one lock at a time: a worker forking meanwhile waits for that one.
    with FORK_GUARD.held(), backend_errors(None):
        listed = client.hgetall(key)
    parked = lines = 0
    for raw_name, raw in listed.items():
        name = text(raw_name)
        record = json.loads(raw)
        lock = Lock(
            client,
            name,
            ttl=record["ttl"],
            mode=record["mode"],
            limit=record["limit"],
            fair=record["fair"],
            namespace=namespace,
            fence_keep=record["fence_keep"],
            handover=handover,
            handover_window=handover_window,
        )
        with FORK_GUARD.held():
            reply = sweep(lock)
            if reply.parked == 0 and reply.leases == 0 and not reply.expired:
                with backend_errors(name):
                    run("line_forget", client, [key], [name, text(raw)])
        parked += reply.parked
        if reply.parked:
            lines += 1
    if lines_swept.receivers:
        lines_swept.send(sender=None, namespace=namespace, parked=parked, lines=lines)
    return parked
