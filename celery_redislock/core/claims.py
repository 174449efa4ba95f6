"""Enqueue-time uniqueness in Redis: the claim a queued copy holds on its key from publish
until it starts (or finishes), one script call per step, safe to run twice; and the publish of
a claimed call (:func:`publish_claimed`), which Celery and RQ share."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from ..errors import LockBackendError
from .confirmations import Confirmation, confirmations
from .keys import LockKeys
from .protocol import (
    ClaimArgs,
    ClaimKind,
    ClaimReply,
    ReleaseClaimArgs,
    ReleaseClaimReply,
    ReleaseMode,
    text,
)
from .scripts import run
from .store import RedisClient, backend_errors

__all__ = [
    "DEFAULT_PUBLISH_WINDOW",
    "ClaimKind",
    "ReleaseMode",
    "claim",
    "claim_call",
    "claim_holder_action",
    "publish_claimed",
    "release_claim",
    "release_claim_call",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_PUBLISH_WINDOW = 30.0
"""Seconds a claim lasts until its message is known to be published: a claim whose publish
never happened (a lost reply, then a lost give-up) frees the key after this, not after the
claim's whole lifetime."""


def claim(
    client: RedisClient,
    namespace: str,
    name: str,
    *,
    task_id: str,
    lifetime: float,
    kind: ClaimKind,
    running_counts: bool,
    parked_as: str = "",
) -> ClaimReply:
    """Claims the key ``name`` for ``task_id`` as its message is published, for ``lifetime``
    seconds (one round trip). ``running_counts``: a running copy counts as a duplicate.
    ``parked_as``: the task line token of a copy that has just parked in the line of the lock
    named like the key (kind ``REPUBLISH``): replaced already, it leaves the line now; else a
    later replace takes it out of the line."""
    keys, args = claim_call(namespace, name, task_id, lifetime, kind, running_counts, parked_as)
    with backend_errors(name):
        return ClaimReply.decode(run("unique_claim", client, keys, args))


def claim_call(
    namespace: str,
    name: str,
    task_id: str,
    lifetime: float,
    kind: ClaimKind,
    running_counts: bool,
    parked_as: str = "",
) -> tuple[list[str], list[str]]:
    """``unique_claim.lua``'s keys and args (see :func:`claim`)."""
    keys = LockKeys.of(namespace, name)
    args = ClaimArgs(
        task_id=task_id,
        lifetime_ms=max(1, int(lifetime * 1000)),
        kind=kind,
        running_counts=running_counts,
        parked_as=parked_as,
    )
    if kind is ClaimKind.CONFIRM:  # (it reads the claim alone: no run lock keys to pack)
        return [keys.queued, keys.replaced], args.encode()
    if kind is ClaimKind.NEW:  # (it reads the running copy's lease alone, never the line)
        return [keys.queued, keys.replaced, keys.leases, keys.meta], args.encode()
    return [keys.queued, keys.replaced, *keys.all], args.encode()


def release_claim(
    client: RedisClient,
    namespace: str,
    name: str,
    task_id: str,
    *,
    mode: ReleaseMode = ReleaseMode.GIVE_UP,
    keep: float = 0.0,
) -> str | None:
    """Gives up ``task_id``'s claim on the key ``name`` (a once_per_period run that started
    keeps it for its period; ``mode=FORCE`` frees it even then), or with ``mode=START`` keeps
    it ``keep`` seconds from now as a once_per_period run starts. Returns the id of the task
    that superseded it (``"-"`` if that one has gone already): another holds the key, or this
    one was replaced. ``None``: released (kept, for START), or nobody held it."""
    keys, args = release_claim_call(namespace, name, task_id, mode, keep)
    with backend_errors(name):
        reply = run("unique_release", client, keys, args)
    return ReleaseClaimReply.decode(reply).superseded_by


def release_claim_call(
    namespace: str, name: str, task_id: str, mode: ReleaseMode, keep: float
) -> tuple[list[str], list[str]]:
    """``unique_release.lua``'s keys and args (see :func:`release_claim`)."""
    keys = LockKeys.of(namespace, name)
    args = ReleaseClaimArgs(task_id, mode, max(1, int(keep * 1000))).encode()
    return [keys.queued, keys.replaced], args


def publish_claimed(
    client: RedisClient,
    namespace: str,
    name: str,
    *,
    task_id: str,
    lifetime: float,
    kind: ClaimKind,
    running_counts: bool,
    window: float,
    publish: Callable[[], T],
    what: str,
) -> tuple[ClaimReply, T | None]:
    """Claims the key ``name`` for ``task_id``, publishes the call with ``publish()`` unless
    it is a duplicate, then confirms the claim for its whole ``lifetime``. Until then the claim
    lasts at most ``window`` seconds (if its reply and its give-up are both lost, the key must
    not name an unpublished message for long). Returns the claim's answer and what ``publish``
    returned (``None`` for a duplicate). The confirmation is sent off the caller's path (see
    :mod:`.confirmations`). A backend error of the claim is raised after the claim
    it may have written was given up; ``what`` names the call in log lines."""
    pending = min(lifetime, window)
    keys, args = claim_call(namespace, name, task_id, pending, kind, running_counts)
    try:
        with backend_errors(name):
            # (this process's unsent confirmations go in the same round trip, ahead of it)
            found = ClaimReply.decode(confirmations.claim(client, keys, args))
    except LockBackendError:
        # The claim may have been written before its reply was lost: give it up, or later
        # calls would be handed a task that was never published (the window bounds it if the
        # give-up fails too, as it will when Redis is down: the claim's error is the news).
        _give_up(client, namespace, name, task_id, what, "its claim failed", logging.DEBUG)
        raise
    if found.duplicate:
        return found, None
    try:
        result = publish()
    except BaseException:
        # Not published: the key must not stay claimed by a message that does not exist.
        _give_up(client, namespace, name, task_id, what, "a failed publish", logging.WARNING)
        raise
    if lifetime > pending:
        # Off the caller's path (see confirmations.py): sent within a few ms, or with this
        # process's next claim.
        keys, args = claim_call(
            namespace, name, task_id, lifetime, ClaimKind.CONFIRM, running_counts
        )
        confirmations.add(Confirmation(client, keys, args, name, what, pending, lifetime))
    return found, result


def _give_up(
    client: RedisClient, namespace: str, name: str, task_id: str, what: str, after: str, level: int
) -> None:
    try:
        release_claim(client, namespace, name, task_id)
    except LockBackendError as exc:
        log.log(
            level,
            "unique key %r: could not give up the claim of %s after %s (it lapses within the "
            "publish window): %s",
            name,
            what,
            after,
            exc,
        )


def claim_holder_action(
    client: RedisClient,
    namespace: str,
    name: str,
    task_id: str,
    action: str,
    *,
    running_counts: bool,
) -> str:
    """What a unique copy refused the run lease of its own key does: ``action``, or
    ``"retry"`` for the copy whose message holds the key's queued claim.

    When a running copy counts as a duplicate (``until_finished``), a live run lease and a
    queued claim cannot both be legitimate: the lease is a superseded copy's (it takes the lease
    before it learns that it was superseded, then steps aside) or a run whose claim Redis lost.
    The copy holding the claim is the one meant to run, so a skip or a raise would lose the
    call: it comes back instead. When Redis cannot say, it comes back too.
    """
    if not running_counts or action not in ("skip", "raise"):
        return action
    try:
        with backend_errors(name):
            holder = client.get(LockKeys.of(namespace, name).queued)
    except LockBackendError:
        return "retry"
    return "retry" if holder is not None and text(holder) == task_id else action
