"""One locked run, for every framework: :meth:`LockedRun.take` takes what a task's ``lock=``,
``unique=`` and ``rate=`` ask for before its body runs and answers with an
:mod:`~celery_redislock.core.run.outcome` value, logged, signalled and with its unique claim
kept or ended here, once; :meth:`LockedRun.release` gives the lease back after."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from functools import cached_property
from logging import DEBUG, ERROR, INFO, WARNING
from typing import Any, Literal

from ...errors import (
    JobFinished,
    LineFull,
    LockBackendError,
    LockConfigError,
    LockNotAcquired,
    LockNotOwned,
)
from .. import outcomes
from ..backoff import conflict_delay, first_delivery_delay
from ..claims import ClaimKind, ReleaseMode, claim, claim_holder_action, release_claim
from ..heartbeat import Heartbeat
from ..lease import Lease, RedisClient
from ..line import Handover, line_token, park
from ..line import Parked as Place
from ..lock import Lock
from ..lock_set import acquire_all
from ..options import LockOptions
from ..protocol import ReleaseClaimReply
from ..rate import MAX_DELAY, RateLimit, reserve_all
from ..redlock import lock_factory
from .current import RateSlot, set_current_lease, set_current_rate
from .delivery import (
    Delivery,
    DuplicateMark,
    Framework,
    RunSettings,
    SignalLike,
    Signals,
    TaskSpec,
)
from .outcome import (
    AwaitFirst,
    Fail,
    Finished,
    Held,
    Outcome,
    Parked,
    RetryAfter,
    RunUnlocked,
    Skip,
)

__all__ = ["LockedRun", "locks_of_call", "make_lock"]

log = logging.getLogger(__name__)


# The locks calls are made from (Lock.named), one per client and settings: what a lock checks
# and encodes as it is made is done once, not per call. (A forked RQ horse also finds the one
# its worker made before the fork.) Cleared when full: their number is that of the distinct
# lock settings in use, not of calls.
_TEMPLATES: dict[tuple[object, ...], Lock] = {}
_TEMPLATES_KEPT = 256


def make_lock(
    settings: RunSettings,
    client: RedisClient,
    options: LockOptions,
    name: str,
    handover: Handover | None = None,
) -> Lock:
    """The lock ``name`` a task with the lock ``options`` takes (on the RedLock masters if the
    settings name some); ``handover`` publishes the parked runs its release hands it to."""
    target = settings.redlock_urls or client
    ttl = options.ttl or settings.ttl
    made = (
        target,
        ttl,
        options.mode,
        options.limit,
        settings.namespace,
        settings.fence_keep,
        settings.line_handover_window,
    )
    template = _TEMPLATES.get(made)
    if template is None:
        template = lock_factory(
            target,
            name,
            ttl=ttl,
            mode=options.mode,
            limit=options.limit,
            namespace=settings.namespace,
            fence_keep=settings.fence_keep,
            handover_window=settings.line_handover_window,
        )
        if len(_TEMPLATES) >= _TEMPLATES_KEPT:
            _TEMPLATES.clear()
        _TEMPLATES[made] = template
    return template.named(name, handover)


def locks_of_call(
    spec: TaskSpec,
    settings: RunSettings,
    client: RedisClient,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    handover: Handover | None = None,
) -> list[Lock]:
    """The locks a call of a task with a ``lock=`` option takes: its lock, then a ``lock=``
    list's further locks (``handover`` goes to the first: only it may have a line)."""
    options = spec.lock
    assert options is not None
    first = make_lock(settings, client, options, spec.name_of(options, args, kwargs), handover)
    more = [make_lock(settings, client, o, spec.name_of(o, args, kwargs)) for o in options.also]
    return [first, *more]


class LockedRun:
    """One delivery of a locked task, in the process that runs it. ``max_conflict_retries``:
    the conflict retries allowed when the lock gives no ``max_retries`` (``None``: no limit).

    >>> run = LockedRun(spec, delivery, settings, client, signals, framework)  # doctest: +SKIP
    >>> outcome = run.take()                                                  # doctest: +SKIP
    """

    def __init__(
        self,
        spec: TaskSpec,
        delivery: Delivery,
        settings: RunSettings,
        client: RedisClient,
        signals: Signals,
        framework: Framework,
        *,
        handover: Handover | None = None,
        max_conflict_retries: int | None = None,
    ) -> None:
        self.spec = spec
        self.delivery = delivery
        self.settings = settings
        self.client = client
        self.signals = signals
        self.framework = framework
        self.handover = handover
        self.max_conflict_retries = max_conflict_retries
        self.who = f"{framework.word} {spec.name}[{delivery.id}]"
        self.lease: Lease | None = None
        self.more_leases: Sequence[Lease] = ()  # a lock= list's further leases
        self.taken = 0.0
        self._finish = False  # a finished run is recorded as such when its lease goes
        self._claim_ended = False
        # How the queued claim ended as the lease was taken (None: not yet; see _take).
        self._claim_ended_by: ReleaseClaimReply | None = None

    # -- names -----------------------------------------------------------------------------------

    @cached_property
    def lock_name(self) -> str:
        """The name of the lock this call takes."""
        assert self.spec.lock is not None
        return self._name_of(self.spec.lock)

    def unique_name(self) -> str:
        """The unique key of this call (the lock's name when both are keyed alike)."""
        unique, options = self.spec.unique, self.spec.lock
        assert unique is not None
        if options is not None and (unique.keying.key, unique.keying.scope) == (
            options.key,
            options.scope,
        ):
            return self.lock_name
        return self._name_of(unique.keying)

    def _name_of(self, keying: LockOptions) -> str:
        return self.spec.name_of(keying, self.delivery.args, self.delivery.kwargs)

    # -- taking ----------------------------------------------------------------------------------

    def take(self) -> Outcome:
        """Takes what the options ask for, in order: the rate slot, the lease (or a place in the
        line), the give-up of the queued unique claim; returns how the delivery goes on."""
        unlocked: RunUnlocked | None = None
        set_current_rate(None)
        set_current_lease(None)
        if self.delivery.duplicate is not None:
            return self._duplicate(self.delivery.duplicate)
        for wanted, step in ((self.spec.rate, self._rate_slot), (self.spec.lock, self._lease)):
            instead = None if wanted is None else step()
            if isinstance(instead, RunUnlocked):
                unlocked = instead
            elif instead is not None:
                return instead
        return self._start_claim() or unlocked or Held(self.lease)

    def _rate_slot(self) -> Outcome | None:
        options, d, fw = self.spec.rate, self.delivery, self.framework
        assert options is not None
        names = [self._name_of(each.keying) for each in options.limits]
        try:
            costs = [each.cost_of(self.spec.name, d.args, d.kwargs) for each in options.limits]
        except LockConfigError as exc:
            return self._fail(exc)
        # A run brought back for its slot came early on purpose: it waits the rest in place.
        in_place = fw.rate_wait_in_place + (fw.rate_back_early if d.rate_came_back else 0.0)
        if not d.queued:  # (it cannot come back: it waits for its slot here, however far)
            in_place = MAX_DELAY.high
        asked = time.monotonic()
        limits = [
            RateLimit(
                self.client,
                name,
                each.rate,
                burst=each.burst,
                slack=each.slack,
                namespace=self.settings.namespace,
            )
            for name, each in zip(names, options.limits, strict=True)
        ]
        try:
            slot = reserve_all(
                list(zip(limits, costs, strict=True)),
                d.rate_request,
                max_delay=options.max_delay,
                max_late=min(each.slack for each in options.limits),
                near=in_place,
            )
        except LockBackendError as exc:
            return self._backend_down(names[0], exc)
        name = slot.name
        shown = slot.rate or options.limits[names.index(name)].rate
        if not slot.granted:
            self._conflict_signal(name, "rate", retry_after=slot.delay)
            return self._not_acquired(
                f": rate limit {name!r} ({shown}) has no start free for "
                f"{slot.delay:.1f}s, past max_delay ({options.max_delay}s)",
                name,
                retry_after=slot.delay,
            )
        if slot.started or slot.delay <= in_place:  # (started: its start is counted, at slot)
            if slot.delay:
                time.sleep(slot.delay)
            waited = time.monotonic() - asked
            set_current_rate(RateSlot(tuple(limits), d.rate_request, slot, tuple(costs), waited))
            return None
        self._say(
            INFO,
            ": rate limit %r (%s) is full; it comes back for its slot in %.2fs",
            name,
            shown,
            slot.delay,
        )
        self._conflict_signal(name, "rate", retry_after=slot.delay)
        back = slot.delay - fw.rate_back_early
        if fw.whole_seconds:  # (the scheduler looks once a second: back 1 to 2 s early)
            back = float(max(1, math.floor(back)))
        self._keep_claim_coming_back(back)
        return RetryAfter(back, "rate", f"rate limit {name!r} is full", d.conflicts)

    def _lease(self) -> Outcome | None:
        options, d = self.spec.lock, self.delivery
        assert options is not None
        action = options.on_conflict or self.settings.on_conflict
        name = self.lock_name
        info = {"task_id": d.id, "task": self.spec.name}
        asked = time.monotonic()
        locks: dict[str, Lock] = {}  # a lock= list's locks, by name
        try:
            lock = make_lock(self.settings, self.client, options, name, self.handover)
            if d.line_ended:  # its wait in line passed max_wait: it fails, not run
                error = LockNotAcquired(
                    f"{self.who}: waited in the task line of lock {name!r} longer than max_wait "
                    f"({options.max_wait:g}s); not run",
                    name=name,
                    timeout=options.max_wait,
                )
                msg = " not run: it waited in the task line of lock %r longer than max_wait (%gs)"
                return self._refused(lock, "expired", error, msg, options.max_wait)
            got: Lease | Place
            line = action == "queue" or (d.line_token and not options.also)
            if d.queued and d.payload is not None and line:
                # A run that waited in the line goes on through it, whatever its lock says now
                # (but for a list: it has no line, and takes every lock as any run does).
                token = d.line_token or line_token()
                tenant, priority = self.spec.tenant_of(options, d.args, d.kwargs) or (None, 0)
                got = park(
                    lock,
                    d.payload(lock, token),
                    token=token,
                    owner=d.id,
                    info=info,
                    job=d.finish_job,
                    max_wait=options.max_wait,
                    max_waiting=options.max_waiting,
                    tenant=tenant,
                    priority=priority,
                )
            else:
                if options.also:  # a lock= list: every lock or none (it has no line)
                    locks = self._lock_set(lock)
                leases = self._take(list(locks.values()) or [lock], action, info)
                got, self.more_leases = leases[0], leases[1:]
        except JobFinished:
            self._say(INFO, " dropped: a copy of it already ran to its end under lock %r", name)
            self._conflict_signal(name, "drop", [d.id])
            return Finished(name, [d.id])
        except LineFull as exc:
            msg = " not run: the task line of lock %r is full (%d parked)"
            return self._refused(lock, "full", exc, msg, exc.parked)
        except LockNotAcquired as exc:
            lock = locks.get(exc.name or "", lock)  # (of a set: the one that had no room)
            if exc.owner_expires_in is not None:  # another delivery of this very task holds it
                return self._await_first(lock, exc.owner_expires_in)
            return self._conflict(lock, action)
        except LockConfigError as exc:  # a set that cannot be taken at once here
            return self._fail(exc)
        except LockBackendError as exc:
            return self._backend_down(name, exc)
        if isinstance(got, Place):
            holders = self._holders(lock)
            paused = 0.0 if holders else self._paused_for(lock)
            self._say(
                INFO,
                " parked in the task line of lock %r (%d waiting): %s",
                name,
                got.parked,
                f"paused for {paused:.1f}s" if paused else f"held by {outcomes.held_by(holders)}",
            )
            self._conflict_signal(name, "queue", holders)
            # A copy replaced under its unique key (the lock's name) leaves the line as it is
            # replaced, or here if that came first: never handed the lock. (Not a retry: it
            # runs even when a newer copy was queued after it started.)
            in_line = got.token if not d.republished and self._keyed_alike(name) else ""
            self._keep_claim(options.max_wait + self.settings.line_handover_window, in_line)
            return Parked(got, name, holders, options.max_wait)
        self.lease, self.taken = got, time.monotonic()
        self._finish = d.finish_job is not None
        max_hold = options.max_hold if options.max_hold is not None else d.max_hold
        waited = d.line_waited + self.taken - asked
        for lease in (got, *self.more_leases):
            # _on_lost logs the loss, naming the run: the heartbeat's line would repeat it.
            Heartbeat.current().register(
                lease, on_lost=self._on_lost, max_hold=max_hold, log_lost=False
            )
            self._signal(self.signals.acquired, lock=lease.name, lease=lease, waited=waited)
        set_current_lease(got)
        return None

    def _take(self, locks: list[Lock], action: str, info: dict[str, str]) -> list[Lease]:
        """Takes the lease (of a ``lock=`` list, every lease at once); the owner is the task id,
        not re-entrant: a second delivery of a running task is a conflict."""
        d, options = self.delivery, self.spec.lock
        assert options is not None
        wait = action == "wait"
        timeout = options.timeout if wait else None
        if len(locks) > 1:
            return acquire_all(
                locks, wait, timeout, owner=d.id, reentrant=False, info=info, job=d.finish_job
            )
        give_up = self._claim_give_up(locks[0].name)
        if give_up:  # (in the same call where it can: see _start_claim)
            lease, self._claim_ended_by = locks[0].acquire_giving_up(
                give_up, wait, timeout, owner=d.id, info=info, job=d.finish_job
            )
            return [lease]
        lease = locks[0].acquire(
            wait, timeout, owner=d.id, reentrant=False, info=info, job=d.finish_job
        )
        return [lease]

    def _lock_set(self, first: Lock) -> dict[str, Lock]:
        """The locks of a ``lock=`` list, by name, ``first`` first (their names made from this
        call's arguments)."""
        options = self.spec.lock
        assert options is not None
        locks = {first.name: first}
        for each in options.also:
            name = self._name_of(each)
            if name in locks:
                raise LockConfigError(
                    f"{self.who}: two locks of its lock= list make the name {name!r} for this "
                    "call; the keys of a list must make different names",
                    name=name,
                )
            locks[name] = make_lock(self.settings, self.client, each, name)
        return locks

    def _on_lost(self, lost: Lease, error: BaseException | None) -> None:
        # Reported as the run lets go of it (release() has dropped its leases already): the
        # task saw the lapse first and ended, and does not go on.
        running = lost is self.lease or lost in self.more_leases
        self._say(
            ERROR,
            ": lease on lock %r lost%s; %s",
            lost.name,
            f" ({error})" if error else "",
            "the task goes on without it" if running else "seen as the task let go of it",
        )
        self._signal(self.signals.lost, lease=lost, error=error)

    # -- not running now ---------------------------------------------------------------------

    def _conflict(self, lock: Lock, action: str) -> Outcome:
        options, d = self.spec.lock, self.delivery
        assert options is not None
        holders = self._holders(lock)
        paused = 0.0 if holders else self._paused_for(lock)
        held_by = outcomes.held_by(holders)
        unique = self.spec.unique
        if unique is not None and unique.queued and d.queued:
            was = action
            action = claim_holder_action(
                self.client,
                self.settings.namespace,
                lock.name,
                d.id,
                action,
                running_counts=unique.running_counts,
            )
            if action != was:
                held_by += ", and this copy holds the unique claim"
        why = f"lock {lock.name!r} is held by {held_by}"
        if paused:
            why = f"lock {lock.name!r} is paused for {paused:.1f}s"
        self._conflict_signal(lock.name, action, holders, retry_after=paused or None)
        if action == "skip":
            self._say(INFO, " skipped: %s", why)
            self.end_claim()
            return Skip("skipped", lock.name, holders)
        if action == "retry":  # (not before the pause ends: a retry before it is spent)
            return self._retry(lock.name, why, "conflict", at_least=paused)
        if action == "wait":
            return self._not_acquired(
                f": {why} after waiting {options.timeout}s", lock.name, options.timeout
            )
        return self._not_acquired(f": {why}", lock.name)

    def _retry(
        self,
        name: str,
        why: str,
        cause: Literal["conflict", "backend"],
        at_least: float = 0.0,
    ) -> Outcome:
        """Comes back later as the same job, within ``max_retries`` conflict retries, no sooner
        than ``at_least`` seconds."""
        options, d = self.spec.lock or LockOptions(), self.delivery
        conflicts = d.conflicts
        error: LockNotAcquired | None = None
        if options.count_retries:
            error = LockNotAcquired(f"{self.who}: {why}", name=name)
            if not self.framework.own_retries:  # the framework's retry policy decides
                return self._fail(error)
        else:
            limit = options.max_retries
            if limit is None:
                limit = self.max_conflict_retries
            if limit is not None and conflicts >= limit:
                return self._not_acquired(
                    f": gave up after {conflicts} conflict retries: {why}", name
                )
            if not d.queued:
                return self._not_acquired(f" (eager): {why}", name)
        delay = self._seconds(max(at_least, conflict_delay(options.countdown, conflicts)))
        self._say(INFO, " retries in %.1fs: %s", delay, why)
        if error is not None:
            return RetryAfter(delay, cause, why, conflicts, own=True, error=error)
        if cause != "backend":  # (with Redis down, the claim could not be kept either)
            self._keep_claim_coming_back(delay)
        return RetryAfter(delay, cause, why, conflicts)

    def _await_first(self, lock: Lock, expires_in: float) -> Outcome:
        """Another delivery of this very task holds the lease: it still runs (a visibility
        timeout, a requeue), or its worker died and the lease has yet to lapse. Nobody can tell
        yet, so this copy looks again once that lease may have lapsed (or sooner), then is
        dropped if the first delivery finished, and run if it did not."""
        d = self.delivery
        if not d.queued:
            eager = f" (eager): another delivery holds lock {lock.name!r}"
            return self._not_acquired(eager, lock.name)
        delay = self._seconds(first_delivery_delay(lock.ttl, expires_in, d.waits))
        self._say(
            INFO,
            ": another copy of it holds lock %r (running, or its worker died); this one looks "
            "again in %.1fs",
            lock.name,
            delay,
        )
        self._keep_claim_coming_back(delay)
        self._conflict_signal(lock.name, "await", [d.id])
        return AwaitFirst(delay, d.waits)

    def _refused(
        self, lock: Lock, mark: str, error: BaseException, msg: str, *args: object
    ) -> Outcome:
        """It fails without running, its line place refused or over (logged at WARNING)."""
        self._say(WARNING, msg, lock.name, *args)
        holders = self._holders(lock)
        self._conflict_signal(lock.name, mark, holders)
        return self._fail(error, mark, lock.name, holders)

    def _backend_down(self, name: str, exc: LockBackendError) -> Outcome:
        policy = self.settings.on_backend_error
        self._signal(self.signals.backend_error, lock=name, error=exc, policy=policy)
        if policy == "run":
            self._say(ERROR, " runs WITHOUT lock %r: Redis failed: %s", name, exc)
            return RunUnlocked(exc)
        if policy == "retry":
            return self._retry(name, f"Redis for lock {name!r} failed: {exc}", "backend")
        return self._fail(exc)

    def _duplicate(self, mark: DuplicateMark) -> Fail:
        """A workflow's step published although a duplicate: it fails at once, taking nothing
        (the key and its claim are the holder's)."""
        self._claim_ended = True
        self._say(
            INFO,
            " not run: %s is %s under unique key %r (a step of a workflow)",
            mark.holder,
            mark.state,
            mark.name,
        )
        return Fail(mark.error(self.who), lock=mark.name, holders=[mark.holder])

    def _fail(
        self, error: BaseException, mark: str | None = None, lock: str = "", holders: Any = ()
    ) -> Fail:
        self.end_claim()  # the job is over
        return Fail(error, mark, lock, list(holders))

    def _not_acquired(
        self,
        why: str,
        name: str,
        timeout: float | None = None,
        retry_after: float | None = None,
    ) -> Fail:
        error = LockNotAcquired(
            f"{self.who}{why}", name=name, timeout=timeout, retry_after=retry_after
        )
        return self._fail(error)

    def _paused_for(self, lock: Lock) -> float:
        """Seconds left of the lock's pause, asked only of a lock found full with no holder
        (0 when it cannot be told)."""
        try:
            return lock.paused_for()
        except (LockBackendError, LockConfigError):
            return 0.0

    def _holders(self, lock: Lock) -> list[str]:
        try:
            return [str(h.info.get("task_id", h.token)) for h in lock.holders()]
        except LockBackendError:
            return []

    def _say(self, level: int, words: str, *args: object) -> None:
        """Logs how this run goes on, worded alike for every framework."""
        outcomes.log.log(level, "task %s[%s]" + words, self.spec.name, self.delivery.id, *args)

    def _signal(self, signal: SignalLike, **named: Any) -> None:
        if signal.receivers:  # (no cost without receivers)
            signal.send(sender=self.signals.sender, task_id=self.delivery.id, **named)

    def _conflict_signal(
        self,
        name: str,
        action: str,
        holders: Sequence[str] = (),
        retry_after: float | None = None,
    ) -> None:
        self._signal(
            self.signals.conflict,
            lock=name,
            action=action,
            holders=list(holders),
            retry_after=retry_after,
        )

    def _seconds(self, delay: float) -> float:
        return float(max(1, round(delay))) if self.framework.whole_seconds else delay

    # -- the queued unique claim -----------------------------------------------------------------

    def _start_claim(self) -> Outcome | None:
        """Gives up the claim this job's publish made, now that it runs (with its lease held,
        so a job unique until finished is never free in between: a producer sees it queued,
        then running); a once_per_period run keeps it for its period from now. A copy replaced
        meanwhile (its revoke may be on its way, or lost), or that outlived its claim while a
        newer copy was queued, does not run: the newer does."""
        unique, d = self.spec.unique, self.delivery
        if unique is None or not unique.queued or not d.queued:
            return None
        name = self.unique_name()
        period = unique.kept_after_start
        ended = self._claim_ended_by
        if ended is not None:  # ended already, as the lease was taken (_take)
            holder = ended.superseded_by
        else:
            mode = ReleaseMode.GIVE_UP if period is None else ReleaseMode.START
            try:
                holder = release_claim(
                    self.client, self.settings.namespace, name, d.id, mode=mode, keep=period or 0.0
                )
            except LockBackendError as exc:
                log.warning(
                    "unique key %r: could not release as task %s started: %s", name, d.id, exc
                )
                return None
        if holder is None or d.republished:
            return None  # a retry runs even though a newer copy was queued after it started
        self.release(finished=False)
        self._claim_ended = True  # given up just now; the key is the newer copy's
        self._say(INFO, " skipped: superseded by %s under unique key %r", holder, name)
        self._conflict_signal(name, "superseded", [holder])
        return Skip("superseded", name, [holder])

    def end_claim(self) -> None:
        """The job ends without running: its queued claim goes (never raises)."""
        unique = self.spec.unique
        if unique is None or not unique.queued or not self.delivery.queued or self._claim_ended:
            return
        self._claim_ended = True
        try:
            release_claim(
                self.client, self.settings.namespace, self.unique_name(), self.delivery.id
            )
        except (LockBackendError, LockConfigError) as exc:
            log.warning("%s: could not release its unique key: %s", self.who, exc)

    def keep_claim_for_retry(self) -> None:
        """A job unique until it finishes is about to be retried by its framework (after a
        failure): it claims its key as queued before its lease goes, so that no copy slips in
        between (the retry's publish then extends the claim)."""
        unique = self.spec.unique
        if unique is not None and unique.running_counts:
            self._keep_claim(0.0)

    def _keep_claim_coming_back(self, delay: float) -> None:
        if not self.framework.republish_claims:
            self._keep_claim(delay)

    def _claim_give_up(self, lock_name: str) -> str:
        """``AcquireArgs.give_up`` for the lease of ``lock_name``: how this run's queued claim
        ends as it takes that lease, when the claim's key is the lock's name (else ``""``)."""
        unique = self.spec.unique
        if unique is None or not unique.queued or not self.delivery.queued:
            return ""
        if not self._keyed_alike(lock_name):
            return ""
        period = unique.kept_after_start
        return "g" if period is None else f"s{max(1, int(period * 1000))}"

    def _keyed_alike(self, lock_name: str) -> bool:
        """Whether the call's unique key is the lock ``lock_name`` (a run lock's line)."""
        return self.spec.unique is not None and self.unique_name() == lock_name

    def _keep_claim(self, delay: float, parked_as: str = "") -> None:
        """The job will run later: it holds its unique key meanwhile, as if queued.
        ``parked_as``: its entry in the task line of the lock named like the key, just made
        (replaced meanwhile, it leaves the line: see ``unique_claim.lua``)."""
        unique = self.spec.unique
        if unique is None or not unique.queued or not self.delivery.queued:
            return
        try:
            claim(
                self.client,
                self.settings.namespace,
                self.unique_name(),
                task_id=self.delivery.id,
                lifetime=delay + (unique.allowance or self.settings.queue_allowance),
                kind=ClaimKind.REPUBLISH,
                running_counts=unique.running_counts,
                parked_as=parked_as,
            )
        except (LockBackendError, LockConfigError) as exc:
            log.warning("%s: could not keep its unique key: %s", self.who, exc)

    # -- giving back -----------------------------------------------------------------------------

    def release(self, finished: bool) -> None:
        """Gives the lease back (if held; of a ``lock=`` list, every lease); for a run that ended
        for good (``finished``) with a finish record to make, records it in the same step as the
        first lease goes, so a copy delivered again finds either the lease or the record, never
        neither. Sends ``lock_released``. Never raises."""
        set_current_rate(None)
        set_current_lease(None)
        record, self._finish = self._finish, False  # (only a run holding its lease records)
        lease, self.lease = self.lease, None
        more, self.more_leases = self.more_leases, ()
        if lease is None:
            return
        job = self.delivery.finish_job if finished and record else None
        keep = self.settings.completion_ttl if job is not None else None
        held = time.monotonic() - self.taken
        # (The further leases after the first: a copy delivered again meets the finish record
        # first, never a free first lock with the others still held by this run.)
        for each in (lease, *more):
            self._give_back(each, job if each is lease else None, keep, held)

    def _give_back(self, lease: Lease, job: str | None, keep: float | None, held: float) -> None:
        Heartbeat.current().unregister(lease)
        if lease.released:
            return
        try:
            lease.release(finish_job=job, keep=keep)
        except LockBackendError as exc:
            log.warning(
                "lock %r: release failed, the lease lapses within its ttl: %s", lease.name, exc
            )
        except LockNotOwned as exc:  # expired or removed (LockLost): nothing left to give back
            # Already reported lost (at ERROR, by _on_lost): this is no news.
            level = DEBUG if lease.lost else WARNING
            log.log(level, "lock %r: lease was no longer held at release: %s", lease.name, exc)
        except Exception:  # never mask how the task itself ended
            log.exception("lock %r: release failed, the lease lapses within its ttl", lease.name)
        else:
            self._signal(self.signals.released, lock=lease.name, lease=lease, held=held)
