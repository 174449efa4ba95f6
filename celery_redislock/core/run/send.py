"""The producer's side of ``unique=``, once for every framework: a unique call claims its key
and is published, or is found to be a duplicate and is not. An adapter says how to publish,
how to cancel a replaced copy and what a duplicate hands back (Celery: an ``AsyncResult``; RQ:
the queued ``Job``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from ...errors import DuplicateTask, LockBackendError, LockConfigError
from ..claims import ClaimKind, publish_claimed, release_claim
from ..debounce import defer
from ..lease import RedisClient
from ..unique_options import UniqueOptions
from .delivery import DuplicateMark, SignalLike, TaskSpec

__all__ = ["Duplicate", "SendSettings", "Sender", "Sent", "give_up_discarded", "send_unique"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# Past a year it is no claim but a mistake (countdown=1e300): it must not reach Redis as a
# number it cannot take.
MAX_CLAIM_S = 365 * 86400.0


class SendSettings(Protocol):
    """The settings a send reads."""

    @property
    def namespace(self) -> str: ...
    @property
    def on_duplicate(self) -> str: ...
    @property
    def on_backend_error(self) -> str: ...
    @property
    def queue_allowance(self) -> float: ...
    @property
    def unique_publish_window(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Sender:
    """Who sends, in a framework's words."""

    word: str
    """``"task"`` (Celery) or ``"job"`` (RQ)."""
    verb: str
    """``"published"`` or ``"enqueued"``."""
    stage: str
    """The ``stage`` of the ``lock_conflict`` signals sent here: ``"publish"``, ``"enqueue"``."""
    conflict: SignalLike
    sender: Any


@dataclass(frozen=True, slots=True)
class Sent(Generic[T]):
    """Published: what the framework's publish returned."""

    result: T


@dataclass(frozen=True, slots=True)
class Duplicate:
    """Not published: the copy ``holder`` holds the key (``on_duplicate="existing"``)."""

    holder: str


def send_unique(
    spec: TaskSpec,
    unique: UniqueOptions,
    call_id: str,
    call: tuple[Sequence[Any], Mapping[str, Any]],
    *,
    delay: float,
    expires_in: float | None,
    republish: bool,
    in_canvas: bool,
    settings: SendSettings,
    client: RedisClient,
    by: Sender,
    publish: Callable[[], T],
    cancel: Callable[[str], None],
    stop: Callable[[str], None] | None = None,
    encode: Callable[[], str] | None = None,
    from_run: bool = False,
    publish_marked: Callable[[DuplicateMark], T] | None = None,
    name: str | None = None,
) -> Sent[T] | Duplicate:
    """Claims the key of a unique call and publishes it; or says which copy holds the key
    (``Duplicate``), or raises :class:`DuplicateTask` (``on_duplicate="raise"``, or
    ``in_canvas``: a step of a workflow, whose id is fixed in advance, or whose callbacks would
    be lost with it). A duplicate that is a workflow's step published by the framework itself
    from a run that just ended (``from_run``: a chain's next link, a callback), where an error
    would break that run's ending, is published with a :class:`DuplicateMark` instead
    (``publish_marked``): its run fails at once with :class:`DuplicateTask`, which the
    workflow sees. ``delay``: seconds until the call is due;
    ``expires_in``: seconds after which it is dropped unrun (its claim must not outlive it).
    ``cancel`` takes a replaced queued copy off its queue; ``stop`` stops a running copy
    (``on_duplicate="cancel"``); ``encode`` gives the call as a sweeper publishes it later
    (lifecycle ``debounce``: the call is kept, not published, and ``Duplicate`` names the
    pending call that carries it). ``name``: the call's unique key, when the caller has it
    already (worked out here otherwise).

    >>> send_unique(spec, spec.unique, "id", ((42,), {}), delay=0, expires_in=None,
    ...             republish=False, in_canvas=False, settings=settings, client=r,
    ...             by=by, publish=send, cancel=revoke)   # doctest: +SKIP
    Sent(result=<AsyncResult: id>)
    """
    if unique.debounced and republish:
        return Sent(publish())  # the retry of a debounced run: that run itself
    if unique.debounced:
        assert encode is not None, "a debounced call needs its payload"
        return _send_debounced(
            # (published by the framework from a run: folded as before, never an error there)
            spec,
            unique,
            call_id,
            call,
            in_canvas and not from_run,
            settings,
            client,
            by,
            publish,
            encode,
            name,
        )
    life = min(delay + (unique.allowance or settings.queue_allowance), MAX_CLAIM_S)
    if expires_in is not None:
        life = min(life, expires_in)
    if life <= 0:  # already expired: the worker drops it unrun, so it claims nothing
        return Sent(publish())
    name = name if name is not None else spec.name_of(unique.keying, *call)
    action = unique.on_duplicate or settings.on_duplicate
    kind = {"replace": ClaimKind.REPLACE, "cancel": ClaimKind.CANCEL}.get(action, ClaimKind.NEW)
    if republish:
        kind = ClaimKind.REPUBLISH
    what = f"{by.word} {spec.name}[{call_id}]"
    try:
        found, result = publish_claimed(
            client,
            settings.namespace,
            name,
            task_id=call_id,
            lifetime=life,
            kind=kind,
            running_counts=unique.running_counts,
            window=settings.unique_publish_window,
            publish=publish,
            what=what,
        )
    except LockBackendError as exc:
        if settings.on_backend_error != "run":
            raise
        # Published under this id: a claim the call may have written names this very call.
        log.error("%s %s WITHOUT unique key %r: %s", what, by.verb, name, exc)
        return Sent(publish())

    def signal(action: str) -> None:
        if by.conflict.receivers:
            by.conflict.send(
                sender=by.sender,
                task_id=call_id,
                lock=name,
                action=action,
                holders=[found.holder],
                stage=by.stage,
                retry_after=None,
            )

    if found.duplicate:
        state = "running" if found.running else "started" if found.started else "queued"
        raising = action == "raise" or in_canvas
        if raising and from_run and publish_marked is not None:
            log.info(
                "%s %s to fail at once (a step of a workflow): %s is %s under unique key %r",
                what,
                by.verb,
                found.holder,
                state,
                name,
            )
            signal("raise")
            return Sent(publish_marked(DuplicateMark(found.holder, name, state)))
        log.info(
            "%s not %s: %s is %s under unique key %r", what, by.verb, found.holder, state, name
        )
        signal("raise" if raising else "existing")
        if raising:
            canvas = " (a step of a workflow)" if in_canvas and action != "raise" else ""
            raise DuplicateTask(
                f"{by.word} {spec.name}: a copy ({found.holder}) is already {state} under "
                f"unique key {name!r}{canvas}",
                name=name,
                task_id=found.holder,
                expires_in=found.ms_left / 1000,
                state=state,
            )
        return Duplicate(found.holder)
    if found.replaced and found.running:
        log.info("%s cancels %s, running under unique key %r", what, found.holder, name)
        signal("cancel")
        if found.also:
            cancel(found.also)
        assert stop is not None, "on_duplicate='cancel' needs a way to stop a running copy"
        stop(found.holder)
    elif found.replaced and found.holder:
        log.info("%s replaces %s under unique key %r", what, found.holder, name)
        signal("replace")
        cancel(found.holder)
    assert result is not None
    return Sent(result)


def _send_debounced(
    spec: TaskSpec,
    unique: UniqueOptions,
    call_id: str,
    call: tuple[Sequence[Any], Mapping[str, Any]],
    in_canvas: bool,
    settings: SendSettings,
    client: RedisClient,
    by: Sender,
    publish: Callable[[], T],
    encode: Callable[[], str],
    name: str | None,
) -> Sent[T] | Duplicate:
    """A debounced call: kept as the key's pending call, or folded into it (latest wins)."""
    name = name if name is not None else spec.name_of(unique.keying, *call)
    what = f"{by.word} {spec.name}[{call_id}]"
    if in_canvas:  # its id is fixed in the workflow: folded into another, it never ends
        raise LockConfigError(
            f"{by.word} {spec.name}: a debounced call cannot be a step of a workflow (a member "
            "of a group, chord or chain, or a call with callbacks): it may be folded into "
            "another call, and its own id would never end",
            name=name,
        )
    assert unique.period is not None
    try:
        kept = defer(
            client,
            settings.namespace,
            name,
            call_id,
            encode(),
            quiet=unique.period,
            max_wait=unique.max_wait,
        )
    except LockBackendError as exc:
        if settings.on_backend_error != "run":
            raise
        log.error("%s %s at once, NOT debounced under key %r: %s", what, by.verb, name, exc)
        return Sent(publish())
    if by.conflict.receivers:
        by.conflict.send(
            sender=by.sender,
            task_id=call_id,
            lock=name,
            action="debounce",
            holders=[kept.id],
            stage=by.stage,
            retry_after=None,
        )
    if kept.made:
        log.info("%s debounced under unique key %r: pending", what, name)
    else:
        log.info(
            "%s not %s: folded into pending %s under unique key %r", what, by.verb, kept.id, name
        )
    return Duplicate(kept.id)


def give_up_discarded(
    client: RedisClient, namespace: str, name: str, call_id: str, what: str, why: str
) -> None:
    """The message of call ``call_id`` was discarded unrun by a worker that cannot run it (its
    task unknown there, its message unreadable): the claim it holds on the unique key ``name``
    goes, or every later call would be handed a dead id until the claim lapses. Only this
    call's own claim goes (a started once_per_period run keeps its period); never raises."""
    try:
        superseded = release_claim(client, namespace, name, call_id)
    except (LockBackendError, LockConfigError) as exc:
        log.warning(
            "%s %s: could not give up its unique key %r (it lapses with its claim): %s",
            what,
            why,
            name,
            exc,
        )
        return
    if superseded is None:
        log.info("%s %s: its unique key %r is given up", what, why, name)
