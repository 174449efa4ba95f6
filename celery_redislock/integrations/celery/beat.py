"""A Celery beat on every host that sends each tick once: :class:`LeaderScheduler` runs any
scheduler class (``redislock_beat_scheduler``: Celery's ``PersistentScheduler`` by default,
django-celery-beat's, RedBeat's) while it holds the fleet's leader lease, and waits otherwise.

What it adds to the scheduler it runs, all through :class:`~celery_redislock.core.beat.BeatLeader`:

- leading: a standby waits on the leader lease (woken as the leader lets go or its lease
  lapses); a beat that finds its lease lost sends nothing from that moment;
- on taking the lead: each entry's last run as the fleet last recorded it, so the schedule goes
  on where the last leader left it; a tick that fell due while no beat led is sent once, or
  skipped (``missed``: the entry's ``options={"redislock": {"missed": "skip"}}``, else the
  setting ``redislock_beat_missed``);
- each send: the tick claimed once across the fleet first (a mark per entry and the run before
  it), the entry's new last run recorded after.

>>> app.conf.beat_scheduler = "celery_redislock:LeaderScheduler"   # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from celery import Celery
from celery.beat import ScheduleEntry, Scheduler
from celery.utils.imports import symbol_by_name

from ...core.beat import BeatLeader, now_micros
from ...core.beat_leader import check_missed, from_micros, micros
from ...core.settings import Settings
from ...errors import LockBackendError, LockConfigError
from ._compat import embedded_beat_parent, forget_beat_heap, set_last_run
from .guard import refuse_to_start
from .settings import client_for, settings_for

__all__ = [
    "OPTION",
    "LeaderScheduler",
    "beat_name_of",
    "check_beat",
    "check_beat_schedule",
    "entry_missed",
    "refuse_bad_beat",
]

log = logging.getLogger(__name__)

OPTION = "redislock"
"""The key of a beat entry's ``options`` that holds ours (taken out of what is sent)."""
_ENTRY_OPTIONS = ("missed",)
# After Redis failed: how long a beat waits before it asks again (no spin on a dead server).
_BACKOFF = 1.0
# A standby's longest wait on the lease in one tick (it is woken earlier by a release or lapse):
# short, so that the "since" its lease records is the second it took the lead.
_STANDBY_WAIT = 1.0
_CLASSES: dict[type, type] = {}


def entry_missed(name: str, options: Mapping[str, Any] | None, default: str) -> str:
    """The missed-tick policy of beat entry ``name``: its ``options["redislock"]["missed"]``,
    else ``default``. A bad option raises :class:`LockConfigError` naming the entry and it."""
    ours = (options or {}).get(OPTION)
    if ours is None:
        return default
    if not isinstance(ours, Mapping):
        raise LockConfigError(
            f"beat entry {name!r}: option {OPTION!r} must be a dict such as "
            f"{{'missed': 'skip'}}, got {ours!r}"
        )
    unknown = sorted(str(key) for key in ours if key not in _ENTRY_OPTIONS)
    if unknown:
        raise LockConfigError(
            f"beat entry {name!r}: unknown option {OPTION}.{unknown[0]} "
            f"(known: {', '.join(_ENTRY_OPTIONS)})"
        )
    return check_missed(ours.get("missed", default), f"beat entry {name!r}: option {OPTION}.missed")


def check_beat_schedule(schedule: Mapping[str, Any], default: str) -> None:
    """Checks our options of every entry of ``schedule`` (``beat_schedule``'s dicts, or a
    scheduler's entries); the first bad one raises :class:`LockConfigError` naming it."""
    for name, entry in schedule.items():
        if isinstance(entry, ScheduleEntry):
            options = entry.options
        elif isinstance(entry, Mapping):
            options = entry.get("options")
        else:
            continue  # (Celery refuses it itself)
        entry_missed(str(name), options, default)


def beat_name_of(app: Celery, settings: Settings) -> str:
    """The fleet's name: ``redislock_beat_name``, else the app's main name."""
    return settings.beat_name or app.main or "celery"


def _inner_class(settings: Settings) -> type[Scheduler]:
    inner = settings.beat_scheduler
    what = "setting redislock_beat_scheduler"
    if isinstance(inner, str):
        try:
            inner = symbol_by_name(inner)
        except (ImportError, AttributeError, ValueError) as exc:
            raise LockConfigError(f"{what}: cannot import {inner!r}: {exc}") from exc
    if not (isinstance(inner, type) and issubclass(inner, Scheduler)):
        raise LockConfigError(f"{what} must name a celery.beat.Scheduler class, got {inner!r}")
    if issubclass(inner, LeaderScheduler):
        raise LockConfigError(
            f"{what} names the scheduler the leader runs (PersistentScheduler, "
            "django-celery-beat's, RedBeat's), not LeaderScheduler itself"
        )
    return inner


def check_beat(app: Celery) -> None:
    """If ``app``'s ``beat_scheduler`` is :class:`LeaderScheduler`: its settings and the
    options of its ``beat_schedule``'s entries (a bad one raises :class:`LockConfigError`)."""
    named = app.conf.beat_scheduler
    ours = (isinstance(named, str) and named.endswith(":LeaderScheduler")) or (
        isinstance(named, type) and issubclass(named, LeaderScheduler)
    )
    if ours:
        settings = settings_for(app)
        _inner_class(settings)
        check_beat_schedule(app.conf.beat_schedule or {}, settings.beat_missed)


def refuse_bad_beat(sender: Any = None, **_: Any) -> None:
    """``worker_init`` receiver: a worker whose app's beat would refuse to start (``worker
    --beat`` runs it in a child process, whose error alone would leave the worker running with
    no beat) refuses to start itself."""
    app = getattr(sender, "app", None)
    if not isinstance(app, Celery):
        return
    try:
        check_beat(app)
    except LockConfigError as exc:
        refuse_to_start(exc)


def _leader_class(inner: type[Scheduler]) -> type[LeaderScheduler]:
    made = _CLASSES.get(inner)
    if made is None:
        made = type(
            "LeaderScheduler",
            (LeaderScheduler, inner),
            {"__module__": __name__, "__qualname__": f"LeaderScheduler[{inner.__qualname__}]"},
        )
        _CLASSES[inner] = made
    return made


def _run_of(entry: Any) -> int:
    """An entry's last run in µs; 0 for an entry that never ran and has none (RedBeat's may
    not): every beat names its first tick alike."""
    return 0 if entry.last_run_at is None else micros(entry.last_run_at)


def _moment(run: int, like: datetime | None) -> datetime:
    """``run`` (µs) as a datetime of the same kind as ``like``: in its zone, or naive UTC."""
    moment = from_micros(run)
    if like is None or like.tzinfo is None:
        return moment.replace(tzinfo=None)
    return moment.astimezone(like.tzinfo)


def _due(entry: Any, after: int) -> int | None:
    """When the tick that follows the run ``after`` (µs) fell due, in µs: exact for an interval
    (``schedule``), else the schedule's own estimate (``None`` if it has none)."""
    schedule = entry.schedule
    if entry.last_run_at is None:
        return None
    every = getattr(schedule, "run_every", None)
    if isinstance(every, timedelta) and not getattr(schedule, "relative", False):
        return after + every // timedelta(microseconds=1)
    try:
        return micros(schedule.now() + schedule.remaining_estimate(entry.last_run_at))
    except Exception:  # (a schedule without an estimate: the tick is named all the same)
        return None


class LeaderScheduler(Scheduler):  # type: ignore[misc]
    """Celery beat's scheduler for a fleet: run ``celery beat`` (or ``celery worker --beat``)
    on every host; the one that holds the leader lease sends, each tick once, and the others
    take over within ``redislock_beat_ttl`` once it is gone. It runs the scheduler class named
    by ``redislock_beat_scheduler`` (made as a subclass of both, so that class's own ``tick``,
    ``reserve`` and storage run unchanged).

    >>> app.conf.beat_scheduler = "celery_redislock:LeaderScheduler"   # doctest: +SKIP
    """

    def __new__(cls, app: Celery, *args: Any, **kwargs: Any) -> LeaderScheduler:
        if cls is LeaderScheduler:
            cls = _leader_class(_inner_class(settings_for(app)))
        made: LeaderScheduler = super().__new__(cls)
        return made

    def __init__(self, app: Celery, *args: Any, **kwargs: Any) -> None:
        settings = settings_for(app)
        # Set before the scheduler's own __init__, which may sync or tick through our methods.
        self._settings = settings
        self._name = beat_name_of(app, settings)
        self._missed_default = settings.beat_missed
        self._leader: BeatLeader | None = None
        self._reserved: dict[str, Any] = {}
        self._retry_at = 0.0
        self._worker: int | None = None  # (worker --beat: the worker's pid, at the first tick)
        self._taking_over = False  # (until _take_over went through: Redis may fail in it)
        check_beat_schedule(app.conf.beat_schedule or {}, self._missed_default)
        super().__init__(app, *args, **kwargs)

    # -- leading -------------------------------------------------------------------------------

    @property
    def leader(self) -> BeatLeader:
        """This beat's claim to lead (made on first use: in the process that ticks)."""
        if self._leader is None:
            self._worker = embedded_beat_parent()
            inner = next(c for c in type(self).__mro__ if not issubclass(c, LeaderScheduler))
            self._leader = BeatLeader(
                client_for(self.app, self._settings),
                self._name,
                ttl=self._settings.beat_ttl,
                namespace=self._settings.namespace,
                info={"scheduler": f"{inner.__module__}:{inner.__qualname__}"},
            )
        return self._leader

    def tick(self, *args: Any, **kwargs: Any) -> float:
        wait = self._retry_at - time.monotonic()
        if wait > 0:
            return wait
        leader = self.leader
        if self._worker is not None and os.getppid() != self._worker:
            # The worker that ran this embedded beat was killed (SIGKILL reaches only its own
            # pid; the OOM killer): an orphan beat would lead on, unseen. Stop; another leads.
            log.error("beat %r: the worker of this beat is gone: this beat stops", self._name)
            raise SystemExit(1)
        try:
            if not leader.leading():
                if not leader.lead(min(self._settings.beat_ttl, _STANDBY_WAIT)):
                    return 0.0  # (the wait was in lead(): look again at once)
                self._taking_over = True
            if self._taking_over:
                self._take_over(leader)
                self._taking_over = False
        except LockBackendError as exc:
            log.error("beat %r: the lock Redis failed; sending nothing: %s", self._name, exc)
            self._retry_at = time.monotonic() + _BACKOFF
            return _BACKOFF
        interval: float = super().tick(*args, **kwargs)
        return interval

    def _take_over(self, leader: BeatLeader) -> None:
        """This beat just took the lead: the fleet's last runs, then the missed ticks."""
        entries = dict(self.schedule)
        mine = {n: micros(e.last_run_at) for n, e in entries.items() if e.last_run_at is not None}
        fleet = leader.seed(mine)
        for name, entry in entries.items():
            run = fleet.get(name)
            if run is not None and run != mine.get(name):
                set_last_run(entry, _moment(run, entry.last_run_at))
        forget_beat_heap(self)
        for name, entry in entries.items():
            self._missed_tick(leader, name, entry)

    def _missed_tick(self, leader: BeatLeader, name: str, entry: Any) -> None:
        """An entry due as this beat takes the lead fell due while no beat led: sent once (by
        the scheduler's next tick) or skipped, as its policy says. A mark found on it means a
        beat that led took it after the fleet's last run was written (it died between the two):
        the entry moves on to that run, and is looked at again."""
        for _ in range(3):
            try:
                due = bool(entry.is_due()[0])
            except Exception:  # (the scheduler's own tick logs it)
                return
            if not due or entry.last_run_at is None:
                return
            if self._missed(name, entry) == "send":
                log.info(
                    "beat %r: entry %r fell due while no beat led: sending it once (missed='send')",
                    self._name,
                    name,
                )
                return
            now = now_micros()
            claim = leader.claim(name, micros(entry.last_run_at), now, skip=True)
            if claim.mine:
                set_last_run(entry, _moment(now, entry.last_run_at))
                leader.ran(name, now)
                log.info(
                    "beat %r: entry %r fell due while no beat led: skipped (missed='skip'); "
                    "next tick counted from now",
                    self._name,
                    name,
                )
                return
            log.info(
                "beat %r: entry %r not sent: another beat %s that tick",
                self._name,
                name,
                "skipped" if claim.skipped else "sent",
            )
            if claim.run is None:
                return
            set_last_run(entry, _moment(claim.run, entry.last_run_at))

    def _missed(self, name: str, entry: Any) -> str:
        try:
            return entry_missed(name, getattr(entry, "options", None), self._missed_default)
        except LockConfigError as exc:  # an entry read at run time (a database's, RedBeat's)
            log.error("%s; using redislock_beat_missed=%r", exc, self._missed_default)
            return self._missed_default

    # -- sending -------------------------------------------------------------------------------

    def reserve(self, entry: Any) -> Any:
        new = super().reserve(entry)
        self._reserved[entry.name] = new  # (its last run is the one this send records)
        return new

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        name = entry.name
        reserved = self._reserved.pop(name, None)
        leader = self._leader
        if leader is None or not leader.leading():
            # A beat that may have lost the lead sends nothing: the new leader sends this tick.
            log.error(
                "beat %r: entry %r not sent: this beat does not hold the leader lease",
                self._name,
                name,
            )
            return None
        after = _run_of(entry)
        if advance:
            reserved = self.reserve(entry)
            self._reserved.pop(name, None)
        run = _run_of(reserved) if reserved is not None else now_micros()
        try:
            fleet = leader.last_run(name)
            if fleet is not None and fleet > after:
                # This beat's entry is older than the fleet's (a database scheduler read it
                # again, say): that tick was sent; count the next from the fleet's run.
                if reserved is not None:
                    set_last_run(reserved, _moment(fleet, reserved.last_run_at))
                log.info(
                    "beat %r: entry %r not sent: the fleet ran it later than this beat knew",
                    self._name,
                    name,
                )
                return None
            claim = leader.claim(name, after, run)
        except LockBackendError as exc:
            # Not sent: the entry stays due, and is tried again at the next look.
            if reserved is not None:
                set_last_run(reserved, entry.last_run_at)
            forget_beat_heap(self)
            self._retry_at = time.monotonic() + _BACKOFF
            log.error(
                "beat %r: entry %r not sent: the lock Redis failed (tried again in %g s): %s",
                self._name,
                name,
                _BACKOFF,
                exc,
            )
            return None
        if not claim.mine:
            if reserved is not None and claim.run is not None:
                set_last_run(reserved, _moment(claim.run, reserved.last_run_at))
            log.info(
                "beat %r: entry %r not sent: another beat %s that tick",
                self._name,
                name,
                "skipped" if claim.skipped else "sent",
            )
            return None
        saved = entry.options
        entry.options = self._message_options(name, entry, after, run)
        try:
            result = super().apply_async(entry, producer=producer, advance=False, **kwargs)
        finally:
            entry.options = saved
        try:
            leader.ran(name, run)
        except LockBackendError as exc:  # the tick's mark says it: a new leader reads it there
            log.warning("beat %r: entry %r: last run not recorded: %s", self._name, name, exc)
        return result

    def _message_options(self, name: str, entry: Any, after: int, run: int) -> dict[str, Any]:
        """What is sent: the entry's options less ours, and a header naming the tick."""
        options = {k: v for k, v in (entry.options or {}).items() if k != OPTION}
        headers = dict(options.get("headers") or {})
        tick: dict[str, Any] = {"beat": self._name, "entry": name, "after": after, "run": run}
        tick["due"] = _due(entry, after)
        headers["redislock_beat"] = tick
        options["headers"] = headers
        return options

    # -- ending --------------------------------------------------------------------------------

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._leader is not None:
                self._leader.step_down()  # a standby takes over at once, not after the ttl

    @property
    def info(self) -> str:
        inner: str = super().info
        lines = [
            f"    . leader lease -> beat:{self._name} (ttl {self._settings.beat_ttl:g} s, "
            f"missed={self._missed_default!r})"
        ]
        return "\n".join([inner, *lines] if inner else lines)
