"""One adapter per framework: send a call of the table, send a copy of a run, read back its
outcome in the table's words (see scenarios.py), the worker log, and the lock from outside."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis
from celery.result import AsyncResult
from rq.job import Job
from rqworkers import RQWorker
from workers import Worker

from celery_redislock import Lock, TaskSkipped
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.integrations.rq import SKIPPED, UniqueQueue, outcome_of

TESTS = Path(__file__).parent.parent
QUEUE = "conformance"  # the shared workers' (the queue of a test's own workers is another)
FINAL = frozenset({"ran", "skipped", "failed", "canceled"})
TTL = 30.0  # the lease ttl of every call: a lapse is never mistaken for a release
# Every worker logs each line's level and logger: the outcome lines are compared in full.
LOG_FORMAT = "%(levelname)s %(name)s %(message)s"


class Adapter:
    """What both frameworks' adapters share: the markers the bodies and receivers write."""

    name: str
    workers: list[Any]
    lock_server: RedisServer | None = None  # a test's own lock Redis, which it starts and stops

    def __init__(self, marks: redis.Redis, lock_url: str) -> None:
        self.marks = marks
        self.lock_client = redis.Redis.from_url(lock_url)

    def lock(self, name: str, **options: Any) -> Lock:
        """The lock ``name`` (``conf:<key>``, the name a call of ``key`` takes)."""
        return Lock(self.lock_client, name, ttl=TTL, **options)

    def actions(self, run_id: str) -> list[str]:
        return [a.decode() for a in self.marks.lrange(f"actions:{run_id}", 0, -1)]

    def lease(self, run_id: str) -> list[str]:
        """The run's lock_acquired and lock_released signals, in order."""
        return [a.decode() for a in self.marks.lrange(f"lease:{run_id}", 0, -1)]

    def runs(self, key: str) -> int:
        return int(self.marks.llen(f"ran:{key}"))

    def started_at(self, key: str) -> list[float]:
        return [float(t) for t in self.marks.lrange(f"ran-at:{key}", 0, -1)]

    def pid(self, key: str) -> int:
        return int(self.marks.hget("pid", key) or 0)

    def stop(self, key: str) -> None:
        self.marks.set(f"stop:{key}", 1)

    def log(self) -> str:
        return "\n".join(w.log() for w in self.workers)

    def finish(self) -> None:
        for worker in self.workers:
            worker.finish()
        self.lock_client.close()

    # -- per framework ----------------------------------------------------------------------

    def send(
        self,
        job: str,
        key: str,
        seconds: float = 0.0,
        *,
        delay: float = 0.0,
        run_id: str = "",
        tenant: str = "",
    ) -> str:
        """Sends a call (with the id ``run_id``, if given; with the argument ``tenant``, if
        given); returns the run id the producer got (another, for a duplicate handed the copy's),
        or raises ``DuplicateTask``."""
        raise NotImplementedError

    def send_copy(self, job: str, key: str, run_id: str) -> None:
        """Sends another delivery of the run ``run_id`` (the same id)."""
        raise NotImplementedError

    def deliveries(self, run_id: str) -> int:
        """How many times a worker took the run ``run_id`` from its queue (its log's lines)."""
        raise NotImplementedError

    def state(self, run_id: str) -> tuple[str, str | None]:
        """The run's state in the table's words, and the class name of its error if it failed."""
        raise NotImplementedError

    def error_text(self, run_id: str) -> str:
        """The message of the run's error (without its class name), if it failed."""
        raise NotImplementedError

    def skip_record(self, run_id: str) -> dict[str, Any]:
        """What a skipped run records of the conflict: ``{"lock": ..., "holders": [...]}``."""
        raise NotImplementedError

    def forget(self, run_id: str) -> None:
        """Drops a run left waiting (so that no later worker picks it up)."""

    @contextmanager
    def producer_lock_down(self, url: str, policy: str) -> Iterator[None]:
        """Within it, this process (the producer) has its lock Redis at ``url`` under the
        backend policy ``policy``; the workers are left as they are."""
        raise NotImplementedError
        yield


class CeleryAdapter(Adapter):
    name = "celery"

    def __init__(
        self, url: str, log_dir: Path, env: dict[str, str] | None = None, queue: str = QUEUE
    ) -> None:
        from . import confcelery

        self.app = confcelery.app
        self.tasks = confcelery.TASKS
        self.queue = queue
        super().__init__(redis.Redis.from_url(url), (env or {}).get("CONF_LOCK_URL", url))
        env = {"CONF_LOG_FORMAT": LOG_FORMAT, "CONF_QUEUE": queue, **(env or {})}
        self.workers = [
            Worker(url, log_dir, name="conf", app="conformance.confcelery", env=env).start()
        ]

    def send(
        self,
        job: str,
        key: str,
        seconds: float = 0.0,
        *,
        delay: float = 0.0,
        run_id: str = "",
        tenant: str = "",
    ) -> str:
        result = self.tasks[job].apply_async(
            (key, seconds, *([tenant] if tenant else [])),
            countdown=delay or None,
            task_id=run_id or None,
            queue=self.queue,
        )
        return str(result.id)

    def send_copy(self, job: str, key: str, run_id: str) -> None:
        self.tasks[job].apply_async((key, 0.0), task_id=run_id, queue=self.queue)

    def deliveries(self, run_id: str) -> int:
        return self.log().count(f"[{run_id}] received")

    def state(self, run_id: str) -> tuple[str, str | None]:
        result = AsyncResult(run_id, app=self.app)
        state = result.state
        if state == "SUCCESS":
            return "ran", None
        if state == "FAILURE" and isinstance(result.result, TaskSkipped):
            return "skipped", None  # a ready state, so that .get() and workflows see it
        if state == "FAILURE":
            return "failed", type(result.result).__name__
        if state == "PENDING" and self.actions(run_id)[-1:] == ["queue"]:
            return "parked", None  # Celery stores no state for a task in a line (docs/line.md)
        named = {"RETRY": "retrying", "REVOKED": "canceled"}
        return named.get(state, "pending"), None

    def error_text(self, run_id: str) -> str:
        result = AsyncResult(run_id, app=self.app)
        return str(result.result) if result.state == "FAILURE" else ""

    def skip_record(self, run_id: str) -> dict[str, Any]:
        info = AsyncResult(run_id, app=self.app).info  # the TaskSkipped error
        if isinstance(info, TaskSkipped):
            return {"lock": info.name, "holders": info.holders}
        return {"info": repr(info)}

    def forget(self, run_id: str) -> None:
        self.app.control.revoke(run_id)

    @contextmanager
    def producer_lock_down(self, url: str, policy: str) -> Iterator[None]:
        conf = self.app.conf
        before = (conf.redislock_url, conf.redislock_on_backend_error)
        conf.redislock_url, conf.redislock_on_backend_error = url, policy
        try:
            yield
        finally:
            conf.redislock_url, conf.redislock_on_backend_error = before


class RQAdapter(Adapter):
    name = "rq"

    def __init__(
        self, url: str, log_dir: Path, env: dict[str, str] | None = None, queue: str = QUEUE
    ) -> None:
        from . import confrq

        os.environ["CONF_RQ_URL"] = url  # what a producer signals at enqueue is noted there
        self.jobs = confrq.JOBS_BY_NAME
        conn = redis.Redis.from_url(url)
        super().__init__(conn, (env or {}).get("REDISLOCK_URL", url))
        self.queue = UniqueQueue(queue, connection=conn)
        env = {"REDISLOCK_TTL": str(TTL), "REDISLOCK_LINE_SWEEP_INTERVAL": "0.2", **(env or {})}
        self.workers = []
        try:
            for n in range(2):  # a second: a copy of a run meets its first running
                worker = RQWorker(
                    url,
                    log_dir,
                    name=f"conf{n}",
                    worker_class="conformance.confrq.ConfWorker",
                    env=env,
                    args=("--log-format", LOG_FORMAT, queue),
                )
                self.workers.append(worker.start())
        except BaseException:
            self.finish()
            raise

    def send(
        self,
        job: str,
        key: str,
        seconds: float = 0.0,
        *,
        delay: float = 0.0,
        run_id: str = "",
        tenant: str = "",
    ) -> str:
        fn, job_id = self.jobs[job], run_id or None
        args = (key, seconds, *([tenant] if tenant else []))
        if delay:
            at = timedelta(seconds=delay)
            return str(self.queue.enqueue_in(at, fn, *args, job_id=job_id).id)
        return str(self.queue.enqueue(fn, *args, job_id=job_id).id)

    def send_copy(self, job: str, key: str, run_id: str) -> None:
        self.queue.enqueue_job(Job.fetch(run_id, connection=self.marks))

    def deliveries(self, run_id: str) -> int:
        return self.log().count(f") ({run_id})\n")

    def state(self, run_id: str) -> tuple[str, str | None]:
        job = Job.fetch(run_id, connection=self.marks)
        status = str(getattr(job.get_status(), "value", job.get_status()))
        if status == "finished":
            if job.return_value() != SKIPPED:
                return "ran", None
            outcome = outcome_of(job) or {}
            # A copy of a run that finished is dropped: the run it copies stands (Celery keeps
            # the first run's result; RQ stores the copy's SKIPPED over it).
            return ("ran" if outcome.get("outcome") == "finished" else "skipped"), None
        if status == "failed":
            result = job.latest_result()
            text = (result.exc_string if result else None) or ""
            last = [line for line in text.strip().splitlines() if line.strip()][-1:] or [""]
            return "failed", last[0].split(":", 1)[0].rsplit(".", 1)[-1].strip() or None
        if status == "scheduled":
            queued = (outcome_of(job) or {}).get("outcome") == "queued"
            return ("parked" if queued else "retrying"), None
        if status in ("canceled", "stopped"):
            return "canceled", None
        return "pending", None

    def error_text(self, run_id: str) -> str:
        result = Job.fetch(run_id, connection=self.marks).latest_result()
        text = (result.exc_string if result else None) or ""
        last = [line for line in text.strip().splitlines() if line.strip()][-1:] or [""]
        return last[0].split(": ", 1)[-1]

    def skip_record(self, run_id: str) -> dict[str, Any]:
        outcome = dict(outcome_of(Job.fetch(run_id, connection=self.marks)) or {})
        outcome.pop("outcome", None)  # "skipped": the state says it
        return outcome

    def forget(self, run_id: str) -> None:
        job = Job.fetch(run_id, connection=self.marks)
        job.delete()

    @contextmanager
    def producer_lock_down(self, url: str, policy: str) -> Iterator[None]:
        names = {"REDISLOCK_URL": url, "REDISLOCK_ON_BACKEND_ERROR": policy}
        before = {name: os.environ.get(name) for name in names}
        os.environ.update(names)
        try:
            yield
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
