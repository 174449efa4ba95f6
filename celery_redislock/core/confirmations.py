"""Confirmations of published unique claims, sent off the caller's path.

A claim lasts the short publish window until its message is known to be published; then a
confirmation extends it to its lifetime (see :func:`.claims.publish_claimed`). The caller does
not wait for that round trip: the confirmation is handed to this process's confirmations, which
send it from a thread within two ``LINGER`` (a few milliseconds), or sooner, ahead of this
process's next claim on the same client and in its round trip (one pipeline). A publisher that
calls ``.delay()`` in a loop so pays one round trip per call; one that calls it twice with the
same key sees its first claim confirmed when its second is decided.

A confirmation is safe to send twice and never claims (the copy may have started and given the
claim up already). One that fails is logged, as a synchronous one was: the claim lapses with the
window. What is still unsent when the interpreter exits is sent then; a process killed in the
few milliseconds between a publish and its confirmation leaves the claim to lapse with the
window, as a confirmation lost on the way would.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import NoScriptError

from .forkguard import FORK_GUARD
from .scripts import run, script

__all__ = ["IDLE", "LINGER", "Confirmation", "confirmations"]

log = logging.getLogger(__name__)

LINGER = 0.005
"""Seconds a confirmation waits for this process's next claim (whose round trip it then shares)
before the thread sends it alone."""

IDLE = 1.0
"""Seconds the thread waits with nothing to send before it ends."""

_SCRIPT = "unique_claim"


@dataclass(frozen=True, slots=True)
class Confirmation:
    """A published call's claim to extend: ``unique_claim.lua``'s keys and args (kind confirm)."""

    client: Any
    keys: Sequence[str]
    args: Sequence[str]
    name: str  # the unique key, for the log
    what: str  # the call, for the log
    window: float
    lifetime: float

    def failed(self, exc: BaseException) -> None:
        log.warning(
            "%s published; its unique key %r lapses %.0fs after the publish instead of %.0fs "
            "(the claim could not be extended): a duplicate call after that is published too, "
            "and only the newer copy runs: %s",
            self.what,
            self.name,
            self.window,
            self.lifetime,
            exc,
        )


class Confirmations:
    """This process's unsent confirmations, and the thread that sends them."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        # (Also in a forked child: the parent's confirmations are the parent's to send.)
        self.pending: list[Confirmation] = []
        self.cond = threading.Condition()
        self.sending = threading.Lock()  # held while a batch is taken and sent: order kept
        self.running = False
        self.oldest_at = 0.0  # (time.monotonic()) when the oldest unsent one came

    def add(self, confirmation: Confirmation) -> None:
        """Sends ``confirmation`` soon (see the module)."""
        with self.cond:
            if not self.pending:
                self.oldest_at = time.monotonic()
            self.pending.append(confirmation)
            if not self.running:  # (no wake-up for a running thread: it looks every LINGER)
                self.running = True
                threading.Thread(
                    target=self._run_thread, name="redislock-confirm", daemon=True
                ).start()

    def claim(self, client: Any, keys: Sequence[str], args: Sequence[str]) -> Any:
        """Runs the claim ``keys``/``args`` on ``client``, with this process's unsent
        confirmations for that client ahead of it in the same round trip; its reply. Redis's
        errors are raised as redis-py raised them (an unsent confirmation goes back to the
        thread)."""
        with self.sending:
            due = self._take(client)
            if not due:
                return run(_SCRIPT, client, keys, args)
            try:
                replies = _pipelined(client, [*((c.keys, c.args) for c in due), (keys, args)])
            except redis.RedisError:
                self._give_back(due)
                raise
            for confirmation, reply in zip(due, replies, strict=False):
                if isinstance(reply, Exception):
                    confirmation.failed(reply)
            reply = replies[-1]
            if isinstance(reply, Exception):
                raise reply
            return reply

    def flush(self) -> None:
        """Sends every unsent confirmation now (at exit)."""
        with self.sending:
            self._send(self._take(None))

    def _take(self, client: Any) -> list[Confirmation]:
        with self.cond:
            if client is None:
                due, self.pending = self.pending, []
            else:
                due = [c for c in self.pending if c.client is client]
                if due:
                    self.pending = [c for c in self.pending if c.client is not client]
            return due

    def _give_back(self, due: list[Confirmation]) -> None:
        for confirmation in due:
            self.add(confirmation)

    def _run_thread(self) -> None:
        try:
            self._run()
        except Exception:
            log.exception("unique claims: the confirmation thread failed")
            with self.cond:
                self.running = False

    def _run(self) -> None:
        # It looks every LINGER rather than being woken by each confirmation (a publisher's loop
        # would pay a thread switch per call), and ends after IDLE seconds with nothing to send.
        quiet_since = time.monotonic()
        while True:
            with self.cond:
                self.cond.wait(LINGER)
                now = time.monotonic()
                due = bool(self.pending) and now - self.oldest_at >= LINGER
                if self.pending:
                    quiet_since = now
                elif now - quiet_since >= IDLE:
                    self.running = False
                    return
            if due:
                with FORK_GUARD.held(), self.sending:  # (no fork copies a pool lock taken here)
                    self._send(self._take(None))

    def _send(self, due: list[Confirmation]) -> None:
        by_client: dict[int, list[Confirmation]] = {}
        for confirmation in due:
            by_client.setdefault(id(confirmation.client), []).append(confirmation)
        for group in by_client.values():
            try:
                replies: list[Any] = _pipelined(group[0].client, [(c.keys, c.args) for c in group])
            except redis.RedisError as exc:
                replies = [exc] * len(group)
            for confirmation, reply in zip(group, replies, strict=True):
                if isinstance(reply, Exception):
                    confirmation.failed(reply)


def _pipelined(client: Any, calls: list[tuple[Sequence[str], Sequence[str]]]) -> list[Any]:
    """``unique_claim.lua`` run for each of ``calls`` in one round trip; the replies, an error
    as an exception in its place. A script the server lacks is loaded, and the calls it refused
    sent again."""
    registered = script(_SCRIPT)
    pipe = client.pipeline(transaction=False)
    for keys, args in calls:
        pipe.execute_command("EVALSHA", registered.sha, len(keys), *keys, *args)
    replies: list[Any] = pipe.execute(raise_on_error=False)
    for at, reply in enumerate(replies):
        if isinstance(reply, NoScriptError):
            keys, args = calls[at]
            try:
                replies[at] = run(_SCRIPT, client, keys, args)
            except redis.RedisError as exc:
                replies[at] = exc
    return replies


confirmations = Confirmations()
os.register_at_fork(after_in_child=confirmations.reset)
atexit.register(confirmations.flush)
