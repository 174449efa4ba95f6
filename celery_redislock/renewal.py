"""Lease renewal: one call renews many leases, and one thread per process keeps them alive."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from .lock import Lease, RedisClient, backend_errors
from .scripts import run, script

__all__ = ["RenewReport", "Renewer", "renew_leases"]

log = logging.getLogger("celery_redislock.renewal")

OnLost = Callable[[Lease, BaseException | None], None]


@dataclass(frozen=True, slots=True)
class RenewReport:
    """What one :func:`renew_leases` call found: leases extended, and leases that were lost."""

    renewed: list[Lease]
    lost: list[Lease]


def renew_leases(leases: Iterable[Lease], *, ttl: float | None = None) -> RenewReport:
    """Extends every lease to ``ttl`` seconds from now (default: each lock's own ttl), never
    shortening one.

    One script call per Redis client (one per slot, pipelined per node, on Redis Cluster), so
    renewing thousands of leases costs one round trip per node. A lease that had lapsed or was
    removed is reported in ``lost`` and marked ``lease.lost``; it is never revived.
    """
    by_client: dict[int, tuple[RedisClient, list[Lease]]] = {}
    for lease in leases:
        by_client.setdefault(id(lease.lock.client), (lease.lock.client, []))[1].append(lease)
    renewed: list[Lease] = []
    lost: list[Lease] = []
    for client, group in by_client.values():
        sent = time.monotonic()
        name = group[0].name if len(group) == 1 else None
        with backend_errors(name):
            expiries = _run(client, group, ttl)
        for lease, expiry in zip(group, expiries, strict=True):
            if int(expiry) > 0:
                lease.expires_at_ms = int(expiry)
                lease.valid_until = sent + (ttl if ttl is not None else lease.lock.ttl)
                renewed.append(lease)
            else:
                lease.lost = True
                lost.append(lease)
    return RenewReport(renewed, lost)


def _calls(group: list[Lease], ttl: float | None) -> list[tuple[list[int], list[bytes], list[str]]]:
    """Script calls for ``group``: one per distinct ttl (index list, keys, args)."""
    by_ttl: dict[int, list[int]] = {}
    for i, lease in enumerate(group):
        ms = max(1, round((ttl if ttl is not None else lease.lock.ttl) * 1000))
        by_ttl.setdefault(ms, []).append(i)
    calls = []
    for ms, indexes in by_ttl.items():
        keys: list[bytes] = []
        args = [str(ms)]
        for i in indexes:
            lock_keys = group[i].lock.encoded_keys
            keys += (lock_keys[0], lock_keys[1])
            args.append(group[i].token)
        calls.append((indexes, keys, args))
    return calls


def _run(client: RedisClient, group: list[Lease], ttl: float | None) -> list[int]:
    out = [0] * len(group)
    if not isinstance(client, RedisCluster):
        for indexes, keys, args in _calls(group, ttl):
            for i, expiry in zip(indexes, run("renew", client, keys, args), strict=True):
                out[i] = int(expiry)
        return out
    # A script may touch one slot only: one call per slot, pipelined to each node in one go.
    by_node: dict[str, tuple[redis.Redis, dict[int, list[int]]]] = {}
    for i, lease in enumerate(group):
        key = lease.lock.keys.leases
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        entry = by_node.setdefault(node.name, (client.get_redis_connection(node), {}))
        entry[1].setdefault(client.keyslot(key), []).append(i)  # type: ignore[no-untyped-call]
    for node_client, by_slot in by_node.values():
        calls = []
        for indexes in by_slot.values():
            for sub, keys, args in _calls([group[i] for i in indexes], ttl):
                calls.append(([indexes[j] for j in sub], keys, args))
        replies = _pipelined(node_client, [(keys, args) for _, keys, args in calls])
        for (indexes, _, _), reply in zip(calls, replies, strict=True):
            for i, expiry in zip(indexes, reply, strict=True):
                out[i] = int(expiry)
    return out


def _pipelined(client: redis.Redis, calls: list[tuple[list[bytes], list[str]]]) -> list[Any]:
    renew = script("renew")
    for attempt in (1, 2):
        pipe = client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.evalsha(renew.sha, len(keys), *keys, *args)
        try:
            return pipe.execute()
        except NoScriptError:
            if attempt == 2:
                raise
            client.script_load(renew.script)
    raise AssertionError("unreachable")


@dataclass(eq=False)
class _Entry:
    lease: Lease
    on_lost: OnLost | None
    hold_until: float | None
    due: float = field(default=0.0)


class Renewer:
    """The process's background renewer: one daemon thread renews every registered lease each
    ttl/3, batched, and calls ``on_lost(lease, error)`` for a lease it finds lost (or cannot
    renew before it would lapse). After ``fork`` the child starts with an empty renewer of its
    own: it never renews what its parent registered.

    >>> lease = lock.acquire()                                          # doctest: +SKIP
    >>> Renewer.current().register(lease, on_lost=lambda l, e: alarm())  # doctest: +SKIP
    """

    _instance: Renewer | None = None
    _instance_pid: int = 0
    _create = threading.Lock()

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False
        # When the thread next wakes by itself (monotonic). A lease registered as due later
        # needs no wake-up: each task start would otherwise cost the thread a wake-up.
        self._wake_at = 0.0

    @classmethod
    def current(cls) -> Renewer:
        """This process's renewer (created on first use)."""
        with cls._create:
            if cls._instance is None or cls._instance_pid != os.getpid():
                cls._instance = cls()
                cls._instance_pid = os.getpid()
            return cls._instance

    @classmethod
    def _forget_after_fork(cls) -> None:
        # The parent's thread does not exist here and its locks may be held mid-operation.
        cls._instance = None
        cls._instance_pid = 0
        cls._create = threading.Lock()

    def register(
        self, lease: Lease, *, on_lost: OnLost | None = None, max_hold: float | None = None
    ) -> None:
        """Keeps ``lease`` alive until :meth:`unregister`, loss, or ``max_hold`` seconds."""
        hold_until = None if max_hold is None else time.monotonic() + max_hold
        entry = _Entry(lease, on_lost, hold_until, due=time.monotonic() + lease.lock.ttl / 3)
        with self._cond:
            self._entries[lease.token] = entry
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="redislock-renewer", daemon=True
                )
                self._thread.start()
            if entry.due < self._wake_at:
                self._cond.notify()  # due before the thread means to wake: it must look again

    def unregister(self, lease: Lease) -> None:
        """Stops renewing ``lease`` (call before or after releasing it)."""
        with self._cond:
            self._entries.pop(lease.token, None)

    def leases(self) -> list[Lease]:
        """The leases being renewed now."""
        with self._cond:
            return [e.lease for e in self._entries.values()]

    def stop(self) -> None:
        """Stops the thread; registered leases are then left to expire."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    now = time.monotonic()
                    # Idle, it still wakes each second: most registrations then fall due after
                    # that and need not wake it.
                    next_due = min((e.due for e in self._entries.values()), default=now + 1.0)
                    if next_due <= now:
                        break
                    self._wake_at = next_due
                    self._cond.wait(next_due - now)
                    self._wake_at = 0.0
                if self._stopped:
                    return
                now = time.monotonic()
                # Renew everything due within the next little while together: fewer round trips.
                due = [e for e in self._entries.values() if e.due <= now + 0.05]
                expired_hold = [e for e in due if e.hold_until is not None and now >= e.hold_until]
                for e in expired_hold:
                    del self._entries[e.lease.token]
                due = [e for e in due if e not in expired_hold]
            for e in expired_hold:
                log.warning(
                    "lock %r: lease %s reached its maximum hold; no longer renewed",
                    e.lease.name,
                    e.lease.token,
                )
            if due:
                self._renew(due)

    def _renew(self, due: list[_Entry]) -> None:
        lost: list[tuple[_Entry, BaseException | None]] = []
        failure: BaseException | None = None
        try:
            report = renew_leases([e.lease for e in due])
            gone = {id(lease) for lease in report.lost}
            lost = [(e, None) for e in due if id(e.lease) in gone]
        except Exception as exc:
            # Redis unreachable: keep trying; report the lease lost once it may have lapsed.
            log.warning("lease renewal failed, retrying: %s", exc)
            failure = exc
            now = time.monotonic()
            lost = [(e, failure) for e in due if now >= e.lease.valid_until]
        with self._cond:
            now = time.monotonic()
            for e in due:
                interval = e.lease.lock.ttl / 3
                e.due = now + (min(interval, 0.5) if failure is not None else interval)
            for e, _ in lost:
                self._entries.pop(e.lease.token, None)
        for e, error in lost:
            e.lease.lost = True
            log.error("lock %r: lease %s lost", e.lease.name, e.lease.token)
            if e.on_lost is not None:
                try:
                    e.on_lost(e.lease, error)
                except Exception:
                    log.exception("on_lost callback failed for lock %r", e.lease.name)


os.register_at_fork(after_in_child=Renewer._forget_after_fork)
