"""The task lines' sweeper, started by Celery's worker and RQ's ``LockWorker``: every
``interval`` seconds it hands a lock on when its holder died unseen (a whole worker killed),
publishes hand-overs whose publisher died, and ends tasks past their ``max_wait``; and it
publishes the debounced calls that are due (core/debounce.py). A thread:
an RQ worker's main thread blocks in ``wait4`` on its horse, a Celery worker's runs its event
loop; nothing in it is needed by a forked child (Redis clients reset their pools after a fork),
and no child is forked while it is inside a call (core/forkguard.py: sweep_lines and
sweep_pending hold the guard one lock, one debounced key, at a time)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..errors import LockBackendError
from .debounce import sweep_pending
from .handover import Handover
from .lease import RedisClient
from .line import sweep_lines
from .reach import where
from .repeated import RepeatedFailure

__all__ = ["LineSweeper"]

log = logging.getLogger(__name__)


class LineSweeper:
    """Sweeps the task lines of ``namespace`` on ``client`` every ``interval`` seconds,
    handing locks on through ``handover``.

    >>> sweeper = LineSweeper(client, "redislock", publish, 1.0, 10.0)   # doctest: +SKIP
    >>> sweeper.start(); ...; sweeper.stop()                            # doctest: +SKIP
    """

    def __init__(
        self,
        client: RedisClient,
        namespace: str,
        handover: Handover,
        interval: float,
        handover_window: float,
        pending: Callable[[str, str], None] | None = None,
    ) -> None:
        self.client = client
        self.pending = pending
        """Publishes a debounced call that is due (``(id, payload)``), if this worker's
        framework has debounced tasks."""
        self.namespace = namespace
        self.handover = handover
        self.interval = interval
        self.handover_window = handover_window
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="redislock-line-sweeper", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        # Each interval while Redis is down: logged once, then summed up.
        failures = RepeatedFailure(log, f"task line sweep on {where(self.client)}")
        while not self._stop.wait(self.interval):
            try:
                sweep_lines(
                    self.client,
                    self.namespace,
                    self.handover,
                    handover_window=self.handover_window,
                )
                if self.pending is not None:
                    sweep_pending(self.client, self.namespace, self.pending)
            except LockBackendError as exc:
                failures.failed(exc)
            except Exception:
                log.exception("task lines: sweep failed (tried again)")
            else:
                failures.worked()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
