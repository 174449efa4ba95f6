"""Process handling shared by the Celery examples: the commands they run, and running them.

``python <example>.py`` (or ``run``) starts the example's workers and beat with the very commands
docker-compose.yml gives its services, then its producer (``python <example>.py produce``), and
exits with the producer's status. ``produce`` runs only the producer, against workers started
elsewhere. Every child gets a process group of its own: a Ctrl-C reaches only this runner, which
then stops each child with its pool processes (warm shutdown, then SIGKILL), however it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import redis
from celery import Celery

EXAMPLES = Path(__file__).resolve().parent
# The checkout, for demos._common (process handling, interval maths), which is not installed.
# Appended, not prepended: an installed celery_redislock stays the one imported.
if str(EXAMPLES.parent) not in sys.path:
    sys.path.append(str(EXAMPLES.parent))

from celery_redislock import install  # noqa: E402
from celery_redislock.contrib.redis_server import redis_url  # noqa: E402
from demos._common.processes import Children  # noqa: E402

PRODUCER_TIMEOUT = 60.0  # seconds; every example's producer is done well within it


def example_app(name: str, **conf: Any) -> tuple[Celery, redis.Redis]:
    """An example's Celery app, with broker, results and locks on ``REDIS_URL``, and a Redis
    client for the notes its tasks leave. Locks, claims and queue are named after the example:
    it can share a Redis with the others, and a run can clear what an earlier one left."""
    url = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
    app = install(Celery(name, broker=url, backend=url))
    app.conf.update(
        redislock_url=url,
        redislock_namespace=name,
        task_default_queue=name,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        **conf,
    )
    return app, redis.Redis.from_url(url, decode_responses=True)


@contextlib.contextmanager
def noted(client: redis.Redis, key: str, what: str) -> Iterator[None]:
    """Notes the interval the body ran in (as ``[what, start, end]`` on the list ``key``); the
    end is noted before the lease goes."""
    start = time.time()
    try:
        yield
    finally:
        client.rpush(key, json.dumps([what, start, time.time()]))


def worker_command(app: str, name: str, concurrency: int = 2) -> list[str]:
    """``celery -A <app> worker`` as a user (and docker-compose.yml) types it."""
    return [
        "celery", "-A", app, "worker", "-n", f"{name}@%h", "-c", str(concurrency), "-l", "info",
        # No gossip, mingle or event heartbeats: nothing here needs them, and mingle adds a
        # second to every start.
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip


def beat_command(app: str) -> list[str]:
    return ["celery", "-A", app, "beat", "-l", "info"]


def produce_command(app: str) -> list[str]:
    return ["python", f"{app}.py", "produce"]


def _on_sigterm(signum: int, frame: object) -> None:
    # Unwinds like a Ctrl-C, through the finally blocks that stop the children.
    sys.exit(128 + signum)


def reset(url: str, app: str) -> None:
    """Deletes what an earlier run of ``app`` left in Redis: its queue, notes, locks and claims
    (every example keeps them under its own name), so a run starts from nothing."""
    client = redis.Redis.from_url(url)
    try:
        client.delete(app, *client.scan_iter(match=f"{app}:*"))
    finally:
        client.close()


def services(
    app: str, workers: Sequence[Sequence[str]], beat: Sequence[str] | None = None
) -> dict[str, list[str]]:
    """Every process of the example, by the name of its docker-compose.yml service, in the
    order they start: ``worker1``, ``worker2``, ..., ``beat`` if any, ``producer``."""
    found = {f"worker{i}": list(command) for i, command in enumerate(workers, 1)}
    if beat is not None:
        found["beat"] = list(beat)
    found["producer"] = produce_command(app)
    return found


def run(app: str, workers: Sequence[Sequence[str]], beat: Sequence[str] | None = None) -> int:
    """Runs the whole example: Redis, the workers, beat, then the producer; returns the
    producer's status."""
    commands = services(app, workers, beat)
    log_dir = Path(tempfile.mkdtemp(prefix=f"{app}-"))
    children = Children(log_dir, cwd=EXAMPLES)
    status = 1
    try:
        with redis_url() as url:
            os.environ["REDIS_URL"] = url  # the children's broker, results and locks
            reset(url, app)
            print(f"{app}: {', '.join(commands)}; logs in {log_dir}", file=sys.stderr)
            try:
                children.start_workers(
                    {k: v for k, v in commands.items() if k.startswith("worker")}
                )
                if "beat" in commands:
                    children.start("beat", commands["beat"])
                children.start("producer", commands["producer"], log=False)
                try:
                    status = children.wait("producer", PRODUCER_TIMEOUT)
                except subprocess.TimeoutExpired:
                    print(f"{app}: producer still running after {PRODUCER_TIMEOUT} s", flush=True)
            finally:
                children.stop()
    finally:
        if status == 0:
            shutil.rmtree(log_dir, ignore_errors=True)
        else:
            print(f"{app}: logs kept in {log_dir}", file=sys.stderr)
    return status


def main(
    app: str,
    produce: Callable[[], bool],
    workers: Sequence[Sequence[str]],
    beat: Sequence[str] | None = None,
) -> None:
    """The examples' command line: ``run`` (the default) or ``produce``. Exits 0 only if the
    example's invariant held (``produce`` returned True)."""
    command = sys.argv[1] if len(sys.argv) > 1 else "run"
    if command == "produce":
        sys.exit(0 if produce() else 1)
    if command != "run" or len(sys.argv) > 2:
        sys.exit(f"usage: python {app}.py [run | produce]")
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        sys.exit(run(app, workers, beat))
    except KeyboardInterrupt:
        sys.exit(130)  # every child is already stopped
