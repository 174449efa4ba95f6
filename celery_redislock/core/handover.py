"""What the lock itself needs of the task line (core/line.py): the tokens of parked entries,
and publishing the parked tasks a script handed the lock to (the lock's ``handover``)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import redis

from .protocol import Grant
from .scripts import run
from .store import LockView, RedisClient

__all__ = [
    "DEFAULT_HANDOVER_WINDOW",
    "PUBLISH_WINDOW_S",
    "Handed",
    "Handover",
    "hand_over",
    "is_line_token",
    "lapse_args",
    "lapse_failed",
    "line_token",
]

log = logging.getLogger(__name__)

LINE_PREFIX = "L"
# A lease handed to a parked task lasts this long until its publish is confirmed; past it, the
# entry goes back in line (its publisher died) and another caller publishes it.
PUBLISH_WINDOW_S = 10.0
DEFAULT_HANDOVER_WINDOW = 60.0
"""Seconds a lease handed to a parked task waits, once published, for the task to be delivered
and claim it; past it the lock goes to the next in line (the late task parks again)."""


def line_token() -> str:
    """A new parked entry's token (the lease it is handed has the same token)."""
    return LINE_PREFIX + os.urandom(16).hex()


def is_line_token(token: str) -> bool:
    return token.startswith(LINE_PREFIX)


class Handed(NamedTuple):
    """A parked task to publish again: handed the lock, or past its wait deadline."""

    token: str
    payload: str
    expired: bool
    """Its wait deadline passed: published so that it ends with that outcome, not run."""
    replaced: bool = False
    """Replaced under its unique key while it waited (it left the line then, with ``expired``
    set too): not published, but ended as canceled (Celery: ``REVOKED``; RQ: ``canceled``)."""


Handover = Callable[[Handed], None]
"""Publishes one parked task again (raises if it could not)."""


class Handing(LockView, Protocol):
    """What a hand-over reads of the lock it hands on (a :class:`~.lock.Lock` is one)."""

    client: RedisClient
    handover: Handover | None
    handover_window: float


def hand_over(lock: Handing, granted: Sequence[Grant], expired: Sequence[str] = ()) -> None:
    """Publishes the parked tasks a script handed the lock to (``granted``, from its reply) or
    that expired, then confirms them. Never raises: what is not confirmed goes back in line when
    its short lease lapses. A lock with no ``handover`` (an operator's command knows no
    framework) cannot publish: the leases it handed over lapse at once (``line_lapse.lua``), for
    the next call on the lock or a sweeper to hand over and publish, instead of the lock idling
    for the publish window. Expired entries (and replaced ones, ``Handed.replaced``: the
    ``handover`` ends them unrun) wait for a sweeper."""
    if lock.handover is None:
        _lapse(lock, granted)
        return
    every = [*(g.token for g in granted), *expired]
    if not every:
        return
    try:
        raw = lock.client.hmget(lock.keys.meta, [f"p:{t}" for t in every])
    except redis.RedisError as exc:
        log.warning("lock %r: could not read the parked tasks to hand over: %s", lock.name, exc)
        return
    done = set(expired)
    sent = []
    for tok, record in zip(every, raw, strict=True):
        if record is None:
            continue  # confirmed already (a sweep beat us to it), or claimed
        parked = json.loads(record)
        handed = Handed(
            token=tok, payload=parked["x"], expired=tok in done, replaced=bool(parked.get("r"))
        )
        try:
            lock.handover(handed)
        except Exception as exc:
            log.warning(
                "lock %r: could not publish parked task %s again (retried once its hand-over "
                "lapses): %s",
                lock.name,
                tok,
                exc,
            )
            continue
        sent.append(tok)
    if not sent:
        return
    window = str(max(1, round(lock.handover_window * 1000)))
    try:
        run("line_sent", lock.client, lock.encoded_keys, [window, *sent])
    except redis.RedisError as exc:
        # Published, not confirmed: the entries come back after the publish window and are
        # published again; the second delivery finds the first's claim or its finish record.
        log.warning("lock %r: could not confirm hand-overs %s: %s", lock.name, sent, exc)


def lapse_args(granted: Sequence[Grant]) -> list[str]:
    """``line_lapse.lua``'s args: the hand-overs ``granted`` that no one here can publish."""
    return [str(v) for g in granted for v in (g.token, g.fence)]


def lapse_failed(lock: LockView, granted: Sequence[Grant], exc: BaseException) -> None:
    """Logs that ``line_lapse.lua`` failed for ``granted`` (they lapse by themselves)."""
    log.warning(
        "lock %r: could not pass on hand-overs %s (they lapse within %gs): %s",
        lock.name,
        [g.token for g in granted],
        PUBLISH_WINDOW_S,
        exc,
    )


def _lapse(lock: Handing, granted: Sequence[Grant]) -> None:
    if not granted:
        return
    try:
        run("line_lapse", lock.client, lock.encoded_keys, lapse_args(granted))
    except redis.RedisError as exc:
        lapse_failed(lock, granted, exc)
