"""One leader among a fleet of periodic schedulers (a Celery beat on every host), framework-free:
the leader's lease, renewed by the heartbeat, and what the fleet shares in Redis so that a new
leader goes on where the last one stopped: each entry's last run, and one mark per tick, so
that a tick is sent at most once however leadership moves.

A tick is named by its entry and the run before it (that run's time, in microseconds since
the epoch, fixes when the tick falls due): two schedulers that agree on an entry's last run
agree on its next tick, to the microsecond, whatever their clocks. Keys, all under the hash tag
of the leader's lock name (``beat:<name>``), so that they live on one Redis Cluster node:

- ``<namespace>:{beat:<name>}:runs``: hash, entry name -> its last run (µs); kept 7 days past
  the last write;
- ``<namespace>:{beat:<name>}:tick:<entry>:<run before>``: the tick's mark, set once
  (``SET NX``) by whoever sends (or skips) that tick; its value is the entry's new last run
  (µs), prefixed ``skip:`` for a skipped tick; kept 10 minutes (more than any beat waits
  between two looks at its schedule while leading).

The lease is a plain :class:`~celery_redislock.core.lock.Lock` lease (its holder record says
``role: beat`` and since when it leads), so ``redislock list`` and the web view show the leader
as they show any lock's holder; :mod:`.beat_leader` reads it for ``redislock beat``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis

from ..errors import LockBackendError, LockNotAcquired, LockNotOwned
from ._validate import non_empty_string
from .beat_leader import leader_lock_name
from .heartbeat import Heartbeat
from .keys import DEFAULT_NAMESPACE, check_namespace
from .lease import Lease, RedisClient, backend_errors
from .lock import Lock
from .replicas import policy_of

__all__ = ["MARK_KEEP", "RUNS_KEEP", "BeatLeader", "Claim", "now_micros"]

log = logging.getLogger(__name__)

# A mark outlives every race it settles: two beats that both believe they lead overlap by at
# most a ttl and a tick's wait. Ten minutes is far more, and keeps a 1 s entry's marks to 600.
MARK_KEEP = 600.0
# The fleet's last runs survive a week of no beat at all; then each beat's own state is used.
RUNS_KEEP = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class Claim:
    """What claiming a tick found: ``mine`` (this caller sends it), or the entry's last run
    another scheduler recorded (``run``, µs) and whether that one skipped it."""

    mine: bool
    run: int | None = None
    skipped: bool = False


class BeatLeader:
    """A scheduler's claim to lead the fleet ``name``, and the fleet's shared schedule state.

    ``lead(wait)`` takes the leader lease (waiting at most ``wait`` seconds, woken as the
    leader lets go or as its lease lapses) and keeps it renewed by the process's heartbeat;
    ``leading()`` says, without Redis, whether the lease is surely still held (not known lost,
    not past the moment it may have lapsed): check it just before each send. ``claim``
    marks a tick as sent, once across the fleet; ``ran`` records an entry's new last run;
    ``seed`` puts this scheduler's last runs where the fleet has none and answers the fleet's.
    """

    def __init__(
        self,
        client: RedisClient,
        name: str,
        *,
        ttl: float,
        namespace: str = DEFAULT_NAMESPACE,
        info: Mapping[str, object] | None = None,
    ) -> None:
        self.name = non_empty_string(name, "beat name")
        namespace = check_namespace(namespace)
        self.lock = Lock(client, leader_lock_name(name), ttl=ttl, namespace=namespace)
        self.client = client
        # The lease waits for replicas as the client's policy says (min_replicas); the marks and
        # last runs do too, on one server (WAIT on the pipeline's connection; on a Cluster the
        # WAIT would go to another node: there they are not waited for).
        policy = policy_of(client) if isinstance(client, redis.Redis) else None
        self._replicas = policy if policy is not None and policy.count else None
        tag = f"{namespace}:{{{self.lock.name}}}"
        self._runs_key = f"{tag}:runs"
        self._tick_prefix = f"{tag}:tick:"
        self._info = dict(info or {})
        self.lease: Lease | None = None
        self.since: datetime | None = None
        """When this scheduler took the lead (UTC), while it leads."""

    # -- leading ---------------------------------------------------------------------------

    def leading(self) -> bool:
        """Whether this scheduler surely holds the leader lease now (no call to Redis)."""
        lease = self.lease
        if lease is None:
            return False
        try:
            lease.check()
        except LockNotOwned:
            return False
        return True

    def lead(self, wait: float) -> bool:
        """Leads, or takes the lead within ``wait`` seconds; answers whether it leads. A lease
        found lost first is let go (logged at ERROR). :class:`LockBackendError` if Redis fails."""
        if self.lease is not None:
            if self.leading():
                return True
            self.step_down(lost=True)
        since = datetime.now(UTC)
        info = {**self._info, "role": "beat", "since": since.isoformat(timespec="seconds")}
        try:
            lease = self.lock.acquire(timeout=wait, info=info)
        except LockNotAcquired:
            return False
        self.lease, self.since = lease, since
        Heartbeat.current().register(lease, on_lost=self._on_lost, log_lost=False)
        log.info("beat %r: this beat leads now (lease %s)", self.name, lease.token)
        return True

    def _on_lost(self, lease: Lease, error: BaseException | None) -> None:
        # The heartbeat's thread: only the flag. The scheduler stops sending at its next look
        # (leading() is false from now), and says so there.
        lease.lost = True

    def step_down(self, *, lost: bool = False) -> None:
        """Stops leading: gives the lease back (a lease found lost is logged at ERROR)."""
        lease, self.lease, self.since = self.lease, None, None
        if lease is None:
            return
        Heartbeat.current().unregister(lease)
        if lost:
            log.error(
                "beat %r: this beat lost the leader lease %s; it sends nothing until it leads "
                "again",
                self.name,
                lease.token,
            )
            return
        try:
            lease.release()
        except (LockNotOwned, LockBackendError) as exc:
            log.warning("beat %r: giving the leader lease back failed: %s", self.name, exc)
        else:
            log.info("beat %r: this beat stepped down", self.name)

    # -- the shared schedule state ---------------------------------------------------------

    def seed(self, runs: Mapping[str, int]) -> dict[str, int]:
        """Writes each entry's last run in ``runs`` where the fleet has none, and answers the
        fleet's last run of every entry it knows."""
        with backend_errors(self.lock.name, "beat"):
            pipe = self.client.pipeline(transaction=False)
            for entry, run in runs.items():
                pipe.hsetnx(self._runs_key, entry, str(run))
            pipe.pexpire(self._runs_key, int(RUNS_KEEP * 1000))
            pipe.hgetall(self._runs_key)
            stored = pipe.execute()[-1]
        return {_text(k): int(v) for k, v in stored.items()}

    def last_run(self, entry: str) -> int | None:
        """The fleet's last run of ``entry`` (µs), if it has one."""
        with backend_errors(self.lock.name, "beat"):
            raw = self.client.hget(self._runs_key, entry)
        return None if raw is None else int(raw)

    def claim(self, entry: str, after: int, run: int, *, skip: bool = False) -> Claim:
        """Marks the tick of ``entry`` that follows its run ``after`` as taken by this caller,
        with ``run`` as the entry's new last run; once across the fleet (``SET NX``). If another
        took it first, answers what it recorded."""
        key = f"{self._tick_prefix}{entry}:{after}"
        value = f"skip:{run}" if skip else str(run)
        with backend_errors(self.lock.name, "beat"):
            pipe = self.client.pipeline(transaction=False)
            pipe.set(key, value, nx=True, px=int(MARK_KEEP * 1000))
            pipe.get(key)
            self._wait(pipe)
            taken, found, *acks = pipe.execute()
        text = _text(found) if found is not None else ""
        # (A redis-py retry of a SET whose reply was lost finds the caller's own value.)
        if taken or text == value:
            if acks and self._replicas is not None and acks[0] < self._replicas.count:
                # A failover now could lose the mark: give it up, send nothing (the tick is
                # tried again), as a lease not acknowledged fails closed.
                with backend_errors(self.lock.name, "beat"):
                    if self.client.get(key) in (value, value.encode()):
                        self.client.delete(key)
                self._replicas.check(acks[0], self.lock.name, "tick's mark")
            return Claim(mine=True)
        skipped = text.startswith("skip:")
        digits = text.removeprefix("skip:")
        return Claim(mine=False, run=int(digits) if digits.isdigit() else None, skipped=skipped)

    def ran(self, entry: str, run: int) -> None:
        """Records ``run`` (µs) as the entry's last run, for the next leader."""
        with backend_errors(self.lock.name, "beat"):
            pipe = self.client.pipeline(transaction=False)
            pipe.hset(self._runs_key, entry, str(run))
            pipe.pexpire(self._runs_key, int(RUNS_KEEP * 1000))
            self._wait(pipe)
            acks = pipe.execute()[2:]
        if acks and self._replicas is not None:
            self._replicas.check(acks[0], self.lock.name, "entry's last run")

    def _wait(self, pipe: Any) -> None:
        if self._replicas is not None:
            pipe.execute_command("WAIT", self._replicas.count, self._replicas.timeout_ms)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def now_micros() -> int:
    """This machine's clock now, in µs since the epoch."""
    return time.time_ns() // 1000
