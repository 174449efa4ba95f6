"""One log line per failure that repeats, not one per attempt: something retried every half
second (a lease's renewal while Redis is down, a sweep each second) logged every attempt, 20
lines in 10 s for one lease. A :class:`RepeatedFailure` logs the first failure, then at most
one summary every ``SUMMARY_EVERY_S`` while it goes on, then one line when it works again."""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["SUMMARY_EVERY_S", "RepeatedFailure"]

SUMMARY_EVERY_S = 10.0
"""Seconds between two summaries of a failure that goes on."""


class RepeatedFailure:
    """The log of one thing that keeps failing (``what``: ``"lease renewal on redis://..."``),
    at WARNING: its first failure, a summary at most every ``SUMMARY_EVERY_S`` (how long, how
    many attempts, the last error), and one line when it works again. Thread-safe.

    >>> renewal = RepeatedFailure(logging.getLogger("demo"), "lease renewal")
    >>> renewal.failed(ConnectionError("refused"))   # logged; the next ones summed up
    >>> renewal.worked()                             # logged: it works again
    """

    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log = log
        self.what = what
        self._since: float | None = None  # when the failures began; None: not failing
        self._said = 0.0  # when the last line was logged
        self._attempts = 0
        self._guard = threading.Lock()

    def failed(self, error: BaseException | str) -> None:
        """One more attempt failed with ``error``."""
        now = time.monotonic()
        with self._guard:
            self._attempts += 1
            if self._since is None:
                self._since = self._said = now
                self.log.warning("%s failed, retrying: %s", self.what, error)
                return
            if now - self._said < SUMMARY_EVERY_S:
                return
            self._said = now
            since, attempts = self._since, self._attempts
        self.log.warning(
            "%s still failing for %.0fs (%d attempts): %s", self.what, now - since, attempts, error
        )

    def worked(self) -> None:
        """An attempt succeeded: logs that it works again if it was failing (cheap if not)."""
        if self._since is None:
            return
        now = time.monotonic()
        with self._guard:
            since, attempts = self._since, self._attempts
            if since is None:
                return
            self._since, self._attempts = None, 0
        self.log.warning(
            "%s works again after %.0fs (%d failed attempts)", self.what, now - since, attempts
        )

    def forget(self) -> None:
        """Nothing is tried any more (what failed was reported otherwise, e.g. a lease as
        lost): the next failure is logged as a first one."""
        with self._guard:
            self._since, self._attempts = None, 0
