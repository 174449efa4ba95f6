"""A small signal for integrations without a signal system of their own (RQ): receivers are
called as Celery's signal receivers are, ``receiver(sender=..., **arguments)``, and an error in
one is logged, never raised into the job that sent it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Signal"]

log = logging.getLogger(__name__)
Receiver = Callable[..., Any]
R = TypeVar("R", bound=Receiver)


class Signal:
    """Named hook with ``connect``/``disconnect``/``send``.

    >>> started = Signal("started")
    >>> @started.connect
    ... def note(sender, **kw):
    ...     return kw["job_id"]
    >>> started.send(sender="worker", job_id="42")
    [('42', None)]
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._receivers: tuple[Receiver, ...] = ()
        self._guard = threading.Lock()

    def __repr__(self) -> str:
        return f"<Signal {self.name}>"

    @property
    def receivers(self) -> tuple[Receiver, ...]:
        """The connected receivers (empty: sending costs nothing; check before building
        arguments)."""
        return self._receivers

    def connect(self, receiver: R) -> R:
        """Connects ``receiver`` (once; usable as a decorator); returns it."""
        with self._guard:
            if receiver not in self._receivers:
                self._receivers = (*self._receivers, receiver)
        return receiver

    def disconnect(self, receiver: Receiver) -> bool:
        """Disconnects ``receiver``; ``False`` if it was not connected."""
        with self._guard:
            kept = tuple(r for r in self._receivers if r != receiver)
            found = len(kept) != len(self._receivers)
            self._receivers = kept
        return found

    def send(self, sender: object, **arguments: Any) -> list[tuple[Any, BaseException | None]]:
        """Calls every receiver with ``sender`` and ``arguments``; returns each one's result
        and error (a receiver that raised is logged at ERROR and skipped)."""
        results: list[tuple[Any, BaseException | None]] = []
        for receiver in self._receivers:
            try:
                results.append((receiver(sender=sender, **arguments), None))
            except Exception as exc:
                log.exception("signal %s: receiver %r raised", self.name, receiver)
                results.append((None, exc))
        return results
