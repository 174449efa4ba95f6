"""A lock held across a workflow (a chain of tasks): taken as the first link starts, passed with
each next link's message, released as the last link ends, as a link fails, or within ``ttl``
after the process holding it died.

Between two links no link runs: the process that published the next link keeps renewing the
lease (:mod:`.keeper`) until that link starts, at most ``max_gap`` seconds. The next link tells
it so through a second lease, the *gap* lease (lock ``<name>:gap:<token>``), taken as the next
link is published: the link releases it as it starts, and the keeper, which renews the
workflow's lease only while the gap lease is there, stops. If the keeper dies first, both lapse
within ``ttl`` and the next link fails with :class:`~celery_redislock.errors.LockLost` as it
starts: another workflow may have run in the gap. Nothing here changes the lock's scripts or
keys: a lease is adopted by its token, and renewed (token-checked) by whichever process holds
it now."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from logging import INFO
from typing import Any

from ...errors import LockBackendError, LockLost, RedisLockError
from ..heartbeat import Heartbeat
from ..lease import Mode
from ..lock import renew_leases
from ..options import LockOptions
from .delivery import Delivery, Framework, RunSettings, Signals, TaskSpec
from .keeper import keepers
from .outcome import Held, Outcome
from .run import LockedRun, make_lock

__all__ = [
    "PassedLease",
    "WorkflowRun",
    "gap_name",
    "keepers_release_all",
    "release_passed",
]

log = logging.getLogger(__name__)


def gap_name(name: str, token: str) -> str:
    """The gap lease's lock, one per workflow lease (a cap's workflows each have their own)."""
    return f"{name}:gap:{token}"


@dataclass(frozen=True, slots=True)
class PassedLease:
    """What a link's message carries of its workflow's lease: the lock, the lease, and the gap
    lease its keeper renews until this link starts."""

    name: str
    token: str
    fence: int
    mode: str
    owner: str
    gap: str

    def encode(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "token": self.token,
            "fence": self.fence,
            "mode": self.mode,
            "owner": self.owner,
            "gap": self.gap,
        }

    @classmethod
    def decode(cls, value: object) -> PassedLease | None:
        """The lease a message carries (``None``: none, or not one of ours)."""
        if not isinstance(value, Mapping):
            return None
        name, token, fence = value.get("name"), value.get("token"), value.get("fence")
        mode, owner, gap = value.get("mode"), value.get("owner"), value.get("gap")
        strings = (name, token, mode, owner, gap)
        if all(isinstance(s, str) and s for s in strings) and isinstance(fence, int):
            return cls(str(name), str(token), fence, str(mode), str(owner), str(gap))
        return None


class WorkflowRun(LockedRun):
    """One link of a locked workflow. The first link (``passed`` is ``None``) takes the lock as
    a task's ``lock=`` does, with the same ``on_conflict``; a later link adopts the lease its
    message carries. A link that publishes the next one hands the lease on
    (:meth:`hand_on`) instead of releasing it; any other ending releases it."""

    def __init__(
        self,
        spec: TaskSpec,
        delivery: Delivery,
        settings: RunSettings,
        client: Any,
        signals: Signals,
        framework: Framework,
        *,
        link: int,
        passed: PassedLease | None,
        max_gap: float,
        handover: Any = None,
    ) -> None:
        super().__init__(spec, delivery, settings, client, signals, framework, handover=handover)
        self.link = link
        self.passed = passed
        self.max_gap = max_gap
        self._handed: PassedLease | None = None

    def take(self) -> Outcome:
        if self.passed is None and self.link == 0:
            return super().take()
        passed = self.passed
        if passed is None and not self.delivery.queued:
            # Eager (chain.apply(), task_always_eager): the links run one after another in the
            # caller, each on its own, and no message carries a lease: only the first link
            # takes the lock.
            return Held(None)
        if passed is None:  # published by hand, or by an older release: no lease to go on with
            error = LockLost(
                f"{self.who}: link {self.link + 1} of a locked workflow came without its "
                "workflow's lease; not run",
                name=None,
            )
            return self._fail(error)
        return self._adopt(passed)

    def _options(self) -> LockOptions:
        assert self.spec.lock is not None
        return self.spec.lock

    def _adopt(self, passed: PassedLease) -> Outcome:
        """Goes on with the lease the message carries: renewed now (lost: the workflow ends
        here), the keeper told (the gap lease released), then renewed by this process."""
        options = self._options()
        lock = make_lock(self.settings, self.client, options, passed.name)
        mode: Mode = "read" if passed.mode == "read" else "write"
        lease = lock.new_lease(passed.token, passed.fence, mode, passed.owner, 0, time.monotonic())
        keepers.take(passed.token)  # (the previous link ran in this very process: it stops)
        try:
            lost = bool(renew_leases([lease]).lost)
        except LockBackendError as exc:
            # Not known whether the lease lives: the keeper goes on keeping it (the gap lease
            # stays), and a retry of this link (redislock_on_backend_error="retry") looks again.
            return self._backend_down(passed.name, exc)
        self._release_gap(passed)
        if lost:
            self._say(
                INFO,
                " not run: its workflow's lease on lock %r lapsed while it waited in the queue",
                passed.name,
            )
            error = LockLost(
                f"{self.who}: its workflow's lease on lock {passed.name!r} lapsed while it "
                f"waited in the queue (the process keeping it died, or it waited longer than "
                f"max_gap, {self.max_gap:g}s); not run",
                name=passed.name,
                token=passed.token,
            )
            return self._fail(error, lock=passed.name)
        self.lease, self.taken = lease, time.monotonic()
        max_hold = options.max_hold if options.max_hold is not None else self.delivery.max_hold
        Heartbeat.current().register(
            lease, on_lost=self._on_lost, max_hold=max_hold, log_lost=False
        )
        return Held(lease)

    def _release_gap(self, passed: PassedLease) -> None:
        """Tells the keeper that this link started: its gap lease goes."""
        gap = make_lock(
            self.settings, self.client, self._options(), gap_name(passed.name, passed.token)
        )
        try:
            gap.release_tokens([passed.gap])
        except RedisLockError as exc:
            log.warning(
                "%s: could not release the gap lease of lock %r (its keeper renews the "
                "workflow's lease for at most max_gap): %s",
                self.who,
                passed.name,
                exc,
            )

    def hand_on(self) -> PassedLease | None:
        """The next link (or this link's retry) is being published: the lease goes with it, and
        this process keeps it until that link starts. ``None``: this run holds no lease (a
        first link sent back before it took the lock). A later link sent back before it adopted
        its lease (Redis failed) passes on the lease it came with. Asked again (a publish
        retried), the same answer."""
        if self._handed is not None:
            return self._handed
        lease = self.lease
        if lease is None and self.passed is not None and not self.taken:
            return self.passed  # sent back before it could adopt the lease: still the keeper's
        if lease is None or lease.released or lease.lost:
            return None
        gap_lock = make_lock(
            self.settings, self.client, self._options(), gap_name(lease.name, lease.token)
        )
        # The gap lease first: if it cannot be taken, the lease stays this run's (released at
        # its end) and the next link, with no lease, fails as it starts.
        gap = gap_lock.acquire(blocking=False, info={"task_id": self.delivery.id, "gap": "1"})
        # From the heartbeat to the keeper, which renews it only while the gap lease lives.
        Heartbeat.current().unregister(lease)
        keepers.keep(lease, gap, self.max_gap)
        self.lease, self.more_leases = None, ()  # no longer this run's to release
        self._handed = PassedLease(
            lease.name, lease.token, lease.fence, lease.mode, lease.owner or "", gap.token
        )
        return self._handed

    @property
    def handed_on(self) -> bool:
        """Whether the lease went on with the next link's message."""
        return self._handed is not None

    def releases_at_body_end(self, has_next: bool) -> bool:
        """Whether the lease goes as the body ends: not while a next link is to be published
        (the publish hands it on; a body that raised releases it at the run's end)."""
        return not has_next

    def ended(self, went_on: bool) -> None:
        """The run's end: ``went_on``, the next link (or this link's retry) was published and the
        run ended so (Celery: ``SUCCESS``, ``RETRY``). Otherwise a hand-on made before the run
        failed (the publish raised, or storing the result) is taken back: both leases go now."""
        if self._handed is None or went_on:
            return
        keepers.take(self._handed.token)
        release_passed(
            self.settings,
            self.client,
            self._handed,
            self.who,
            "failed after its next link was sent",
        )

    def release(self, finished: bool) -> None:
        if self._handed is None:
            super().release(finished)


def release_passed(
    settings: RunSettings, client: Any, passed: PassedLease, who: str, why: str
) -> None:
    """A link that will not run (revoked, discarded) releases its workflow's lease and gap
    lease now, so that the next workflow need not wait for ``max_gap`` (never raises)."""
    options = LockOptions()
    try:
        make_lock(settings, client, options, gap_name(passed.name, passed.token)).release_tokens(
            [passed.gap]
        )
        freed = make_lock(settings, client, options, passed.name).release_tokens([passed.token])
    except RedisLockError as exc:
        log.warning("%s %s: could not release its workflow's lease: %s", who, why, exc)
        return
    if freed:
        log.info("lock %r released: %s %s", passed.name, who, why)


def keepers_release_all() -> None:
    """At process shutdown: the leases this process keeps between links go at once (their next
    links then fail as they start, as they would once the leases lapsed)."""
    for keeper in keepers.all():
        keepers.take(keeper.lease.token)
        lease = keeper.lease
        try:
            # Only while the gap lease lives: gone, the next link started and holds the lease.
            if keeper.gap.lock.release_tokens([keeper.gap.token]):
                lease.lock.release_tokens([lease.token])
                log.info("lock %r released: its workflow's keeper exits", lease.name)
        except RedisLockError as exc:
            log.warning("lock %r: could not release at shutdown: %s", lease.name, exc)
