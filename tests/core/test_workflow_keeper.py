"""The keeper (core/run/keeper.py) on a real Redis: a workflow's lease kept between two links
while its gap lease lives, and no longer once the gap lease goes, the keeping is taken over, or
``max_gap`` passed; never renewed after that, so it lapses within its ttl."""

from __future__ import annotations

import logging

import pytest
import redis
from helpers import redis_time_ms, wait_for, wait_redis_time

from celery_redislock.core.lock import Lease, Lock
from celery_redislock.core.run.keeper import keepers

TTL = 0.6


def _leases(client: redis.Redis) -> tuple[Lock, Lease, Lock, Lease]:
    lock, gap_lock = Lock(client, "wf", ttl=TTL), Lock(client, "wf:gap:t", ttl=TTL)
    return lock, lock.acquire(), gap_lock, gap_lock.acquire()


def _lapses_unrenewed(client: redis.Redis, lock: Lock, since_ms: float) -> None:
    """The lease of ``lock`` is renewed no more after ``since_ms`` (Redis's clock): it lapses
    within the ttl of that instant."""
    (holder,) = lock.holders()
    ends_ms = redis_time_ms(client) + holder.expires_in * 1000
    assert ends_ms <= since_ms + TTL * 1000 + 50

    def gone() -> bool:
        now, held = redis_time_ms(client), lock.holders()
        assert all(now + h.expires_in * 1000 <= ends_ms + 5 for h in held), held
        return not held

    wait_for(gone, "the lease lapsed", timeout=10)


def test_kept_while_the_gap_lease_lives_then_no_longer(client: redis.Redis) -> None:
    lock, lease, gap_lock, gap = _leases(client)
    keepers.keep(lease, gap, max_gap=60)
    wait_redis_time(client, redis_time_ms(client) + 3 * TTL * 1000)  # five ttls of it
    assert [h.token for h in lock.holders()] == [lease.token]  # renewed past its ttl
    assert [h.token for h in gap_lock.holders()] == [gap.token]
    gap_lock.release_tokens([gap.token])  # the next link started
    _lapses_unrenewed(client, lock, redis_time_ms(client))
    wait_for(lambda: not keepers.all(), "the keeper let go", timeout=10)


def test_a_keeping_taken_over_stops_at_once(client: redis.Redis) -> None:
    lock, lease, gap_lock, gap = _leases(client)
    keepers.keep(lease, gap, max_gap=60)
    taken = keepers.take(lease.token)
    assert taken is not None and taken.done
    assert keepers.take(lease.token) is None
    _lapses_unrenewed(client, lock, redis_time_ms(client))
    gap_lock.release_tokens([gap.token])


def test_past_max_gap_it_is_no_longer_kept(
    client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    lock, lease, gap_lock, gap = _leases(client)
    with caplog.at_level(logging.WARNING, logger="celery_redislock.core.run.keeper"):
        keepers.keep(lease, gap, max_gap=1.0)
        wait_for(lambda: not keepers.all(), "the keeper let go", timeout=10)
        left_ms = redis_time_ms(client)
    assert "did not start within max_gap" in caplog.text
    _lapses_unrenewed(client, lock, left_ms)
    assert not gap_lock.locked()
