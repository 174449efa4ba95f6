"""What a run does when its lock is held, beyond skip/raise/wait (test_celery_pools.py):
the conflict retry's backoff and its lock-level ``max_retries``, eager and plain calls, and the
default ``max_hold`` (the hard time limit)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from types import ModuleType

import pytest
from celery import Celery
from celery.exceptions import Retry
from helpers import wait_for
from workers import Worker

from celery_redislock import LockNotAcquired, lock_for
from celery_redislock.integrations.celery.publish import CONFLICTS_HEADER


def _conflict_signals(lockapp: ModuleType, task_id: str) -> list[str]:
    entries = [e.decode() for e in lockapp.r.lrange("signal:lock_conflict", 0, -1)]
    return [e.split(":", 1)[1] for e in entries if e.startswith(f"{task_id}:")]


def test_conflict_retry_backs_off_doubling_at_most_five_times_with_jitter(
    lockapp: ModuleType,
) -> None:
    """The n-th conflict retry waits a jittered countdown in [b/2, b], b = countdown x 2^min(n, 5)
    (docs: "doubling at most 5 times, jittered down by up to half"), and its message carries
    n + 1. The start hook runs here as the worker runs it (before_start, a delivered request),
    against the real lock and broker Redis; no worker is needed to see the countdown."""
    task = lockapp.duplicate  # on_conflict="retry", countdown=0.05
    countdown = 0.05
    holder = lock_for(task, ("bo",)).acquire(blocking=False)
    try:
        for n in range(8):
            base = countdown * 2 ** min(n, 5)
            waits = []
            for _ in range(25):
                task_id = str(uuid.uuid4())
                task.push_request(id=task_id, args=["bo"], kwargs={}, headers={CONFLICTS_HEADER: n})
                try:
                    with pytest.raises(Retry) as retried:
                        task.before_start(task_id, ("bo",), {})
                finally:
                    task.pop_request()
                assert retried.value.when is not None
                waits.append(float(retried.value.when))
                message = json.loads(lockapp.r.rpop("celery"))  # the retry, published
                assert message["headers"]["id"] == task_id
                assert message["headers"][CONFLICTS_HEADER] == n + 1
            assert all(base / 2 <= w <= base for w in waits), (n, base, waits)
            # Jittered: 25 draws spread over more than a quarter of the range (a fixed or
            # barely varying countdown fails; uniform draws miss this with p < 1e-12).
            assert max(waits) - min(waits) > base / 8, (n, base, waits)
    finally:
        holder.release()


def test_eager_retry_acts_as_raise_and_a_plain_call_takes_no_lock(lockapp: ModuleType) -> None:
    holder = lock_for(lockapp.duplicate, ("eg",)).acquire(blocking=False)
    result = lockapp.duplicate.apply(("eg",))  # eager: no queue to retry through
    assert result.state == "FAILURE"
    assert isinstance(result.result, LockNotAcquired)
    assert "(eager): lock 'hold:eg' is held" in str(result.result)
    with pytest.raises(LockNotAcquired, match="lock 'hold:eg' is held"):
        lockapp.duplicate.apply(("eg",), throw=True)
    assert lockapp.r.llen("celery") == 0  # nothing was re-published
    assert lockapp.r.llen("started:dup:eg") == 0  # nor run
    # A plain call runs at once beside the holder, without a lease of its own ...
    assert lockapp.lock_state("eg") == [True, False]
    holder.release()
    # ... and takes none when the lock is free; an eager run does take it.
    assert lockapp.lock_state("eg") == [False, False]
    assert lockapp.lock_state.apply(("eg",)).get() == [True, True]
    assert not lock_for(lockapp.lock_state, ("eg",)).locked()


@pytest.mark.slow  # about 5 s on 2 quiet cores
def test_lock_max_retries_and_the_default_max_hold(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """One threads worker (it enforces no time limit, so a task outlives its limit) whose app
    sets task_time_limit=1:

    - lock-level max_retries=2: after two conflict retries the task fails with LockNotAcquired;
    - max_hold defaults to the hard time limit: the call's, else the task's, else the app's.
      Leases of ttl 3 s; the task notes when it saw its lease lost (None: held throughout).
    """
    worker = workers(pool="threads", concurrency=4, env={"LOCKAPP_TIME_LIMIT": "1"})
    producer = Celery(
        "by-name", broker=lockapp.app.conf.broker_url, backend=lockapp.URL, set_as_current=False
    )
    holder = lock_for(lockapp.gives_up, ("mr",)).acquire(blocking=False)
    by_app = lockapp.default_hold.delay("app", 8.0)  # no limit of its own: the app's 1 s
    # Sent by a producer that does not know the task: its message names no time limit (delay()
    # copies the task's into it), so the worker falls back to the task's own time_limit=30.
    by_task = producer.send_task("lockapp.limited_hold", ("task", 3.0))
    by_call = lockapp.limited_hold.apply_async(("call", 8.0), time_limit=1)  # overrides 30
    gave_up = lockapp.gives_up.delay("mr")

    with pytest.raises(LockNotAcquired, match="gave up after 2 conflict retries: lock 'hold:mr'"):
        gave_up.get(timeout=30)
    assert _conflict_signals(lockapp, gave_up.id) == ["retry"] * 3  # two retries, then no more
    holder.release()

    # Renewed until max_hold (1 s) and no further: the lease lapses within its ttl after that,
    # seen lost before the body's 8 s end, and not before the maximum hold (from the start of
    # the body, which begins just after the lease is taken: 0.1 s below for that gap). That it
    # was the maximum hold that stopped it, not a late renewal, the log says below.
    for result in (by_app, by_call):
        lost_after = result.get(timeout=60)
        assert lost_after is not None and lost_after >= 0.9, lost_after
    # Its own limit of 30 s: renewed for the whole 3 s.
    assert by_task.get(timeout=60) is None

    def past_max_hold() -> list[str]:
        return [line for line in worker.log().splitlines() if "reached its maximum hold" in line]

    wait_for(lambda: len(past_max_hold()) == 2, "two leases logged past their maximum hold", 30)
    assert not [line for line in past_max_hold() if "'hold:task'" in line]
