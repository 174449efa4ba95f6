"""What a worker's log says, under Celery and RQ alike: a run that does not run (skipped,
retried) logs the same line in both (one logger, one level, the same words), and a worker
names its lock Redis once as it starts, saying what tasks do while that Redis does not answer.

Real workers, their logs read as an operator would: each is started with a log format that
shows every line's level and logger.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable
from types import ModuleType

import pytest
import redis
import rqjobs
from helpers import is_skipped, wait_for
from rq import Queue
from rqworkers import RQWorker
from workers import Worker

from celery_redislock import SKIPPED, Lock, lock_for
from celery_redislock.contrib.redis_server import RedisServer

pytestmark = [pytest.mark.celery, pytest.mark.rq]

FORMAT = "%(levelname)s %(name)s %(message)s"
CELERY_ENV = {"LOCKAPP_LOG_FORMAT": FORMAT}
RQ_ARGS = ("--log-format", FORMAT)
HOLDER = {"task_id": "the-test"}


def lines(log: str, pattern: str) -> list[re.Match[str]]:
    """The log's lines that match ``pattern`` in full."""
    return [m for line in log.splitlines() if (m := re.fullmatch(pattern, line.strip()))]


def as_said(match: re.Match[str]) -> str:
    """A line with the run's name, id and lock taken out: what is left must be equal."""
    text = match.group(0)
    for name in ("name", "id", "lock"):
        text = text.replace(match.group(name), f"<{name}>", 1)
    return re.sub(r"\d+\.\d+s", "<n>s", text)


OUTCOME = r"(?P<level>[A-Z]+) (?P<logger>\S+) task (?P<name>\S+)\[(?P<id>[^\]]+)\] "
SKIPPED_LINE = OUTCOME + r"skipped: lock '(?P<lock>[^']+)' is held by the-test"
RETRY_LINE = OUTCOME + r"retries in \d+\.\ds: lock '(?P<lock>[^']+)' is held by the-test"


@pytest.mark.slow  # about 6 s on 2 quiet cores
def test_a_skip_and_a_conflict_retry_log_the_same_line_under_celery_and_rq(
    lockapp: ModuleType,
    workers: Callable[..., Worker],
    celery_server: RedisServer,
    rq_conn: redis.Redis,
    rq_server: RedisServer,
    rq_workers: Callable[..., RQWorker],
) -> None:
    celery = workers(env=CELERY_ENV)
    rq = rq_workers(name="w0", args=RQ_ARGS)
    queue = Queue("default", connection=rq_conn)
    celery_lock = Lock(redis.Redis.from_url(celery_server.url), "hold:lg", ttl=30)
    rq_skip_lock = Lock(redis.Redis.from_url(rq_server.url), "s:lg", ttl=30)
    rq_retry_lock = Lock(redis.Redis.from_url(rq_server.url), "r:lg", ttl=30)

    # Skipped: the lock is held by the test.
    with (
        celery_lock.acquire(owner="test", info=HOLDER),
        rq_skip_lock.acquire(owner="test", info=HOLDER),
    ):
        task = lockapp.hold.delay("lg")
        job = queue.enqueue(rqjobs.exclusive_skip, "lg")
        wait_for(lambda: is_skipped(task), "the Celery task skipped", 30)
        wait_for(lambda: job.get_status(refresh=True) == "finished", "the RQ job ended", 30)
    assert job.return_value() == SKIPPED
    wait_for(lambda: lines(celery.log(), SKIPPED_LINE), "Celery logs the skip", 10)
    wait_for(lambda: lines(rq.log(), SKIPPED_LINE), "RQ logs the skip", 10)
    (in_celery,) = lines(celery.log(), SKIPPED_LINE)
    (in_rq,) = lines(rq.log(), SKIPPED_LINE)
    assert (in_celery["name"], in_celery["id"], in_celery["lock"]) == (
        "lockapp.hold",
        task.id,
        "hold:lg",
    )
    assert (in_rq["name"], in_rq["id"], in_rq["lock"]) == ("rqjobs.exclusive_skip", job.id, "s:lg")
    assert in_celery["level"] == in_rq["level"] == "INFO"
    assert in_celery["logger"] == in_rq["logger"] == "celery_redislock.core.outcomes"
    assert as_said(in_celery) == as_said(in_rq)

    # Retried on the conflict: the same line again, each with its own delay.
    with (
        celery_lock.acquire(owner="test", info=HOLDER),
        rq_retry_lock.acquire(owner="test", info=HOLDER),
    ):
        task = lockapp.duplicate.delay("lg")
        job = queue.enqueue(rqjobs.exclusive_retry, "lg")
        wait_for(lambda: lines(celery.log(), RETRY_LINE), "Celery logs the retry", 30)
        wait_for(lambda: lines(rq.log(), RETRY_LINE), "RQ logs the retry", 30)
    assert task.get(timeout=30) == "ran"
    wait_for(lambda: job.get_status(refresh=True) == "finished", "the RQ job ran", 30)
    in_celery, in_rq = lines(celery.log(), RETRY_LINE)[0], lines(rq.log(), RETRY_LINE)[0]
    assert (in_celery["id"], in_rq["id"]) == (task.id, job.id)
    assert in_celery["level"] == in_rq["level"] == "INFO"
    assert in_celery["logger"] == in_rq["logger"] == "celery_redislock.core.outcomes"
    assert as_said(in_celery) == as_said(in_rq)

    # Both named their lock Redis once as they started, at INFO.
    started = r"INFO celery_redislock\.core\.reach lock Redis (\S+) answers; .*"
    assert [m[1] for m in lines(celery.log(), started)] == [celery_server.url]
    assert [m[1] for m in lines(rq.log(), started)] == [rq_server.url]


LEASE_LOST = r"ERROR (?P<logger>\S+) .*lease.* lost.*"


def test_a_lost_lease_logs_one_error_line(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """One line per lost lease, the run's (naming the task, its id and the lock); the
    heartbeat's own line would repeat it."""
    worker = workers(env={**CELERY_ENV, "LOCKAPP_TTL": "1.5"})
    result = lockapp.watch_lease.delay("ll", 30)
    wait_for(lambda: lockapp.r.exists("lease:ll"), "the task read its lease", 30)
    lockapp.r.delete(*lock_for(lockapp.watch_lease, ("ll", 30)).keys.all)  # the lease vanishes
    assert result.get(timeout=30) == "lost"
    assert lockapp.r.lrange("signal:lock_lost", 0, -1) == [f"{result.id}:hold:ll".encode()]
    said = (
        rf"ERROR celery_redislock\.core\.outcomes task lockapp\.watch_lease\[{result.id}\]: "
        r"lease on lock 'hold:ll' lost; the task goes on without it"
    )
    wait_for(lambda: lines(worker.log(), said), "the loss logged", 10)
    log = worker.log()
    assert len(lines(log, LEASE_LOST)) == 1, log
    # ... nor a WARNING at its release for the lease already reported lost.
    assert "no longer held at release" not in log, log


def ignored(name: str, task_id: str) -> str:
    """Celery's line for a task that raised ``Ignore``."""
    return rf"INFO celery\.app\.trace Task {re.escape(name)}\[{task_id}\] ignored"


def test_celery_adds_no_ignored_line_to_ours_but_keeps_it_for_a_users_ignore(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    """A parked or skipped task is answered with Celery's ``Ignore``: our line says what
    happened, and Celery's "Task ... ignored" after it would only confuse. A task body that
    raises ``Ignore`` itself keeps Celery's line."""
    worker = workers(env=CELERY_ENV)
    holder = lockapp.in_line.delay("pk", 0, 30)
    wait_for(lambda: lockapp.r.llen("started:line:pk") == 1, "the holder runs", 30)
    parked = lockapp.in_line.delay("pk", 1)
    parked_line = OUTCOME + r"parked in the task line of lock 'line:pk' .*"
    wait_for(lambda: lines(worker.log(), parked_line), "the second parked", 30)
    with Lock(lockapp.r, "hold:ik", ttl=30).acquire(owner="test", info=HOLDER):
        skipped = lockapp.hold.delay("ik")
        wait_for(lambda: lines(worker.log(), SKIPPED_LINE), "the skip logged", 30)
    lockapp.r.set("stop:pk", 1)
    assert (holder.get(timeout=30), parked.get(timeout=30)) == (0, 1)
    users = lockapp.hold.delay("iu", 0, "ignore")  # the body raises Ignore
    said = ignored("lockapp.hold", users.id)
    wait_for(lambda: lines(worker.log(), said), "Celery's line for the user's Ignore", 30)

    log = worker.log()
    assert [m["id"] for m in lines(log, parked_line)] == [parked.id]
    assert [m["id"] for m in lines(log, SKIPPED_LINE)] == [skipped.id]
    assert not lines(log, ignored("lockapp.in_line", parked.id)), log
    assert not lines(log, ignored("lockapp.hold", skipped.id)), log
    assert len(lines(log, r"INFO celery\.app\.trace Task \S+ ignored")) == 1, log


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unanswered(port: int, policy: str) -> str:
    """The one line a worker logs as it starts when its lock Redis does not answer."""
    return (
        rf"ERROR celery_redislock\.core\.reach lock Redis redis://:\*\*\*@127\.0\.0\.1:{port}/0 "
        r"does not answer as the worker starts \(ConnectionError: .*\); the worker starts "
        r"anyway, and until it answers, tasks with lock=, unique= or rate= options fail with "
        rf"LockBackendError \({policy}='fail'\).*"
    )


SWEEP_FAILED = r"WARNING celery_redislock\.\S+ task line sweep on \S+ failed, retrying: .*"
SWEEP_OLD = r".*task lines: sweep failed.*"


@pytest.mark.slow
@pytest.mark.faults
def test_a_celery_worker_names_its_unreachable_lock_redis_once_and_is_not_noisy(
    lockapp: ModuleType, workers: Callable[..., Worker]
) -> None:
    port = _free_port()  # nothing listens there
    url = f"redis://:s3cret@127.0.0.1:{port}/0"
    # The line sweeper tries 5 times a second (1 s by default): a short window counts as many.
    worker = workers(env={**CELERY_ENV, "LOCKAPP_LOCK_URL": url, "LOCKAPP_SWEEP_INTERVAL": "0.2"})
    log = worker.log()
    assert len(lines(log, unanswered(port, "redislock_on_backend_error"))) == 1, log
    assert "s3cret" not in log
    assert "could not publish unique task specs" not in log  # said once, in that line

    # Its line sweeper (lockapp has tasks that may park) fails at each sweep: one line, not one
    # a sweep. (Counted over a window of some 5 sweeps: what is measured is that nothing more is
    # said.)
    def failed() -> bool:
        log = worker.log()
        return bool(lines(log, SWEEP_FAILED) or lines(log, SWEEP_OLD))

    wait_for(failed, "the first sweep failure logged", 10)
    time.sleep(1)  # (the window: a line that must not come has no event to wait for)
    log = worker.log()
    assert len(lines(log, SWEEP_FAILED)) == 1 and not lines(log, SWEEP_OLD), log


@pytest.mark.faults
def test_an_rq_lock_worker_names_its_unreachable_lock_redis_once(
    rq_conn: redis.Redis, rq_workers: Callable[..., RQWorker]
) -> None:
    port = _free_port()
    url = f"redis://:s3cret@127.0.0.1:{port}/0"
    worker = rq_workers(name="w0", args=RQ_ARGS, env={"REDISLOCK_URL": url})
    # Said just after RQ's "Listening on" (RQ sets its log up in bootstrap, the check follows).
    said = unanswered(port, "REDISLOCK_ON_BACKEND_ERROR")
    wait_for(lambda: lines(worker.log(), said), "the unanswered lock Redis logged", 10)
    log = worker.log()
    assert len(lines(log, said)) == 1, log
    assert "s3cret" not in log


def test_the_lock_redis_is_named_without_its_password() -> None:
    from celery_redislock.core.reach import where

    assert where(redis.Redis.from_url("redis://ops:pw@h:1/2")) == "redis://ops:***@h:1/2"
    assert where(redis.Redis.from_url("redis://:pw@h:1")) == "redis://:***@h:1/0"
    assert where(redis.Redis.from_url("rediss://h:1/3")) == "rediss://h:1/3"
    assert where(redis.Redis(unix_socket_path="/run/r.sock")) == "unix:///run/r.sock?db=0"
