"""``on_conflict="queue"`` for RQ: a job parked in its lock's task line waits in RQ's scheduled
registry (its ``Retry`` is due long after its wait could end: a fallback only). Whoever hands
the lock to it moves it to the front of its queue, marked with the hand-over it is to claim, in
one transaction watched on the registry: two hand-overs of one entry queue the job once."""

from __future__ import annotations

import json
import logging
import time
from enum import Enum
from typing import Any

import redis
from rq import Queue
from rq.exceptions import InvalidJobOperation, NoSuchJobError

from ...core.lease import RedisClient
from ...core.line import DEFAULT_HANDOVER_WINDOW, Handed, drop_hand_over
from ...core.lock import Lock
from ...errors import RedisLockError
from ._compat import Job, enqueue_again

__all__ = ["LINE_META", "PutBack", "line_of", "payload_of"]

log = logging.getLogger(__name__)

LINE_META = "redislock_line"
"""``job.meta`` key of a job in a task line: ``{"token": <its entry>, "state": "parked" |
"handed" | "expired", "until": <wall-clock end of its wait>, "since": <when it first parked>}``;
dropped once it claims the lock."""

# A hand-over that comes between a horse parking its job and RQ scheduling its Retry waits this
# long for it (past it, the entry comes back after the core's publish window, handed again).
SETTLE_S = 5.0
_ENDED = ("finished", "failed", "canceled", "stopped")


class _Found(Enum):
    MOVED = 1  # taken from the scheduled registry and queued, marked with the hand-over
    ELSEWHERE = 2  # queued already for this entry (a second hand-over, or RQ's fallback)
    GONE = 3  # deleted, ended, or parked again under another entry: this entry is stale
    PENDING = 4  # its horse is still parking it


def payload_of(job: Job, lock: Lock) -> str:
    """A parked job's line entry: where the job is, and the lock (to give its turn up if the
    job is gone by the time the lock is handed to it)."""
    spec = {
        "name": lock.name,
        "namespace": lock.namespace,
        "ttl": lock.ttl,
        "mode": lock.mode,
        "limit": lock.limit,
        "fence_keep": lock.fence_keep,
    }
    return json.dumps({"job": job.id, "queue": job.origin, "lock": spec})


def line_of(job: Job) -> dict[str, Any] | None:
    """The job's place in a task line (:data:`LINE_META`), if it has one."""
    value = (job.meta or {}).get(LINE_META)
    return value if isinstance(value, dict) and isinstance(value.get("token"), str) else None


class PutBack:
    """A lock's ``handover`` for RQ jobs: puts the parked job the lock was handed to at the front
    of its queue (it waited its turn once already; the lock idles until it starts). A job deleted
    or ended meanwhile gives its turn to the next in line at once. ``connection``/``serializer``:
    the RQ Redis the jobs live in; ``lock_client``: the locks'.

    >>> put_back = PutBack(rq_redis, None, client)                       # doctest: +SKIP
    >>> lock = Lock(client, "sync:42", ttl=30, handover=put_back)        # doctest: +SKIP
    """

    def __init__(
        self,
        connection: redis.Redis,
        serializer: Any,
        lock_client: RedisClient,
        handover_window: float = DEFAULT_HANDOVER_WINDOW,
    ) -> None:
        self.connection = connection
        self.serializer = serializer
        self.lock_client = lock_client
        self.handover_window = handover_window
        # Entries whose job stayed "being parked" past SETTLE_S once (its horse died meanwhile):
        # looked at again without waiting, so that a sweeper does not stall on them each sweep.
        self._stuck: set[str] = set()

    def __call__(self, handed: Handed) -> None:
        ref = json.loads(handed.payload)
        job_id, queue = str(ref["job"]), str(ref["queue"])
        state = "expired" if handed.expired else "handed"
        deadline = time.monotonic() + (0 if handed.token in self._stuck else SETTLE_S)
        pause = 0.002

        def step() -> _Found:
            if handed.replaced:
                return self._cancel(job_id, queue, handed.token)
            return self._move(job_id, queue, handed.token, state)

        found = step()
        while found is _Found.PENDING and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
            found = step()
        if found is _Found.PENDING:
            self._stuck.add(handed.token)
            raise RedisLockError(
                f"job {job_id} is not parked yet after {SETTLE_S:g}s (its horse still runs)",
                name=str(ref["lock"]["name"]),
            )
        self._stuck.discard(handed.token)
        if handed.replaced:
            return
        if found is _Found.MOVED:
            log.info(
                "job %s put back on queue %r: %s",
                job_id,
                queue,
                "its wait in line ended" if handed.expired else "the lock was handed to it",
            )
        elif found is _Found.GONE and not handed.expired:
            self._give_up_turn(ref, handed)

    def _move(self, job_id: str, queue_name: str, token: str, state: str) -> _Found:
        queue = Queue(queue_name, connection=self.connection, serializer=self.serializer)
        registry = queue.scheduled_job_registry
        with self.connection.pipeline() as pipe:
            while True:
                try:
                    # Watched: RQ's scheduler, or another hand-over of this entry, may move it.
                    pipe.watch(registry.key, Job.key_for(job_id))  # type: ignore[no-untyped-call]
                    if pipe.zscore(registry.key, job_id) is None:
                        return self._elsewhere(job_id, token)
                    try:
                        job = Job.fetch(
                            job_id, connection=self.connection, serializer=self.serializer
                        )
                    except NoSuchJobError:
                        return _Found.GONE
                    line = line_of(job)
                    if line is None or line["token"] != token or _status(job) in _ENDED:
                        return _Found.GONE  # scheduled for another reason, parked anew, ended
                    job.meta[LINE_META] = {**line, "state": state}
                    pipe.multi()
                    pipe.zrem(registry.key, job_id)
                    enqueue_again(queue, job, pipe)
                    pipe.execute()
                    return _Found.MOVED
                except redis.WatchError:
                    continue

    def _cancel(self, job_id: str, queue_name: str, token: str) -> _Found:
        """A job replaced under its unique key while parked left the line unrun: it ends
        ``canceled``, as a replaced job does (its producer's cancel may have lost against
        the horse's Retry being scheduled: the job waits in the scheduled registry)."""
        try:
            job = Job.fetch(job_id, connection=self.connection, serializer=self.serializer)
        except NoSuchJobError:
            return _Found.GONE
        status = _status(job)
        if status in _ENDED:
            return _Found.GONE
        if status == "started":
            return _Found.PENDING  # its horse is still parking it
        line = line_of(job)
        if line is None or line["token"] != token:
            return _Found.GONE  # parked anew under another entry
        queue = Queue(queue_name, connection=self.connection, serializer=self.serializer)
        queue.scheduled_job_registry.remove(job)
        try:
            job.cancel()
        except InvalidJobOperation:  # canceled meanwhile
            return _Found.GONE
        log.info("job %s canceled: replaced under its unique key while parked", job_id)
        return _Found.GONE

    def _elsewhere(self, job_id: str, token: str) -> _Found:
        """The job is not in the scheduled registry: being parked, queued already, or gone."""
        try:
            job = Job.fetch(job_id, connection=self.connection, serializer=self.serializer)
        except NoSuchJobError:
            return _Found.GONE
        status = _status(job)
        if status in _ENDED:
            return _Found.GONE
        if status == "queued":
            line = line_of(job)
            return _Found.ELSEWHERE if line is not None and line["token"] == token else _Found.GONE
        return _Found.PENDING

    def _give_up_turn(self, ref: dict[str, Any], handed: Handed) -> None:
        """Drops the lease handed to a job that will never come: the lock goes to the next in
        line now, not at the end of the hand-over window."""
        lock = Lock(
            self.lock_client, **ref["lock"], handover=self, handover_window=self.handover_window
        )
        try:
            dropped = drop_hand_over(lock, handed.token)
        except RedisLockError as exc:
            log.warning(
                "lock %r: could not pass on the turn of job %s, gone from its queue (the lock "
                "goes to the next in line after the hand-over window): %s",
                lock.name,
                ref["job"],
                exc,
            )
            return
        if dropped:
            log.info(
                "job %s ended or was deleted while parked: lock %r goes to the next in line",
                ref["job"],
                lock.name,
            )


def _status(job: Job) -> str:
    raw = job.get_status(refresh=False)
    return str(getattr(raw, "value", raw))
