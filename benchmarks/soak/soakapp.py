"""The Celery app the soak's workers run (``benchmarks/soak``): locked tasks that note every
run in a ledger Redis that the soak's chaos never touches.

Workers run it as ``celery -A soak.soakapp worker`` with ``benchmarks/`` on ``PYTHONPATH``; the soak
process imports it too, to publish. Its configuration comes from the environment::

    SOAK_MAIN_URL    result backend (and the producer's locks), straight to Redis
    SOAK_BROKER_URL  the broker: RabbitMQ (``amqp://``) or Redis (default: SOAK_MAIN_URL)
    SOAK_LOCK_URL    the workers' lock client: through the fault proxy, with a short timeout
    SOAK_LEDGER_URL  where runs and conflicts are noted; never faulted, never restarted
    SOAK_TTL         lease ttl, seconds (default 15, the package's default)
    SOAK_VT          a Redis broker's visibility_timeout, seconds (default 10)
    SOAK_TRACE_BRPOP "1": with the Redis broker, log (in the worker) a message held in a BRPOP
                     reply that kombu leaves unread while the worker has no prefetch credit

Each run notes its start *before* the body and its end *after* it, both stamped with the
ledger server's clock (``TIME`` inside a script), so every stamp of every process is on one
clock; a run killed in between keeps a start without an end. The ledger's keys:

    soak:start      hash  run id -> "<µs> <json: task id, kind, lock, mode, pid, ppid, ...>"
    soak:end        hash  run id -> "<µs>"
    soak:busy       hash  pid -> run id of the run in progress there (the chaos aims with it)
    soak:conflicts  list  "<µs> <json: task id, action, lock, holders, pid>"
    soak:published  list  "<µs> <json: task id, before µs, pid, host>": every message published
                          (the producer's and the workers' retries and re-publishes), noted
                          once the publish returned; "before" was read as it began (this
                          host's clock, the ledger's too)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import select
import socket
import threading
import time
import uuid
from typing import Any

import redis
from celery import Celery
from celery.signals import after_task_publish, before_task_publish

from celery_redislock import install, lock_conflict

MAIN_URL = os.environ.get("SOAK_MAIN_URL", "redis://127.0.0.1:6379/0")
BROKER_URL = os.environ.get("SOAK_BROKER_URL", MAIN_URL)
LOCK_URL = os.environ.get("SOAK_LOCK_URL", MAIN_URL)
LEDGER_URL = os.environ.get("SOAK_LEDGER_URL", "redis://127.0.0.1:6379/1")
TTL = float(os.environ.get("SOAK_TTL", "15"))
VISIBILITY_TIMEOUT = float(os.environ.get("SOAK_VT", "10"))
QUEUE = "soak"

START, END, BUSY, CONFLICTS = "soak:start", "soak:end", "soak:busy", "soak:conflicts"
PUBLISHED = "soak:published"

app = install(Celery("soakapp", broker=BROKER_URL, backend=MAIN_URL))
app.conf.update(
    redislock_url=LOCK_URL,
    redislock_ttl=TTL,
    # A lost reply is an error of the lock client; "retry" re-publishes the task like a
    # conflict, where "fail" would end it FAILURE on purpose and hide what the soak looks for.
    redislock_on_backend_error="retry",
    # At-least-once: a message is acknowledged after the run, and a run whose pool child was
    # killed is requeued (without this, Celery acknowledges it and stores WorkerLostError).
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=1,
    result_expires=24 * 3600,
    broker_connection_retry_on_startup=True,
)
if BROKER_URL.startswith(("redis://", "rediss://", "unix://")):
    app.conf.broker_transport_options = {
        # A whole worker killed leaves its messages unacknowledged: another worker restores
        # them this long after their delivery. (RabbitMQ requeues them as the connection
        # drops, at once: no such setting.)
        "visibility_timeout": VISIBILITY_TIMEOUT,
        # Look for overdue messages often (kombu's default: every 10 s, every 10th look).
        "unacked_restore_interval": 0.5,
        "unacked_restore_throttle": 1,
    }
# Conflicts re-publish (after a jittered, doubling countdown) rather than drop work.
RETRY: dict[str, Any] = {"on_conflict": "retry", "countdown": 0.2}

ledger = redis.Redis.from_url(LEDGER_URL)

# The stamps are taken inside the script, on the ledger's clock. Seconds and microseconds are
# joined as strings: a Lua number prints 16 digits as 1.7e+15.
_NOW = "local t = redis.call('TIME') local us = t[1] .. string.format('%06d', tonumber(t[2]))"
_start = ledger.register_script(
    # KEYS: start hash, busy hash; ARGV: run id, json, pid
    _NOW + " redis.call('HSET', KEYS[1], ARGV[1], us .. ' ' .. ARGV[2])"
    " redis.call('HSET', KEYS[2], ARGV[3], ARGV[1]) return us"
)
_end = ledger.register_script(
    # KEYS: end hash, busy hash; ARGV: run id, pid
    _NOW + " redis.call('HSET', KEYS[1], ARGV[1], us)"
    " if redis.call('HGET', KEYS[2], ARGV[2]) == ARGV[1] then redis.call('HDEL', KEYS[2],"
    " ARGV[2]) end return us"
)
_event = ledger.register_script(
    # KEYS: list; ARGV: json
    _NOW + " redis.call('RPUSH', KEYS[1], us .. ' ' .. ARGV[1]) return us"
)


def _run(task: Any, kind: str, lock: str, mode: str, seconds: float) -> str:
    """The body of every task: note the start, work, note the end."""
    run_id = uuid.uuid4().hex
    pid = os.getpid()
    request = task.request
    lease = getattr(task, "lease", None)
    note = {
        "task_id": request.id,
        "kind": kind,
        "lock": lock,
        "mode": mode,
        "pid": pid,
        "ppid": os.getppid(),  # the worker's main process: its group is killed whole
        "worker": request.hostname,
        "fence": getattr(lease, "fence", None),
        "redelivered": bool((request.delivery_info or {}).get("redelivered")),
        "conflicts": (request.headers or {}).get("redislock_conflicts"),
        "seconds": seconds,
    }
    _start(keys=[START, BUSY], args=[run_id, json.dumps(note), pid])
    time.sleep(seconds)
    _end(keys=[END, BUSY], args=[run_id, pid])
    return run_id


@app.task(bind=True, lock={"key": "k:{key}", **RETRY})
def exclusive(self: Any, key: str, seconds: float) -> str:
    """One run at a time per key."""
    return _run(self, "exclusive", f"k:{key}", "write", seconds)


@app.task(bind=True, lock={"key": "api", "limit": 2, **RETRY})
def capped(self: Any, n: int, seconds: float) -> str:
    """At most two runs at once, across both workers."""
    return _run(self, "cap", "api", "write", seconds)


@app.task(bind=True, lock={"key": "rw:{resource}", "mode": "read", **RETRY})
def read(self: Any, resource: str, seconds: float) -> str:
    """Readers share the resource..."""
    return _run(self, "read", f"rw:{resource}", "read", seconds)


@app.task(bind=True, lock={"key": "rw:{resource}", "mode": "write", **RETRY})
def write(self: Any, resource: str, seconds: float) -> str:
    """... and a writer has it alone."""
    return _run(self, "write", f"rw:{resource}", "write", seconds)


@app.task(bind=True, unique="until_finished", lock={"key": "u:{n}", **RETRY})
def unique(self: Any, n: int, seconds: float) -> str:
    """Never queued twice while a copy is queued or running; its run lease is ``u:{n}``."""
    return _run(self, "unique", f"u:{n}", "write", seconds)


def _note_conflict(
    sender: Any = None,
    task_id: str = "",
    lock: str = "",
    action: str = "",
    holders: Any = (),
    **_: Any,
) -> None:
    # A "drop" (a delivery taken for a copy of a running task) is what explains a lost task.
    note = {
        "task_id": task_id,
        "action": action,
        "lock": lock,
        "holders": list(holders or ()),
        "pid": os.getpid(),
    }
    with contextlib.suppress(redis.RedisError):  # bookkeeping: never change how a task ends
        _event(keys=[CONFLICTS], args=[json.dumps(note)])


lock_conflict.connect(_note_conflict, weak=False)


# Every publish of a task message, by whichever process made it: the soak counts, per task id,
# the messages published against the ones a worker logged receiving.
_publishing = threading.local()
_HOST = socket.gethostname()


def _before_publish(headers: Any = None, **_: Any) -> None:
    if headers and headers.get("id"):
        _publishing.began = (headers["id"], time.time_ns() // 1000)


def _after_publish(headers: Any = None, **_: Any) -> None:
    task_id = (headers or {}).get("id")
    began = getattr(_publishing, "began", None)
    if not task_id or began is None or began[0] != task_id:
        return
    _publishing.began = None
    note = {"task_id": task_id, "before": began[1], "pid": os.getpid(), "host": _HOST}
    stamp = time.time_ns() // 1000
    with contextlib.suppress(redis.RedisError):  # bookkeeping: never change how a task ends
        ledger.rpush(PUBLISHED, f"{stamp} {json.dumps(note)}")


before_task_publish.connect(_before_publish, weak=False)
after_task_publish.connect(_after_publish, weak=False)


# Diagnostics for the Redis broker. kombu (5.6+) stops reading a BRPOP connection while the
# channel has no prefetch credit, and keeps the reply "intact until credit returns": a message
# Redis already popped for that BRPOP waits in the socket, neither queued nor unacknowledged,
# for as long as the worker has no credit. This logs the task id of such a held message (a
# peek at the socket: nothing is read) and when reading resumes, so that a worker killed
# meanwhile is seen to have taken a message with it. Observation only: kombu acts as before.
_HELD_ID = re.compile(rb'"id": "([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"')
_trace_log = logging.getLogger("soakapp.brpop")


def _peek_held(sock: Any) -> str | None:
    """The task id of the message a BRPOP reply holds in ``sock``, unread; None if none."""
    try:
        if not select.select([sock], [], [], 0)[0]:
            return None
        data = sock.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (OSError, ValueError):
        return None
    found = _HELD_ID.search(data)
    return found.group(1).decode() if found else None


def trace_paused_brpop() -> bool:
    """Wraps kombu's BRPOP polling update (Redis transport) to log held messages."""
    try:
        from kombu.transport.redis import MultiChannelPoller
    except ImportError:
        return False
    update = getattr(MultiChannelPoller, "_update_brpop_polling", None)
    if update is None or getattr(update, "_soak_traced", False):
        return False  # a kombu without paused BRPOP replies, or traced already
    held: dict[int, str] = {}  # fd -> task id seen held there

    def _update_brpop_polling(self: Any) -> None:
        paused = getattr(self, "_paused_brpop", {})
        for fd, entry in list(paused.items()):
            task_id = _peek_held(entry[3])
            if task_id is not None and held.get(fd) != task_id:
                held[fd] = task_id
                _trace_log.warning(
                    "soak: a paused BRPOP reply (no prefetch credit) holds task [%s], "
                    "popped from the queue and not yet unacknowledged",
                    task_id,
                )
        update(self)
        for fd in [fd for fd in held if fd not in paused]:
            _trace_log.warning("soak: BRPOP reading resumed; it held task [%s]", held.pop(fd))

    _update_brpop_polling._soak_traced = True  # type: ignore[attr-defined]
    MultiChannelPoller._update_brpop_polling = _update_brpop_polling
    return True


if os.environ.get("SOAK_TRACE_BRPOP") == "1" and BROKER_URL.startswith(("redis://", "rediss://")):
    trace_paused_brpop()
