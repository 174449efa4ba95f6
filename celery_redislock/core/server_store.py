"""The one-server store: a lock's scripts run on one Redis client (plain, Sentinel-managed, or a
Cluster), each in one round trip, then wait for the replicas (:mod:`.replicas`) if asked to.
Renewal batches many leases into one script call per client (per slot, pipelined per node, on
a Cluster).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import MovedError

from .holders import read_holders
from .layout import lean_allowed
from .protocol import (
    GIVE_UP_MODES,
    AcquireReply,
    AcquireStatus,
    ReleaseArgs,
    ReleaseReply,
    ReleaseWhereReply,
    RenewArgs,
    RenewReply,
)
from .reach import where
from .replicas import ReplicaPolicy, acknowledged, pipelined, refresh
from .scripts import run
from .store import Holder, LeaseView, LockView, RedisClient, Renewals, backend_errors

__all__ = ["ServerStore", "give_back", "renew_calls", "spread"]


class ServerStore:
    """A lock's leases on one Redis ``client``; ``replicas``: the acknowledgement each acquire
    and renewal waits for (None: none)."""

    # One per lock (a framework makes a lock per task call): slots make it cheap to make.
    __slots__ = ("client", "key", "replicas")
    queues = True

    def __init__(self, client: RedisClient, replicas: ReplicaPolicy | None) -> None:
        self.client = client
        self.replicas = replicas
        self.key: object = id(client)

    def where(self) -> str:
        return where(self.client)

    def drift(self, ttl: float) -> float:
        return 0.0

    def max_block(self) -> float:
        if isinstance(self.client, redis.Redis):
            socket_timeout = self.client.connection_pool.connection_kwargs.get("socket_timeout")
            if socket_timeout:
                # A blocking pop must return before the client's own read timeout fires.
                return float(socket_timeout) / 2
        return float("inf")

    def _run(
        self, lock: LockView, name: str, keys: list[bytes], args: list[str]
    ) -> tuple[Any, int]:
        """Script ``name``, then with a replica policy WAIT: the reply and the acknowledgements
        (0 without a policy)."""
        if self.replicas is None:
            return run(name, self.client, keys, args), 0
        return acknowledged(self.client, name, keys, args, self.replicas, slot_key=lock.keys.leases)

    def _lean(self, lock: LockView, args: list[str], size: int) -> list[bytes] | None:
        """The fast path's KEYS if this call may take it: a plain mutex's call with nothing
        more than ``size`` arguments (no job, park or claim), where the namespace allows it."""
        keys = lock.lean_keys
        if keys is None or len(args) != size or (size == 6 and args[5]):
            return None
        return keys if lean_allowed(self.client, lock.namespace) else None

    def gives_up_claims(self, lock: LockView) -> bool:
        """Whether an acquire of ``lock`` may end its owner's unique claim in the same call
        (``AcquireArgs.give_up``: the fast path, without a replica policy)."""
        return self.replicas is None and lock.lean_keys is not None

    def acquire(self, lock: LockView, args: list[str]) -> AcquireReply:
        if len(args) == 7 and args[6][:1] in GIVE_UP_MODES:  # (ARGV 7 no claim's token)
            return self._acquire_giving_up(lock, args)
        lean = self._lean(lock, args, 6)
        if self.replicas is None:  # (the common case, without a frame more)
            if lean is not None:  # (the meta key alone: a refusal pushes no wake-up)
                raw = run("lean_acquire", self.client, lean[:1], args)
                if raw != b"9" and raw != "9":
                    return AcquireReply.decode(raw)
            return AcquireReply.decode(run("acquire", self.client, lock.encoded_keys, args))
        raw = None
        if lean is not None:
            raw, acks = self._run(lock, "lean_acquire", lean[:1], args)
            if raw == b"9" or raw == "9":
                raw = None
        if raw is None:
            raw, acks = self._run(lock, "acquire", lock.encoded_keys, args)
        reply = AcquireReply.decode(raw)
        if self.replicas and reply.status is AcquireStatus.HELD and acks < self.replicas.count:
            # Fails closed: the lock drops a new lease (args[0] is its token) before the error
            # reaches the caller; an owner's re-entry into its lease is undone here, one level.
            if reply.token != args[0]:
                give_back(lock, self.client, reply.token, whole=False)
            self.replicas.check(acks, lock.name, "acquire")
        return reply

    def _acquire_giving_up(self, lock: LockView, args: list[str]) -> AcquireReply:
        """An acquire that ends the owner's unique claim (see :meth:`gives_up_claims`) on the
        fast path; the general path takes the lease alone (``gave_up`` None: the caller ends
        the claim in a call of its own)."""
        if self._lean(lock, args[:6], 6) is not None:
            keys = [lock.lean_keys[0], lock.keys.queued, lock.keys.replaced]  # type: ignore[index]
            raw = run("lean_acquire", self.client, keys, args)
            if raw != b"9" and raw != "9":
                return AcquireReply.decode(raw)
        return AcquireReply.decode(run("acquire", self.client, lock.encoded_keys, args[:6]))

    def abandon(self, lock: LockView, token: str) -> None:
        give_back(lock, self.client, token, whole=True)

    def await_push(self, lock: LockView, key: str, seconds: float, tries: int) -> Any | None:
        with backend_errors(lock.name):
            popped = self.client.blpop([key], timeout=seconds)
        return popped[1] if popped else None

    def claim(self, lock: LockView, token: str) -> int:
        renew = RenewArgs(ttl_ms=lock.ttl_ms, tokens=[token]).encode()
        with backend_errors(lock.name):
            raw, acks = self._run(lock, "renew", lock.encoded_keys[:2], renew)
            if self.replicas is not None:
                self.replicas.check(acks, lock.name, "acquire")
        return RenewReply.decode(raw).expiries[0]

    def release(self, lock: LockView, args: list[str]) -> ReleaseReply:
        lean = self._lean(lock, args, 4)
        if lean is not None:
            raw = run("lean_release", self.client, lean, args)
            if raw != b"9" and raw != "9":
                return ReleaseReply.decode(raw)
        return ReleaseReply.decode(run("release", self.client, lock.encoded_keys, args))

    def release_where(self, lock: LockView, args: list[str]) -> ReleaseWhereReply:
        return ReleaseWhereReply.decode(run("release_where", self.client, lock.encoded_keys, args))

    def finish(self, lock: LockView, args: list[str]) -> None:
        run("finish", self.client, lock.encoded_keys, args)

    def holders(self, lock: LockView) -> list[Holder]:
        return read_holders(self.client, lock.keys, lock.name).holders

    def renew(self, leases: Sequence[LeaseView], ttl: float | None) -> Renewals:
        sent = time.monotonic()
        group = list(leases)
        with backend_errors(group[0].lock.name if len(group) == 1 else None):
            expiries = _renew(self.client, group, ttl)
        if ttl is not None:
            valid = [sent + ttl] * len(group)
        else:
            valid = [sent + lease.lock.ttl for lease in group]
        return Renewals(expiries, valid, None)


def give_back(lock: LockView, client: RedisClient, token: str, *, whole: bool) -> None:
    """``release.lua`` for ``token``: the whole lease (the token the request id: sent twice, it
    counts once), or one re-entry level."""
    request = token if whole else os.urandom(8).hex()
    args = ReleaseArgs(token=token, spec=lock.spec, whole=whole, request=request).encode()
    run("release", client, lock.encoded_keys, args)


RenewCalls = list[tuple[list[int], list[bytes], list[str]]]
"""Script calls renewing leases: for each, the indexes of its leases, its keys, its args."""


def renew_calls(group: Sequence[LeaseView], ttl: float | None) -> RenewCalls:
    """Script calls renewing ``group``: one per distinct ttl (index list, keys, args)."""
    # One pass, building each call's keys and tokens as it goes: thousands of leases a call.
    fixed = None if ttl is None else max(1, round(ttl * 1000))
    by_ttl: dict[int, tuple[list[int], list[bytes], list[str]]] = {}
    for i, lease in enumerate(group):
        lock = lease.lock
        ms = lock.ttl_ms if fixed is None else fixed
        entry = by_ttl.get(ms)
        if entry is None:
            entry = by_ttl[ms] = ([], [], [])
        entry[0].append(i)
        entry[1].extend(lock.encoded_keys[:2])
        entry[2].append(lease.token)
    return [
        (indexes, keys, RenewArgs(ttl_ms=ms, tokens=tokens).encode())
        for ms, (indexes, keys, tokens) in by_ttl.items()
    ]


def _strictest(group: Sequence[LeaseView]) -> ReplicaPolicy | None:
    """The replica acknowledgement the batch needs: the most replicas any of its locks asks
    for, waited for as long as the longest of their timeouts."""
    policies = [lease.lock.replicas for lease in group if lease.lock.replicas is not None]
    if not policies:
        return None
    return ReplicaPolicy(max(p.count for p in policies), max(p.timeout for p in policies))


def spread(calls: RenewCalls, replies: list[Any], out: list[int]) -> list[int]:
    """The expiries the replies to :func:`renew_calls`' ``calls`` gave, put in ``out`` at their
    leases' indexes."""
    for (indexes, _, _), raw in zip(calls, replies, strict=True):
        for i, expiry in zip(indexes, RenewReply.decode(raw).expiries, strict=True):
            out[i] = expiry
    return out


def _renew(client: RedisClient, group: list[LeaseView], ttl: float | None) -> list[int]:
    if not isinstance(client, RedisCluster):
        return _renew_on_nodes(client, group, ttl)
    try:
        return _renew_on_nodes(client, group, ttl)
    except MovedError:
        # A failover moved slots: ask the cluster where they are now, and try once more
        # (renewal is safe to run twice).
        refresh(client)
        return _renew_on_nodes(client, group, ttl)
    except (redis.ConnectionError, redis.TimeoutError):
        refresh(client)  # a node is gone: the next try goes where its slots went
        raise


def _renew_on_nodes(client: RedisClient, group: list[LeaseView], ttl: float | None) -> list[int]:
    """Renews ``group`` in one round trip per node (an ASK answer sends its calls on to the
    node named). With replicas asked for, WAIT follows on each node's connection, and fewer
    acknowledgements than asked raise :class:`LockBackendError`: the renewal is not counted
    (its leases are at risk: the heartbeat tries again, and reports them lost if they lapse)."""
    out = [0] * len(group)
    policy = _strictest(group)
    cluster = client if isinstance(client, RedisCluster) else None
    nodes: dict[str, tuple[redis.Redis, RenewCalls]] = {}
    if not isinstance(client, RedisCluster):
        nodes[""] = (client, renew_calls(group, ttl))  # one node, one slot: the whole group
    else:
        # A script may touch one slot only: one call per slot, pipelined to each node.
        by_node: dict[str, tuple[redis.Redis, dict[int, list[int]]]] = {}
        for i, lease in enumerate(group):
            key = lease.lock.keys.leases
            node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
            entry = by_node.setdefault(node.name, (client.get_redis_connection(node), {}))
            entry[1].setdefault(client.keyslot(key), []).append(i)  # type: ignore[no-untyped-call]
        for name, (node_client, by_slot) in by_node.items():
            calls: RenewCalls = []
            for indexes in by_slot.values():
                for sub, keys, args in renew_calls([group[i] for i in indexes], ttl):
                    calls.append(([indexes[j] for j in sub], keys, args))
            nodes[name] = (node_client, calls)
    for node_client, calls in nodes.values():
        batch = [(keys, args) for _, keys, args in calls]
        replies, acks = pipelined(node_client, "renew", batch, policy, cluster=cluster)
        if policy is not None:
            names = {group[i].lock.name for indexes, _, _ in calls for i in indexes}
            policy.check(acks or 0, names.pop() if len(names) == 1 else None, "renewal")
        spread(calls, replies, out)
    return out
