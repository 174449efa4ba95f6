"""What a lock's records say: its holders (who, how, where, since when) and its waiters."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..handover import is_line_token
from ..holders import read_holders
from ..keys import DEFAULT_NAMESPACE, LockKeys, check_name, check_namespace
from ..protocol import Mode, text
from ..store import Holder, RedisClient, backend_errors

__all__ = ["TEST_HOLDER", "LockState", "Waiter", "describe_holder", "describe_lock"]

# Who a lease taken by the test helpers' ``hold_lock`` says it is (``holder.info["task_id"]``).
TEST_HOLDER = "pytest"

# A tenant's place in a lock's queue ('#<tenant id>') and the length of its tasks' members in
# the lock's :tenants key before their token (tenant id, priority, arrival: lua/_line.lua).
_TENANT_PLACE = "#"
_TENANT_MEMBER_LEN = 39

# A fence is max(last + 1, server time in us) at acquisition: one this large was the server's
# clock then (any fence since 2001 is), which tells how long the lease has been held.
_FENCE_IS_TIME = 10**15


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


@dataclass(frozen=True, slots=True)
class Waiter:
    """One waiter standing in a lock's line (a blocked ``acquire``, or a task parked in the
    task line), in arrival order."""

    token: str
    mode: Mode
    position: int
    """1 for the first in line."""
    owner: str | None
    info: dict[str, str]
    expires_in: float | None
    """Seconds until its place lapses unless the waiter refreshes it (it does, every second);
    for a task parked in the task line, until its ``max_wait`` ends it."""

    @property
    def parked(self) -> bool:
        """A task parked in the lock's task line (``on_conflict="queue"``), not a blocked call."""
        return is_line_token(self.token)


@dataclass(frozen=True, slots=True)
class LockState:
    """A lock as :func:`describe_lock` found it: its live leases, oldest first, and its line."""

    name: str
    holders: list[Holder]
    waiters: list[Waiter] = field(default_factory=list)
    server_ms: int = 0
    """The Redis server's clock when the leases were read (ms since the epoch)."""
    blocked_for: float | None = None
    """The lean layout (docs/core.md): callers refused on the fast path block without a place in
    line, so they are not among ``waiters``; each leaves its deadline, and this is the latest,
    in seconds from now (``None``: none left). An upper bound: one that got in since, or gave
    up, leaves its deadline behind."""

    @property
    def waited_for(self) -> bool:
        """Someone stands in line, or may be blocked on the fast path."""
        return bool(self.waiters) or self.blocked_for is not None

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
    live = read_holders(client, keys, name)
    with backend_errors(name):
        waiters = _waiters(client, keys, live.server_ms)
        deadline = client.hget(keys.meta, "Q")
    blocked = int(deadline) - live.server_ms if deadline is not None else 0
    return LockState(
        name=name,
        holders=live.holders,
        waiters=waiters,
        server_ms=live.server_ms,
        blocked_for=blocked / 1000 if blocked > 0 else None,
    )


def _waiters(client: RedisClient, keys: LockKeys, now_ms: int) -> list[Waiter]:
    line = [text(t) for t in client.zrange(keys.all[2], 0, -1)]
    if not line:
        return []
    if any(t.startswith(_TENANT_PLACE) for t in line):
        line = _tenants_expanded(client, keys, line)
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


def _tenants_expanded(client: RedisClient, keys: LockKeys, line: list[str]) -> list[str]:
    """The line with each tenant's place replaced by the tenant's parked tasks (priority, then
    arrival): a tenant's tasks are listed together, at its turn."""
    places = [t for t in line if t.startswith(_TENANT_PLACE)]
    pipe = client.pipeline(transaction=False)
    for place in places:
        ident = place[len(_TENANT_PLACE) :]
        pipe.zrangebylex(keys.tenants, f"[{ident}", f"({ident}~")
    tasks = dict(zip(places, pipe.execute(), strict=True))
    out: list[str] = []
    for token in line:
        if token in tasks:
            out.extend(text(member)[_TENANT_MEMBER_LEN:] for member in tasks[token])
        else:
            out.append(token)
    return out
