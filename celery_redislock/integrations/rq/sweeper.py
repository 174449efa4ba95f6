"""The task lines' sweeper for RQ: a thread in a ``LockWorker``'s main process that hands a lock
on when its holder died unseen (a whole worker killed: no ``finally``, no parent left to
release), publishes hand-overs whose publisher died, and ends jobs past their ``max_wait``.

A thread, because the worker's main thread spends a job's whole run blocked in ``wait4`` on
its horse. It is started before the first horse is forked and holds nothing a horse needs: the
Redis clients reset their pools after a fork.
"""

from __future__ import annotations

import logging
import threading

from ...core.lease import RedisClient
from ...core.line import sweep_lines
from ...core.reach import where
from ...core.repeated import RepeatedFailure
from ...errors import LockBackendError
from .line import PutBack

__all__ = ["Sweeper"]

log = logging.getLogger(__name__)


class Sweeper:
    """Every ``interval`` seconds, sweeps the task lines of ``namespace`` on ``client``,
    putting jobs back with ``put_back``.

    >>> put_back = PutBack(rq_redis, None, client)                       # doctest: +SKIP
    >>> Sweeper(client, "redislock", put_back, 1.0).start()              # doctest: +SKIP
    """

    def __init__(
        self, client: RedisClient, namespace: str, put_back: PutBack, interval: float
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.put_back = put_back
        self.interval = interval
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
                    self.put_back,
                    handover_window=self.put_back.handover_window,
                )
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
