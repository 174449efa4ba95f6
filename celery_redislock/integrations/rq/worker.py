"""Parent-side release for RQ: a worker class that frees what a dead work horse held as soon as
RQ's own ``wait4`` on the horse returns, instead of leaving it to lapse within ``ttl``."""

from __future__ import annotations

import inspect
import logging
import time
from typing import Any

from ...core.childwatch import alive
from ...core.reach import check_at_start
from ...core.run.dead import release_dead
from ...core.sweeper import LineSweeper
from ...errors import LockConfigError
from ._compat import Job, SpawnWorker, Worker
from .debounce import debounce_publisher
from .job import locks_for_job
from .line import PutBack
from .logs import to_worker_log
from .settings import Settings, client_for, default_settings

__all__ = ["LockSpawnWorker", "LockWorker", "ReleasesDeadHorses"]

log = logging.getLogger(__name__)

# A horse SIGKILLed from outside (OOM, kill -9) is reaped by RQ's wait4; a horse the parent is
# killing during a cold shutdown may take a moment to die: never release before it has.
_DEATH_WAIT_S = 5.0


class ReleasesDeadHorses:
    """Mix into an RQ worker class with work horses (``Worker``, ``SpawnWorker``): when a horse
    ends without its ``finally`` having run (SIGKILL, OOM, the kill past the job timeout, a
    stop-job command, a cold shutdown), releases the leases it held for its job (matched by job
    id, host and pid), handing the lock on to its task line. The main process also sweeps the
    task lines every ``line_sweep_interval`` seconds (holders that died unseen, waits ended), and
    enqueues the debounced jobs that are due."""

    _redislock_horse = 0
    _redislock_status: int | None = None

    def work(self, *args: Any, **kwargs: Any) -> Any:
        to_worker_log()  # (``rq worker`` set its log up already; a Worker made in code has not)
        settings = default_settings()
        if settings.disabled:
            log.error(
                "celery_redislock is DISABLED (REDISLOCK_DISABLED): this worker's jobs run "
                "without their locks and unique claims"
            )
        if not settings.disabled and not _with_scheduler(args, kwargs):
            log.warning(
                "this worker runs no RQ scheduler: a locked job that comes back later (a "
                "conflict retry, a wait for its first copy, a rate slot ahead, a job parked in "
                "a task line) stays SCHEDULED unless another worker of its queues runs one; "
                "start it with `rq worker --with-scheduler` (in code: "
                "worker.work(with_scheduler=True)), or use `rq worker-pool`"
            )
        sweeper = None if settings.disabled else self._redislock_sweeper(settings)
        try:
            return super().work(*args, **kwargs)  # type: ignore[misc]
        finally:
            if sweeper is not None:
                sweeper.stop()

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        # RQ sets its log up here (for a worker made in code, only here), before its first job.
        super().bootstrap(*args, **kwargs)  # type: ignore[misc]
        to_worker_log()
        settings = default_settings()
        if settings.disabled:
            return
        try:
            client = client_for(settings, self.connection)  # type: ignore[attr-defined]
        except LockConfigError as exc:
            log.error("no lock Redis for this worker's jobs: %s", exc)
            return
        check_at_start(
            client, policy=settings.on_backend_error, setting="REDISLOCK_ON_BACKEND_ERROR"
        )

    def _redislock_sweeper(self, settings: Settings) -> LineSweeper | None:
        worker: Any = self  # (an RQ Worker, mixed in)
        try:
            client = client_for(settings, worker.connection)
        except LockConfigError as exc:
            log.error("task lines are not swept by this worker: %s", exc)
            return None
        window = settings.line_handover_window
        put_back = PutBack(worker.connection, worker.serializer, client, window)
        pending = debounce_publisher(worker.connection, worker.serializer)
        sweeper = LineSweeper(
            client, settings.namespace, put_back, settings.line_sweep_interval, window, pending
        )
        sweeper.start()
        return sweeper

    def fork_work_horse(self, job: Job, queue: Any, *args: Any, **kwargs: Any) -> None:
        # Read before the fork, so that each horse inherits them instead of reading them again;
        # and the job's locks made here, so that a forked horse makes its own from the lock
        # it inherits (core.run.make_lock): what a horse does first, it pays for in copied
        # pages (docs/benchmarks.md, "RQ").
        if not default_settings().disabled:
            _prepare(job)
        super().fork_work_horse(job, queue, *args, **kwargs)  # type: ignore[misc]
        self._redislock_horse = self.horse_pid  # type: ignore[attr-defined]

    def wait_for_horse(self, *args: Any, **kwargs: Any) -> Any:
        reaped = super().wait_for_horse(*args, **kwargs)  # type: ignore[misc]
        self._redislock_status = reaped[1]  # (pid, status, rusage); None: not reaped here
        return reaped

    def monitor_work_horse(self, job: Job, queue: Any, *args: Any, **kwargs: Any) -> None:
        self._redislock_status = None
        try:
            super().monitor_work_horse(job, queue, *args, **kwargs)  # type: ignore[misc]
        finally:
            pid = self._redislock_horse
            self._redislock_horse = 0
            # Status 0: the horse left through os._exit(0) after perform_job, whose finally
            # released what it held. Anything else (killed, unknown) is looked at.
            if pid and self._redislock_status != 0:
                release_dead_horse(job, pid)


def _with_scheduler(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``Worker.work(*args, **kwargs)`` runs RQ's scheduler (which brings back every
    job our ``Retry`` answers schedule: without it, they never come back)."""
    try:
        bound = inspect.signature(Worker.work).bind(None, *args, **kwargs)
    except TypeError:  # (RQ raises its own error for that call)
        return True
    return bool(bound.arguments.get("with_scheduler", False))


def _prepare(job: Job) -> None:
    """Makes the locks of ``job`` once in this process (see ``fork_work_horse``)."""
    try:
        locks_for_job(job)
    except Exception:  # (a bad call, Redis down: the horse says so as it runs the job)
        return


def release_dead_horse(job: Job, pid: int) -> list[str]:
    """Releases the leases the dead horse ``pid`` took for ``job`` (none if it released them
    itself, as every horse that ends normally does); returns the released tokens."""
    deadline = time.monotonic() + _DEATH_WAIT_S
    while alive(pid):
        if time.monotonic() > deadline:
            log.warning(
                "job %s: horse %d still alive; its leases lapse within their ttl", job.id, pid
            )
            return []
        time.sleep(0.01)
    return release_dead(
        lambda: locks_for_job(job), f"job {job.func_name}[{job.id}]", job.id, pid, "horse"
    )


class LockWorker(ReleasesDeadHorses, Worker):
    """RQ's forking ``Worker`` with parent-side release: ``rq worker -w
    celery_redislock.integrations.rq.LockWorker``."""


class LockSpawnWorker(ReleasesDeadHorses, SpawnWorker):
    """RQ's ``SpawnWorker`` with parent-side release (its horse is a plain ``Worker`` that this
    class never reaches: the release runs here, in the parent)."""
