"""A locked task in the process that runs it: the facts of the delivery in (request, headers),
the core's :class:`~celery_redislock.core.run.LockedRun` decides in ``before_start`` (where
Celery honours ``Ignore``, ``Retry`` and ``Reject``), its outcome out as Celery's answer. The
lease goes back as the body ends (``acks_late`` or line delivery: after its result is stored,
with the finish record), at a retry, and at shutdown. Also ``lock_for``; the line's re-publish."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from celery import Celery
from celery.exceptions import Ignore, Reject, Retry
from kombu.utils.json import dumps, loads

from ...core import outcomes
from ...core.confirmations import confirmations
from ...core.line import Handed, Handover
from ...core.lock import Lock
from ...core.run import (
    AwaitFirst,
    Delivery,
    DuplicateMark,
    Fail,
    Framework,
    Held,
    LockedRun,
    Outcome,
    RetryAfter,
    RunUnlocked,
    Signals,
    Skip,
    TaskSpec,
    locks_of_call,
)
from ...core.run.workflow import PassedLease, WorkflowRun, keepers_release_all
from ...core.workflow_options import WorkflowOptions, options_from_message
from ...errors import LockConfigError
from .kind import (
    CONFLICTS_HEADER,
    DUPLICATE_HEADER,
    LINE_EXPIRED_HEADER,
    LINE_HEADER,
    LINE_SINCE_HEADER,
    RATE_HEADER,
    REDELIVERY_HEADER,
    WORKFLOW_HEADER,
    WORKFLOW_LEASE_HEADER,
    LockAware,
    is_locked_task,
)
from .settings import app_state, client_for, settings_for
from .signals import lock_acquired, lock_backend_error, lock_conflict, lock_lost, lock_released
from .tracelog import answered_with_ignore

__all__ = [
    "SKIPPED",
    "current_link",
    "current_run",
    "end_claim",
    "end_run",
    "handover_for",
    "lock_for",
    "locks_for",
    "release_all_held",
    "release_at_body_end",
    "release_for_retry",
    "start",
    "workflow_declared",
]

SKIPPED = "SKIPPED"
"""The outcome of a run skipped because its lock was held. A skipped Celery run ends in the
state ``FAILURE`` with :class:`~celery_redislock.errors.TaskSkipped` (in earlier
releases, a state of its own that ``.get()`` waited on for ever); RQ returns this string."""

_ATTR = "_redislock_run"  # on the request: this delivery's LockedRun
_CELERY = Framework(
    word="task",
    republish_claims=True,  # a re-publish passes send_task, which claims the key again
    own_retries=True,
    whole_seconds=False,
    rate_wait_in_place=0.05,  # cheaper than a message through the broker
)


def _spec(task: LockAware) -> TaskSpec:
    # Made once per task, and again only if one of its options was replaced since.
    made: TaskSpec | None = getattr(task, "_redislock_run_spec", None)
    if (
        made is None
        or made.name != task.name
        or made.lock is not task.lock_options
        or made.unique is not task.unique_options
        or made.rate is not task.rate_options
        or made.signature is not task.call_signature
    ):
        made = TaskSpec(
            task.name,
            task.lock_options,
            task.unique_options,
            task.rate_options,
            task.call_signature,
        )
        task._redislock_run_spec = made  # type: ignore[attr-defined]
    return made


def _signals(task: LockAware) -> Signals:
    return Signals(lock_acquired, lock_released, lock_conflict, lock_lost, lock_backend_error, task)


def lock_for(task: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> Lock:
    """The lock a call of ``task`` with these arguments takes (same key derivation as the run;
    of a ``lock=`` list, the first). A task that declares no ``lock=`` (nor a ``unique=`` that
    implies one) raises :class:`LockConfigError`.

    >>> lock_for(sync_customer, (42,)).holders()   # doctest: +SKIP
    """
    return locks_for(task, args, kwargs)[0]


def locks_for(
    task: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
) -> list[Lock]:
    """Every lock a call of ``task`` takes: its lock, then a ``lock=`` list's further ones."""
    if not is_locked_task(task) or task.lock_options is None:
        raise LockConfigError(f"task {getattr(task, 'name', task)!r} has no lock option")
    settings = settings_for(task.app)
    client = client_for(task.app, settings)
    return locks_of_call(_spec(task), settings, client, args, kwargs or {}, handover_for(task.app))


def handover_for(app: Celery) -> Handover:
    """Publishes a parked task of ``app`` again (one function per app)."""
    state = app_state(app)
    if state.handover is None:

        def publish(handed: Handed) -> None:
            signature = app.signature(loads(handed.payload))  # type: ignore[no-untyped-call]
            if handed.replaced:
                _end_replaced(app, signature)
            elif handed.expired:
                headers = {**(signature.options.get("headers") or {}), LINE_EXPIRED_HEADER: True}
                signature.apply_async(headers=headers)
            else:
                signature.apply_async()

        state.handover = publish  # (two threads at once: two equal functions, either kept)
    return state.handover


def _payload(task: LockAware, token: str) -> str:
    """The running request as a message to publish again (same id, retries, headers, route),
    marked with the line token it will claim and when it first joined a line."""
    request = task.request
    headers = {LINE_SINCE_HEADER: time.time(), **(request.headers or {}), LINE_HEADER: token}
    return str(dumps(dict(task.signature_from_request(request, headers=headers))))  # type: ignore[no-untyped-call]


def _delivery(task: LockAware, request: Any, task_id: str, args: Any, kwargs: Any) -> Delivery:
    headers = request.headers or {}
    eager = bool(request.is_eager)
    retries = int(request.retries or 0)
    conflicts = int(headers.get(CONFLICTS_HEADER, 0) or 0)
    token = headers.get(LINE_HEADER) or None
    # Only an acks_late message can be delivered again after it ran (its ack lost with its
    # worker), so only such a job is recorded as finished; and one published from the task
    # line, whose hand-over may be published twice (its publisher died before confirming it).
    job = None
    if token and not eager:
        job = f"{task_id}.{retries}.{token}"
    elif task.acks_late and not eager:
        job = f"{task_id}.{retries}.{conflicts}"
    since = headers.get(LINE_SINCE_HEADER)
    waited = 0.0
    if token and isinstance(since, int | float) and not isinstance(since, bool):
        waited = max(0.0, time.time() - float(since))
    limits = request.timelimit or (None, None)  # this call's own time_limit, if given
    hard = limits[0] or task.time_limit or settings_for(task.app).task_time_limit
    return Delivery(
        task_id,
        args or (),
        kwargs or {},
        queued=not eager,
        finish_job=job,
        conflicts=conflicts,
        waits=int(headers.get(REDELIVERY_HEADER, 0) or 0),
        republished=bool(retries) or CONFLICTS_HEADER in headers or REDELIVERY_HEADER in headers,
        line_token=token,
        line_ended=bool(token and headers.get(LINE_EXPIRED_HEADER)),
        line_waited=waited,
        payload=lambda _lock, fresh: _payload(task, fresh),
        rate_request=f"{task_id}.{retries}",
        max_hold=float(hard) if hard else None,
        duplicate=DuplicateMark.decode(headers.get(DUPLICATE_HEADER)),
    )


def _end_replaced(app: Celery, signature: Any) -> None:
    """A parked task replaced under its unique key left the line unrun: it ends ``REVOKED``, as
    a replaced copy does (never published again: no worker is handed it)."""
    task_id = str(signature.options.get("task_id") or signature.id)
    outcomes.log.info(
        "task %s[%s] revoked: replaced under its unique key while it waited in the task line",
        signature.task,
        task_id,
    )
    task = app.tasks.get(signature.task)
    if task is not None and task.ignore_result:
        return
    with contextlib.suppress(NotImplementedError):  # (no result backend: the log line remains)
        app.backend.mark_as_revoked(task_id, "replaced under its unique key")


def start(task: LockAware, task_id: str, args: Any, kwargs: Any) -> None:
    """``before_start``: takes what the task's options ask for, or raises what Celery is to do
    instead (``Ignore``, ``Retry``, ``Reject``, the error)."""
    settings = settings_for(task.app)
    if settings.disabled:
        return  # the kill switch: no lock, no claim (logged as the worker starts)
    request = task.request  # (read once: each read walks Celery's request stack)
    stamp = (request.headers or {}).get(WORKFLOW_HEADER)
    run: LockedRun
    if stamp is not None:
        run = _link_run(task, request, task_id, args, kwargs, stamp)
        _LINK.run = run
    else:
        run = LockedRun(
            _spec(task),
            _delivery(task, request, task_id, args, kwargs),
            settings,
            client_for(task.app, settings),
            _signals(task),
            _CELERY,
            handover=handover_for(task.app) if task.lock_options is not None else None,
        )
    setattr(request, _ATTR, run)
    outcome = run.take()
    if isinstance(outcome, Held | RunUnlocked):
        if run.lease is not None:
            with _HELD.guard:
                _HELD.runs.add(run)
        return
    try:
        _answer(task, run, outcome)
    except Ignore:
        answered_with_ignore(task_id)  # our line said it: Celery's "ignored" would repeat it
        raise


def workflow_declared(request: Any) -> bool:
    """Whether ``request`` is a link of a locked workflow (``lock_workflow``)."""
    return WORKFLOW_HEADER in (request.headers or {})


# A workflow's lock as parsed, by the JSON its messages carry and the link's task.
_WORKFLOW_OPTIONS: dict[tuple[str, str], WorkflowOptions] = {}
_WORKFLOW_OPTIONS_KEPT = 256


def _link_run(
    task: LockAware, request: Any, task_id: str, args: Any, kwargs: Any, stamp: Any
) -> WorkflowRun:
    """The run of one link of a locked workflow (the message's stamp: its lock and place)."""
    stamp = stamp if isinstance(stamp, dict) else {}
    declared, link = stamp.get("lock"), stamp.get("link")
    if not isinstance(link, int) or isinstance(link, bool) or link < 0:
        raise LockConfigError(f"task {task.name!r}: its message's workflow stamp is not ours")
    made = (task.name if link == 0 else "", str(declared))
    options = _WORKFLOW_OPTIONS.get(made)
    if options is None:
        # The name is made from the first link's arguments: only its signature is checked.
        signature = task.call_signature if link == 0 else None
        options = options_from_message(task.name, signature, declared)
        if len(_WORKFLOW_OPTIONS) >= _WORKFLOW_OPTIONS_KEPT:
            _WORKFLOW_OPTIONS.clear()
        _WORKFLOW_OPTIONS[made] = options
    settings = settings_for(task.app)
    spec = TaskSpec(task.name, options.lock, None, None, task.call_signature)
    return WorkflowRun(
        spec,
        _delivery(task, request, task_id, args, kwargs),
        settings,
        client_for(task.app, settings),
        _signals(task),
        _CELERY,
        link=link,
        passed=PassedLease.decode((request.headers or {}).get(WORKFLOW_LEASE_HEADER)),
        max_gap=options.max_gap,
        handover=handover_for(task.app),
    )


class _Link(threading.local):
    run: WorkflowRun | None = None


_LINK = _Link()


def current_link() -> WorkflowRun | None:
    """The link of a locked workflow this thread runs now, if any."""
    return _LINK.run


def _answer(task: LockAware, run: LockedRun, outcome: Outcome) -> None:
    """Raises Celery's answer to an outcome that does not run the task."""
    request, d = task.request, run.delivery
    if isinstance(outcome, Skip):
        # A ready state (FAILURE) with an error naming the lock: .get(), groups, chords and
        # chains see it at once (a custom state would leave them waiting for ever). Logged by
        # Celery at INFO: the task class lists TaskSkipped in ``throws``.
        raise outcome.error(run.who)
    if isinstance(outcome, Fail):
        raise outcome.error
    elif isinstance(outcome, RetryAfter) and outcome.own:
        # Past the task's own max_retries, Celery raises ``exc``: a LockNotAcquired naming the lock.
        raise task.retry(countdown=outcome.delay, exc=outcome.error)
    elif isinstance(outcome, RetryAfter) and outcome.cause != "rate":
        headers = {**(request.headers or {}), CONFLICTS_HEADER: outcome.conflicts + 1}
        task.signature_from_request(request, countdown=outcome.delay, headers=headers).apply_async()
        raise Retry(outcome.why, when=outcome.delay)
    elif isinstance(outcome, RetryAfter | AwaitFirst):
        # The same job (retries and conflict count unchanged), so its finish record applies.
        if isinstance(outcome, AwaitFirst):
            header: dict[str, Any] = {REDELIVERY_HEADER: outcome.waits + 1}
        else:
            header = {RATE_HEADER: d.rate_request}
        headers = {**(request.headers or {}), **header}
        try:
            task.signature_from_request(
                request, countdown=outcome.delay, headers=headers
            ).apply_async()
        except Exception as exc:
            # Not re-published: this message must not be acknowledged as done (nobody would run
            # the task). Back to the broker with it.
            raise Reject(exc, requeue=True) from exc
    # Ignore, not Retry: a RETRY state stored now could land after the first delivery's result.
    raise Ignore()


class _Held:
    """The runs holding a lease in this process now, released at process shutdown."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.runs: set[LockedRun] = set()
        self.guard = threading.Lock()


_HELD = _Held()
# The parent's leases are the parent's; a forked child holds none yet (nor the guard).
os.register_at_fork(after_in_child=_HELD.reset)


def current_run(task: LockAware, request: Any = None) -> LockedRun | None:
    """The run of the task's current delivery (``None`` before or outside one); ``request``:
    the task's current request, when the caller has it."""
    run = getattr(task.request if request is None else request, _ATTR, None)
    return run if isinstance(run, LockedRun) else None


def _release(run: LockedRun, finished: bool) -> None:
    with _HELD.guard:
        _HELD.runs.discard(run)
    run.release(finished)


def release_at_body_end(task: LockAware, request: Any = None) -> None:
    """As the body ends: gives the lease back at once, so that whoever waits on the result
    finds the lock free; except for a delivery with a finish record to make, given back after
    its result is stored, together with the record (:func:`end_run`). ``request``: the task's
    current request, when the caller has it."""
    run = current_run(task, request)
    if isinstance(run, WorkflowRun):
        request = task.request if request is None else request
        if not run.releases_at_body_end(bool(request.chain)):
            return  # the next link's publish hands the lease on
    if run is not None and run.delivery.finish_job is None:
        _release(run, False)


def release_for_retry(task: LockAware) -> None:
    """The task retries itself: the lease goes before the retry is published (the retried
    run must not find it held by this very run), a job unique until it finishes claiming its
    key as queued first, so that no copy slips in between."""
    run = current_run(task)
    if isinstance(run, WorkflowRun):
        return  # a link's retry goes on with the lease: its publish hands it on
    if run is not None and run.lease is not None:
        run.keep_claim_for_retry()
        _release(run, False)


def end_run(task: LockAware, task_id: str, args: Any, kwargs: Any, state: str | None) -> None:
    """``task_postrun`` (the result is stored): gives the lease back if still held, with the
    finish record if the job ended for good (not at a retry or a requeued rejection); a job
    that failed gives up its queued claim. Never raises."""
    request = task.request
    run = current_run(task, request)
    setattr(request, _ATTR, None)
    if isinstance(run, WorkflowRun):
        _LINK.run = None
        run.ended(went_on=state in ("SUCCESS", "RETRY"))
    if run is not None:
        _release(run, state in ("SUCCESS", "FAILURE", "IGNORED"))
    if state in ("FAILURE", "REJECTED"):
        # The job is over (it may have failed before it started): its queued claim goes.
        if run is not None:
            run.end_claim()
        else:
            end_claim(task, task_id, args, kwargs)


def release_all_held(**_: Any) -> None:
    """Releases every lease this process's tasks hold, and sends the unique claims'
    confirmations it has not sent yet (``worker_process_shutdown``: a pool child ends with
    ``os._exit``, which runs no exit handler)."""
    with _HELD.guard:
        runs = list(_HELD.runs)
        _HELD.runs.clear()
    for run in runs:
        run.release(False)
    keepers_release_all()
    confirmations.flush()


def end_claim(task: LockAware, task_id: str, args: Any, kwargs: Any) -> None:
    """Gives up the queued claim ``task_id`` may hold (revoked, or failed before it started);
    never raises."""
    if task.unique_options is None or not task.unique_options.queued:
        return
    settings = settings_for(task.app)
    client = client_for(task.app, settings)
    delivery = Delivery(task_id, args or (), kwargs or {})
    LockedRun(_spec(task), delivery, settings, client, _signals(task), _CELERY).end_claim()
