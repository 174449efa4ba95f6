"""Operating on locks from outside their holders: list them and their waiters, describe a
holder, free a lease by its token or its owner's task id, list and free unique tasks' queued
claims, free a whole namespace. What the CLI, the pytest plugin and the integrations call; never
imports a framework.

Over 300 lines: the read side and the write side of one small API, each function short.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..errors import LockConfigError
from .keys import DEFAULT_NAMESPACE, LockKeys, check_name, check_namespace, name_from_leases_key
from .lease import Holder, Mode, RedisClient, backend_errors
from .lock import DEFAULT_FENCE_KEEP, Lock
from .protocol import (
    HoldersReply,
    LockSpec,
    ReleaseArgs,
    ReleaseClaimArgs,
    ReleaseClaimReply,
    ReleaseReply,
    text,
)
from .scripts import run

__all__ = [
    "TEST_HOLDER",
    "ClaimState",
    "LockState",
    "Released",
    "Waiter",
    "describe_holder",
    "describe_lock",
    "force_release",
    "force_release_claim",
    "iter_claims",
    "iter_locks",
    "list_claims",
    "list_locks",
    "release_all",
]

# Who a lease taken by the test helpers' ``hold_lock`` says it is (``holder.info["task_id"]``).
TEST_HOLDER = "pytest"

_DELETE_BATCH = 500


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _check_pattern(pattern: object) -> str:
    if not isinstance(pattern, str) or not pattern:
        raise LockConfigError(
            f"pattern must be a non-empty glob over lock names (e.g. 'sync:*'), got {pattern!r}"
        )
    return pattern


def iter_locks(
    client: RedisClient, namespace: str = DEFAULT_NAMESPACE, pattern: str = "*"
) -> Iterator[str]:
    """Names of the locks in ``namespace`` that have leases, found with SCAN (never KEYS);
    ``pattern`` is a Redis glob over the names (``*``, ``?``, ``[...]``).

    A lock whose leases all lapsed may still be listed until Redis expires its keys; use
    :meth:`Lock.holders` (or :func:`list_locks`) for the live truth.

    >>> sorted(iter_locks(redis.Redis()))   # doctest: +SKIP
    ['nightly-report', 'sync:42']
    """
    check_namespace(namespace)
    match = f"{_glob_escape(namespace)}:{{{_check_pattern(pattern)}}}:leases"
    with backend_errors(None):
        for key in client.scan_iter(match=match, count=500):
            name = name_from_leases_key(namespace, text(key))
            if name is not None:
                yield name


def release_all(client: RedisClient, namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    """Frees every lock of ``namespace``: deletes all its keys (leases, metadata, waiting lines),
    found with SCAN. Returns the names of the locks that had leases.

    Fencing tokens start over afterwards; holders still running find their leases lost. Keys of
    other namespaces and other data are left alone.

    >>> release_all(redis.Redis.from_url(url))   # doctest: +SKIP
    ['sync:42']
    """
    check_namespace(namespace)
    names = sorted(set(iter_locks(client, namespace)))
    batch: list[bytes | str] = []
    with backend_errors(None):
        for key in client.scan_iter(match=f"{_glob_escape(namespace)}:*", count=_DELETE_BATCH):
            batch.append(key)
            if len(batch) >= _DELETE_BATCH:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
    return names


def describe_holder(holder: Holder) -> str:
    """One line about a lease for failure messages: who holds it, how, where, for how long.

    >>> describe_holder(lock.holders()[0])   # doctest: +SKIP
    'task 9b1c… (tasks.sync_customer): write lease, pid 4242 on web-1, expires in 14.2s'
    """
    info = holder.info
    if info.get("task_id") == TEST_HOLDER:
        who = "the test itself (hold_lock)"
    else:
        who = f"task {info['task_id']}" if "task_id" in info else f"lease {holder.token}"
        if "task" in info:
            who += f" ({info['task']})"
    how = [f"{holder.mode} lease"]
    if holder.count > 1:
        how.append(f"entered {holder.count} times")
    if "pid" in info:
        how.append(f"pid {info['pid']}" + (f" on {info['host']}" if "host" in info else ""))
    how.append(f"expires in {holder.expires_in:.1f}s")
    return f"{who}: {', '.join(how)}"


# -- inspecting ------------------------------------------------------------------------------

# A fence is max(last + 1, server time in us) at acquisition: one this large was the server's
# clock then (any fence since 2001 is), which tells how long the lease has been held.
_FENCE_IS_TIME = 10**15


@dataclass(frozen=True, slots=True)
class Waiter:
    """One waiter standing in a lock's line (a blocked ``acquire``), in arrival order."""

    token: str
    mode: Mode
    position: int
    """1 for the first in line."""
    owner: str | None
    info: dict[str, str]
    expires_in: float | None
    """Seconds until its place lapses unless the waiter refreshes it (it does, every second)."""


@dataclass(frozen=True, slots=True)
class LockState:
    """A lock as :func:`describe_lock` found it: its live leases, oldest first, and its line."""

    name: str
    holders: list[Holder]
    waiters: list[Waiter] = field(default_factory=list)
    server_ms: int = 0
    """The Redis server's clock when the leases were read (ms since the epoch)."""

    @property
    def mode(self) -> Mode | None:
        """``"read"`` or ``"write"`` while held, else ``None``."""
        return self.holders[0].mode if self.holders else None

    @property
    def expires_in(self) -> float | None:
        """Seconds until the first lease lapses unless renewed (``None``: not held)."""
        return min(h.expires_in for h in self.holders) if self.holders else None

    def held_for(self, holder: Holder) -> float | None:
        """Seconds since ``holder`` acquired its lease, by the server's clock (read from its
        fence; ``None`` if the fence does not carry the time)."""
        if holder.fence < _FENCE_IS_TIME or not self.server_ms:
            return None
        return max(0.0, self.server_ms / 1000 - holder.fence / 1_000_000)


def describe_lock(client: RedisClient, name: str, namespace: str = DEFAULT_NAMESPACE) -> LockState:
    """Who holds the lock ``name`` (each lease: token, mode, fence, owner, task id, host, pid,
    expiry) and who waits for it. The leases are read in one step; the line just after.

    >>> state = describe_lock(redis.Redis(), "sync:42")   # doctest: +SKIP
    >>> [(h.info["task_id"], h.fence) for h in state.holders]   # doctest: +SKIP
    [('9b1c…', 1763841234123456)]
    """
    name, keys = check_name(name), LockKeys.of(check_namespace(namespace), name)
    with backend_errors(name):
        reply = HoldersReply.decode(run("holders", client, [keys.leases, keys.meta], []))
        waiters = _waiters(client, keys, reply.now_ms)
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
    return LockState(name=name, holders=holders, waiters=waiters, server_ms=reply.now_ms)


def _waiters(client: RedisClient, keys: LockKeys, now_ms: int) -> list[Waiter]:
    line = [text(t) for t in client.zrange(keys.all[2], 0, -1)]
    if not line:
        return []
    pipe = client.pipeline(transaction=False)
    pipe.zmscore(keys.all[3], line)
    pipe.hmget(keys.meta, [f"q:{t}" for t in line])
    deadlines, records = pipe.execute()
    out: list[Waiter] = []
    for token, deadline, raw in zip(line, deadlines, records, strict=True):
        if raw is None or (deadline is not None and deadline <= now_ms):
            continue  # left the line, or its place lapsed (the next script call drops it)
        record = json.loads(text(raw))
        info = json.loads(record.get("i") or "{}")
        out.append(
            Waiter(
                token=token,
                mode="read" if record.get("m") == "r" else "write",
                position=len(out) + 1,
                owner=record.get("o") or None,
                info={str(k): str(v) for k, v in info.items()},
                expires_in=None if deadline is None else (deadline - now_ms) / 1000,
            )
        )
    return out


def list_locks(
    client: RedisClient, pattern: str = "*", namespace: str = DEFAULT_NAMESPACE
) -> list[LockState]:
    """Every lock of ``namespace`` whose name matches the glob ``pattern`` and that is held or
    waited for now, sorted by name (one SCAN, then one :func:`describe_lock` per lock).

    >>> [s.name for s in list_locks(redis.Redis(), "sync:*")]   # doctest: +SKIP
    ['sync:42']
    """
    states = (
        describe_lock(client, name, namespace)
        for name in sorted(set(iter_locks(client, namespace, pattern)))
    )
    return [state for state in states if state.holders or state.waiters]


# -- freeing leases --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Released:
    """What :func:`force_release` freed (or, with ``dry_run``, would free)."""

    name: str
    holders: list[Holder]
    dry_run: bool = False


def force_release(
    client: RedisClient,
    name: str,
    *,
    token: str | None = None,
    task_id: str | None = None,
    everything: bool = False,
    dry_run: bool = False,
    namespace: str = DEFAULT_NAMESPACE,
    fence_keep: float = DEFAULT_FENCE_KEEP,
) -> Released:
    """Frees leases of the lock ``name`` that their holders cannot free (a stuck worker): the
    lease whose token is ``token``, every lease whose holder recorded ``task_id``, or, with
    ``everything=True``, every live lease. Exactly one of the three.

    Each release is checked in Redis, in the same step, against the token or the task id, so a
    lease taken meanwhile by someone else is never freed. Waiters are woken as by a release.
    The holders whose leases go find them lost at their next renewal. ``dry_run`` frees nothing
    and returns what would be freed.

    >>> force_release(redis.Redis(), "sync:42", task_id="9b1c…").holders   # doctest: +SKIP
    [Holder(token='…', mode='write', ...)]
    """
    chosen = [token is not None, task_id is not None, everything]
    if chosen.count(True) != 1:
        raise LockConfigError(
            "force_release needs exactly one of token=, task_id= or everything=True", name=name
        )
    for value, what in ((token, "token"), (task_id, "task_id")):
        if value is not None and (not isinstance(value, str) or not value):
            raise LockConfigError(f"{what} must be a non-empty string, got {value!r}", name=name)
    lock = Lock(client, name, ttl=1, namespace=namespace, fence_keep=fence_keep)
    holders = lock.holders()
    if task_id is not None:
        matched = [h for h in holders if h.info.get("task_id") == task_id]
    elif token is not None:
        matched = [h for h in holders if h.token == token]
    else:
        matched = holders
    if dry_run or not matched:
        return Released(lock.name, matched, dry_run=dry_run)
    if task_id is not None:
        freed = set(lock.release_where(task_id=task_id))
    else:
        freed = {h.token for h in matched if _release_token(lock, h.token)}
    return Released(lock.name, [h for h in matched if h.token in freed])


def _release_token(lock: Lock, token: str) -> bool:
    """Drops the lease ``token`` whatever its re-entry count; whether it was live."""
    spec = LockSpec(
        mode="write",
        limit=1,
        ttl_ms=1000,
        fair=False,  # a fair lock's waiters look again within a second and are served in order
        entry_ms=1000,
        keep_ms=max(1, round(lock.fence_keep * 1000)),
    )
    request = ReleaseArgs(token=token, spec=spec.encode(), whole=True, request=os.urandom(8).hex())
    with backend_errors(lock.name):
        reply = ReleaseReply.decode(
            run("release", lock.client, lock.encoded_keys, request.encode())
        )
    return reply.released


# -- unique tasks' queued claims -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimState:
    """A unique task's claim on its key while its message is queued."""

    name: str
    task_id: str
    expires_in: float | None
    """Seconds the claim has left (``None``: no expiry)."""


def iter_claims(
    client: RedisClient, namespace: str = DEFAULT_NAMESPACE, pattern: str = "*"
) -> Iterator[str]:
    """Keys (lock names) of ``namespace`` that a queued unique task claims, found with SCAN."""
    check_namespace(namespace)
    match = f"{_glob_escape(namespace)}:{{{_check_pattern(pattern)}}}:queued"
    head, tail = f"{namespace}:{{", "}:queued"
    with backend_errors(None):
        for raw in client.scan_iter(match=match, count=500):
            key = text(raw)
            if key.startswith(head) and key.endswith(tail) and len(key) > len(head) + len(tail):
                yield key[len(head) : -len(tail)]


def _claim_state(client: RedisClient, namespace: str, name: str) -> ClaimState | None:
    key = LockKeys.of(namespace, name).queued
    with backend_errors(name):
        pipe = client.pipeline(transaction=False)
        pipe.get(key)
        pipe.pttl(key)
        holder, pttl = pipe.execute()
    if holder is None:
        return None
    return ClaimState(name, text(holder), pttl / 1000 if pttl >= 0 else None)


def list_claims(
    client: RedisClient, pattern: str = "*", namespace: str = DEFAULT_NAMESPACE
) -> list[ClaimState]:
    """The queued claims of ``namespace`` whose key matches the glob ``pattern``, by key.

    >>> list_claims(redis.Redis(), "report:*")   # doctest: +SKIP
    [ClaimState(name='report:daily', task_id='4f0e…', expires_in=593.2)]
    """
    found = (
        _claim_state(client, namespace, name)
        for name in sorted(set(iter_claims(client, namespace, pattern)))
    )
    return [state for state in found if state is not None]


def force_release_claim(
    client: RedisClient,
    name: str,
    *,
    task_id: str | None = None,
    dry_run: bool = False,
    namespace: str = DEFAULT_NAMESPACE,
) -> ClaimState | None:
    """Frees the queued claim on the key ``name`` (only if ``task_id`` holds it, when given),
    so the next call of the unique task is published. Checked in Redis against the task id read
    first: a claim taken meanwhile by another call is left alone. Returns the claim freed (or,
    with ``dry_run``, that would be freed); ``None`` if none matched.

    >>> force_release_claim(redis.Redis(), "report:daily")   # doctest: +SKIP
    ClaimState(name='report:daily', task_id='4f0e…', expires_in=593.2)
    """
    name, namespace = check_name(name), check_namespace(namespace)
    state = _claim_state(client, namespace, name)
    if state is None or (task_id is not None and state.task_id != task_id):
        return None
    if dry_run:
        return state
    keys = LockKeys.of(namespace, name)
    with backend_errors(name):
        raw = run(
            "unique_release",
            client,
            [keys.queued, keys.replaced],
            ReleaseClaimArgs(task_id=state.task_id).encode(),
        )
    return state if ReleaseClaimReply.decode(raw).superseded_by is None else None
