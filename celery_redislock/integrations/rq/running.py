"""A locked job in the process that runs it (RQ's work horse): the facts of the call in, the
core's :class:`~celery_redislock.core.run.LockedRun` decides, and its outcome out as RQ's answer:
a return value (``SKIPPED``), a ``Retry`` (a conflict retry, a wait for its first copy, a rate
slot ahead, a place in the task line: status ``scheduled``, on RQ 2.1 and 3.0 alike), or an
error. The horse leaves with ``os._exit`` (no ``atexit``): the ``finally`` here is the release."""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rq import get_current_job

from ...core.run import (
    AwaitFirst,
    Delivery,
    Fail,
    Finished,
    Framework,
    Held,
    LockedRun,
    Outcome,
    Parked,
    RetryAfter,
    RunUnlocked,
    Signals,
    Skip,
    TaskSpec,
)
from ._compat import Job, Retry, retry_after, save_meta
from .line import LINE_META, PutBack, line_of, payload_of
from .logs import to_worker_log
from .settings import Settings, client_for
from .signals import lock_acquired, lock_backend_error, lock_conflict, lock_lost, lock_released

__all__ = ["OUTCOME_META", "RATE_META", "SKIPPED", "outcome_of", "republished", "run"]

log = logging.getLogger(__name__)

SKIPPED = "SKIPPED"
"""What a job returns when it did not run because of its lock: ``on_conflict="skip"``, a copy
superseded under its unique key, or a copy of a run that already finished. The job's
``meta["redislock"]`` says which (see :func:`outcome_of`)."""

OUTCOME_META = "redislock"
RATE_META = "redislock_rate"
"""``job.meta`` key: the request id holding the job's reserved slot while it waits for it."""
_CONFLICTS_META = "redislock_conflicts"
_WAITS_META = "redislock_waits"
# Times the job parked in a task line: each returned RQ's Retry (counted in number_of_retries)
# though its body never ran, so they do not make it a re-run (as for Celery's hand-overs).
_PARKS_META = "redislock_parks"
# RQ's default job timeout; the parent kills a horse 60 s past its job's timeout.
_RQ_DEFAULT_TIMEOUT = 180
_KILL_GRACE = 60
# A parked job nobody puts back (line lost, no sweeper) is run by RQ's scheduler this long after
# its wait and hand-over window would have ended; it then ends as expired.
FALLBACK_MARGIN_S = 60.0

# RQ's scheduler brings a job back in whole seconds and looks every second: a rate slot at most
# 2 s ahead is waited for in the horse, a later one comes back 2 s early and waits the rest.
_RQ = Framework(
    word="job",
    republish_claims=False,
    own_retries=False,
    whole_seconds=True,
    rate_wait_in_place=2.0,
    rate_back_early=2.0,
)


def outcome_of(job: Job) -> dict[str, Any] | None:
    """Why a job did not run (``{"outcome": "skipped" | "superseded" | "finished" | "expired"
    | "full", "lock": ..., "holders": [...]}``; ``"queued"`` while it waits in the lock's task
    line), or ``None`` if it ran (or has not been run yet). It reads the job's meta from Redis
    (one round trip), so any ``Job`` answers: the one ``enqueue`` returned as well as a fetched
    one.

    >>> outcome_of(job)   # doctest: +SKIP
    {'outcome': 'skipped', 'lock': 'sync:42', 'holders': ['9b1c…']}
    """
    value = _current_meta(job).get(OUTCOME_META)
    return value if isinstance(value, dict) else None


def _current_meta(job: Job) -> dict[str, Any]:
    """The job's meta as stored now: a ``Job`` (the one ``enqueue`` returned) caches the meta
    it was made with, and the worker's horse writes the outcome after. A job whose hash has
    gone (its result expired) keeps what was read last."""
    raw = job.connection.hget(job.key, "meta")
    if isinstance(raw, bytes):  # (RQ's connections return bytes)
        job.meta = job.serializer.loads(raw)
    meta = job.meta
    return meta if isinstance(meta, dict) else {}


def republished(job: Job) -> bool:
    """Whether ``job`` runs again (an RQ retry, a conflict retry, a wait for its first copy)
    rather than for the first time."""
    meta = job.meta or {}
    return (
        bool(job.number_of_retries)
        or _CONFLICTS_META in meta
        or _WAITS_META in meta
        or LINE_META in meta
    )


def _delivery(job: Job | None, args: Any, kwargs: Any) -> Delivery:
    if job is None:  # called directly: no queue, no claim, no record
        return Delivery(uuid.uuid4().hex, args, kwargs, queued=False, rate_request=uuid.uuid4().hex)
    meta = job.meta or {}
    line = line_of(job) or {}
    state, now = line.get("state"), time.time()
    timeout = job.timeout or _RQ_DEFAULT_TIMEOUT
    return Delivery(
        job.id,
        args,
        kwargs,
        finish_job=job.id,
        conflicts=int(meta.get(_CONFLICTS_META, 0)),
        waits=int(meta.get(_WAITS_META, 0)),
        republished=(job.number_of_retries or 0) > int(meta.get(_PARKS_META, 0))
        or _CONFLICTS_META in meta
        or _WAITS_META in meta,
        line_token=line.get("token"),
        line_ended=state == "expired" or (state == "parked" and now > float(line.get("until", 0))),
        line_waited=max(0.0, now - float(line.get("since", now))),
        payload=lambda lock, _token: payload_of(job, lock),
        rate_request=str(meta.get(RATE_META) or f"{job.id}.{uuid.uuid4().hex[:12]}"),
        rate_came_back=RATE_META in meta,
        max_hold=None if timeout == -1 else float(timeout) + _KILL_GRACE,
    )


def _answer(run: LockedRun, job: Job | None, outcome: Outcome) -> Any:
    """RQ's answer to an outcome that does not run the job (the run logged and signalled it)."""
    if job is None:  # called directly: nothing comes back later
        if isinstance(outcome, Fail):
            raise outcome.error
        return SKIPPED
    meta = job.meta
    if RATE_META in meta and not (isinstance(outcome, RetryAfter) and outcome.cause == "rate"):
        del meta[RATE_META]  # its slot was taken: a later try reserves a new one
        save_meta(job)
    if isinstance(outcome, Skip | Finished):
        _mark(job, "finished" if isinstance(outcome, Finished) else outcome.kind, outcome)
        return SKIPPED
    if isinstance(outcome, Fail):
        if outcome.mark is not None:
            meta.pop(LINE_META, None)  # an RQ retry of this failure starts afresh
            _mark(job, outcome.mark, outcome)
        raise outcome.error
    if isinstance(outcome, Parked):
        now = time.time()
        before = line_of(job)
        meta[LINE_META] = {
            "token": outcome.place.token,
            "state": "parked",
            "until": now + outcome.max_wait,
            "since": before.get("since", now) if before is not None else now,
        }
        meta[_PARKS_META] = int(meta.get(_PARKS_META, 0)) + 1
        _mark(job, "queued", outcome)
        window = run.settings.line_handover_window
        return retry_after(job, outcome.max_wait + window + FALLBACK_MARGIN_S)
    if isinstance(outcome, AwaitFirst):
        meta[_WAITS_META] = outcome.waits + 1
    elif isinstance(outcome, RetryAfter):
        if outcome.cause == "rate":
            meta[RATE_META] = run.delivery.rate_request
        else:
            meta[_CONFLICTS_META] = outcome.conflicts + 1
    save_meta(job)
    assert isinstance(outcome, AwaitFirst | RetryAfter)
    return retry_after(job, outcome.delay)


def _mark(job: Job, outcome: str, what: Skip | Finished | Fail | Parked) -> None:
    """Records in the job's meta why it did not run (RQ stores what it returns, SKIPPED)."""
    job.meta[OUTCOME_META] = {"outcome": outcome, "lock": what.lock, "holders": what.holders}
    _save_meta(job, "record its outcome")


def _save_meta(job: Job, what: str) -> None:
    try:
        save_meta(job)
    except Exception as exc:  # informative only: the job's run or ending must not fail on it
        log.warning("job %s: could not %s: %s", job.id, what, exc)


def _left_line(job: Job) -> None:
    """The job runs after waiting in line (or for its rate slot): that state goes."""
    meta = job.meta
    changed = meta.pop(LINE_META, None) is not None
    changed = meta.pop(RATE_META, None) is not None or changed
    outcome = meta.get(OUTCOME_META)
    if isinstance(outcome, dict) and outcome.get("outcome") == "queued":
        del meta[OUTCOME_META]
        changed = True
    if changed:
        _save_meta(job, "update its meta")


@functools.cache  # said once
def _say_disabled() -> None:
    log.error(
        "celery_redislock is DISABLED (REDISLOCK_DISABLED or Settings(disabled=True)): "
        "jobs run without their locks and unique claims"
    )


def run(
    spec: TaskSpec,
    settings: Settings,
    fun: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Any:
    """Runs one call of the locked job ``fun`` (declared with ``spec``): see the module's
    docstring."""
    to_worker_log()  # (a plain rq Worker: its horse's first job; cheap after)
    if settings.disabled:
        _say_disabled()
        return fun(*args, **kwargs)
    job = get_current_job()
    client = client_for(settings, job.connection if job is not None else None)
    put_back = None
    if job is not None:  # its release hands the lock on to parked jobs, and puts them back
        put_back = PutBack(job.connection, job.serializer, client, settings.line_handover_window)
    signals = Signals(
        lock_acquired, lock_released, lock_conflict, lock_lost, lock_backend_error, spec.name
    )
    call = LockedRun(
        spec,
        _delivery(job, args, kwargs),
        settings,
        client,
        signals,
        _RQ,
        handover=put_back,
        max_conflict_retries=settings.max_conflict_retries,
    )
    outcome = call.take()
    if not isinstance(outcome, Held | RunUnlocked):
        return _answer(call, job, outcome)
    if job is not None:
        _left_line(job)
    finished = False
    try:
        result = fun(*args, **kwargs)
        finished = not isinstance(result, Retry)  # the job's own Retry: it runs again
        return result
    finally:
        if not finished and job is not None and (job.retries_left or 0) > 0:
            call.keep_claim_for_retry()  # RQ retries the failed job: still a duplicate meanwhile
        call.release(finished)
