"""Model-based test of the moves between the lean fast path and the general path on one name.

A plain mutex in a namespace whose layout is ``lean`` takes the fast path (its lease in the meta
hash alone); a fair mutex and a read lock of the same name run the general path, which moves a
fast-path lease into its keys (promote) before it decides; a pause sends everyone to the general
path; the layout switched back to ``shared`` sends the plain mutex there too. Random sequences of
takes, re-entries, releases, renewals, expiries, pauses and switches on a real Redis: after
every step the holders Redis reports are the model's, a writer is alone, every new lease's fence
is greater than all before, and a lease is in one place only (the meta hash's ``L``, or the
leases key).
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

import redis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from celery_redislock import Lease, Lock, LockLost, LockNotAcquired, LockNotOwned, LockUpgradeError
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core import layout
from celery_redislock.core.admin import pause_lock, resume_lock

NS = "leanmodel"
KINDS = ("lean", "fair", "read")

SETTINGS = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class LeanModel(RuleBasedStateMachine):
    client: ClassVar[redis.Redis]

    def __init__(self) -> None:
        super().__init__()
        layout.set_layout(self.client, NS, "lean")
        self.name = f"m-{uuid.uuid4().hex[:12]}"
        self.locks = {
            "lean": Lock(self.client, self.name, ttl=30, namespace=NS),
            "fair": Lock(self.client, self.name, ttl=30, namespace=NS, fair=True),
            "read": Lock(self.client, self.name, ttl=30, namespace=NS, mode="read"),
        }
        self.keys = self.locks["lean"].keys
        self.live: dict[str, tuple[str, Lease, int]] = {}  # token -> (kind, lease, levels)
        self.lapsed: list[Lease] = []
        self.paused = False
        self.fences: list[int] = []

    def _fits(self, kind: str) -> bool:
        if self.paused:
            return False
        if kind == "read":
            return all(k == "read" for k, _, _ in self.live.values())
        return not self.live

    @rule(kind=st.sampled_from(KINDS), owner=st.sampled_from((None, "o1")))
    def take(self, kind: str, owner: str | None) -> None:
        mine = [t for t, (k, lease, _) in self.live.items() if owner and lease.owner == owner]
        try:
            lease = self.locks[kind].acquire(blocking=False, owner=owner)
        except LockUpgradeError:  # the owner holds a read lease: no write lease for it
            assert kind != "read" and [self.live[t][0] for t in mine] == ["read"]
            return
        except LockNotAcquired:
            assert mine or not self._fits(kind), f"{kind} refused a lock that fits: {self.live}"
            return
        if lease.token in self.live:  # the owner's re-entry
            k, held, levels = self.live[lease.token]
            assert owner and held.owner == owner and lease.fence == held.fence
            self.live[lease.token] = (k, held, levels + 1)
            return
        assert self._fits(kind) and not mine, f"{kind} taken beside {self.live}"
        assert not self.fences or lease.fence > max(self.fences)
        self.fences.append(lease.fence)
        self.live[lease.token] = (kind, lease, 1)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        token = data.draw(st.sampled_from(sorted(self.live)))
        kind, lease, levels = self.live[token]
        lease.release()
        if levels > 1:
            self.live[token] = (kind, lease, levels - 1)
        else:
            del self.live[token]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        token = data.draw(st.sampled_from(sorted(self.live)))
        self.live[token][1].renew()

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        """Moves the lease's expiry into the past, wherever it lives (the scripts cannot tell
        this from a lease that lapsed)."""
        token = data.draw(st.sampled_from(sorted(self.live)))
        seconds, micros = self.client.time()
        past = seconds * 1000 + micros // 1000 - 1
        raw = self.client.hget(self.keys.meta, "L")
        if raw and raw.split(b"|")[0] == token.encode():
            parts = raw.split(b"|")
            parts[1] = str(past).encode()
            self.client.hset(self.keys.meta, "L", b"|".join(parts))
        else:
            assert self.client.zscore(self.keys.leases, token) is not None
            self.client.zadd(self.keys.leases, {token: past})
        self.lapsed.append(self.live.pop(token)[1])

    @precondition(lambda self: self.lapsed)
    @rule(data=st.data())
    def release_lapsed(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.lapsed))
        self.lapsed.remove(lease)
        try:
            lease.release()
        except (LockLost, LockNotOwned):
            pass
        else:
            raise AssertionError("a lapsed lease was released as held")

    @rule(pause=st.booleans())
    def pause_or_resume(self, pause: bool) -> None:
        if pause:
            pause_lock(self.client, self.name, 60, namespace=NS)
        else:
            resume_lock(self.client, self.name, namespace=NS)
        self.paused = pause

    @rule(lean=st.booleans())
    def switch_layout(self, lean: bool) -> None:
        layout.set_layout(self.client, NS, "lean" if lean else "shared")

    @invariant()
    def agrees(self) -> None:
        held = {h.token for h in self.locks["lean"].holders()}
        assert held == set(self.live), (held, self.live)
        writers = [k for k, _, _ in self.live.values() if k != "read"]
        assert not writers or len(self.live) == 1
        raw = self.client.hget(self.keys.meta, "L")
        if raw:
            assert self.client.zcard(self.keys.leases) == 0, "a lease in L and in the leases key"

    def teardown(self) -> None:
        for _, lease, levels in self.live.values():
            for _ in range(levels):
                lease.release()
        resume_lock(self.client, self.name, namespace=NS)


def test_the_fast_and_general_paths_agree_with_the_model(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url)
    machine: Any = type("LeanModelRun", (LeanModel,), {"client": client})
    try:
        run_state_machine_as_test(machine, settings=SETTINGS)
    finally:
        client.close()
