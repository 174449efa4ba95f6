"""A caller's place in the waiting line goes as soon as the caller is answered by its owner's
lease (re-entry, or a refusal), so it never holds up the line until its deadline."""

from __future__ import annotations

import pytest
import redis

from celery_redislock import Lock
from celery_redislock.core.protocol import AcquireArgs, AcquireReply, AcquireStatus
from celery_redislock.core.scripts import run


def _blocking_try(lock: Lock, token: str, owner: str, *, once: bool = False) -> AcquireReply:
    """One acquire script call of a blocking ``lock.acquire(owner=owner)``: stays in line on
    failure (raw, so the test decides when the call comes again)."""
    args = AcquireArgs(token=token, spec=lock._spec, wait=True, info="{}", owner=owner, once=once)
    return AcquireReply.decode(run("acquire", lock.client, lock.encoded_keys, args.encode()))


def _line(client: redis.Redis, lock: Lock) -> tuple[list[bytes], bytes | None]:
    queue, meta = lock.keys.all[2], lock.keys.meta
    return client.zrange(queue, 0, -1), client.hget(meta, "qw")


@pytest.mark.parametrize("once", [False, True], ids=["re-entered", "refused"])
def test_a_blocked_owner_answered_by_its_own_lease_leaves_the_line(
    client: redis.Redis, once: bool
) -> None:
    lock = Lock(client, "line", ttl=30)
    reader = Lock(client, "line", ttl=30, mode="read")
    other = lock.acquire(owner="a")
    # Owner x blocks: it is queued as a writer.
    assert _blocking_try(lock, "x-blocked", "x").status is AcquireStatus.NOT_HELD
    assert _line(client, lock) == ([b"x-blocked"], b"1")
    other.release()
    # x takes the lock by another call while its blocked call still waits in line; the blocked
    # call, coming again, is answered by x's lease: re-entered, or refused (reentrant=False)...
    mine = lock.acquire(owner="x", blocking=False)
    reply = _blocking_try(lock, "x-blocked", "x", once=once)
    expected = AcquireStatus.OWNER_HOLDS if once else AcquireStatus.HELD
    assert reply.status is expected and reply.token == mine.token
    # ...and its place in line is gone: no writer counted as queued.
    assert _line(client, lock) == ([], b"0")
    for _ in range(1 if once else 2):
        lock.release(mine)
    # Free, and nobody in line: a reader gets it at once (a stale queued writer would refuse
    # it until the entry's deadline).
    assert not lock.locked()
    reader.acquire(blocking=False).release()
