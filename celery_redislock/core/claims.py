"""Enqueue-time uniqueness in Redis: the claim a queued copy holds on its key from publish
until it starts (or finishes), one script call per step, safe to run twice."""

from __future__ import annotations

from .keys import LockKeys
from .lease import RedisClient, backend_errors
from .protocol import ClaimArgs, ClaimKind, ClaimReply, ReleaseClaimArgs, ReleaseClaimReply
from .scripts import run

__all__ = ["Claim", "ClaimKind", "claim", "release_claim"]

Claim = ClaimReply
"""What :func:`claim` found (``unique_claim.lua``'s reply)."""


def _keys(namespace: str, name: str) -> tuple[list[str], LockKeys]:
    keys = LockKeys.of(namespace, name)
    return [keys.queued, keys.replaced], keys


def claim(
    client: RedisClient,
    namespace: str,
    name: str,
    *,
    task_id: str,
    lifetime: float,
    kind: ClaimKind,
    running_counts: bool,
) -> Claim:
    """Claims the key ``name`` for ``task_id`` as its message is published, for ``lifetime``
    seconds (one round trip). ``running_counts``: a running copy counts as a duplicate."""
    (queued, replaced), keys = _keys(namespace, name)
    args = ClaimArgs(
        task_id=task_id,
        lifetime_ms=max(1, int(lifetime * 1000)),
        kind=kind,
        running_counts=running_counts,
    )
    with backend_errors(name):
        reply = run(
            "unique_claim", client, [queued, keys.leases, keys.meta, replaced], args.encode()
        )
    return ClaimReply.decode(reply)


def release_claim(client: RedisClient, namespace: str, name: str, task_id: str) -> str | None:
    """Gives up ``task_id``'s claim on the key ``name``. Returns the id of the task that
    superseded it (``"-"`` if that one has gone already): another holds the key, or this one was
    replaced. ``None``: released, or nobody held it."""
    own, _ = _keys(namespace, name)
    with backend_errors(name):
        reply = run("unique_release", client, own, ReleaseClaimArgs(task_id=task_id).encode())
    return ReleaseClaimReply.decode(reply).superseded_by
