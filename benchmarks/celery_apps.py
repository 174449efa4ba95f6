"""Celery apps for ``benchmarks/celery_overhead.py`` and ``benchmarks/celery_enqueue.py``: one app
per variant, same settings.

A worker runs exactly one variant, chosen by environment variables that the benchmark sets::

    CELERYBENCH_VARIANT=plain|celery_redislock|celery_singleton|celery_once|floor|floor_fenced
    CELERYBENCH_URL=redis://...   broker, result backend and every lock on the same Redis
    CELERYBENCH_RUN=<run id>      goes into every key and the queue name
    CELERYBENCH_TTL=3             our lease ttl (s)
    CELERYBENCH_EXPIRY=10         celery-singleton's lock_expiry (s)

A worker notes in Redis which parser its redis-py uses (``Keys.parser``: ``hiredis`` or
``python``): the benchmark hides hiredis from a worker (a stub on its ``PYTHONPATH``) to run it on
the pure-Python parser, and checks.

    python -m celery -A celery_apps worker ...      (with benchmarks/ on PYTHONPATH)

The benchmark process builds the same apps with :func:`make_app` to publish: celery-singleton
and celery-once lock when a task is *published*, so the publishing side must be theirs too.

The ``floor`` variant takes no lock: its tasks only make the Redis round trips a lock of each
kind cannot do without, on the same Redis, so that its figures are the least such a lock can
cost here. A ``noop`` or ``hold`` sends one ``PING`` before its body and one after it, in the pool
child (where our lock takes and gives back its lease); a ``unique`` call sends one ``PING``
before it is published (where an enqueue-time claim is made). The ``floor_fenced`` variant (the
overhead benchmark's only) takes a lease in the pool child with the least script a lock that
hands out fencing tokens must run (``SET NX PX`` and an ``INCR``, ``floors.py``) and gives it back
with a compare-and-delete: two round trips, as ``floor``, each a small script. The
``floor_confirmed`` variant (the enqueue benchmark's only) sends one ``PING`` before the publish
and one after it: the least a claim confirmed once its message went out can cost (ours: a claim
whose message never went out, its producer killed in between, lasts seconds, not its lifetime,
and blocks no later call).

Every variant has the same three tasks, with the same signatures and bodies:

* ``noop(run, i)``: INCR of a per-variant counter, which the benchmark polls to see completions.
* ``hold(run, key, tag, seconds)``: RPUSH of ``{"tag", "pid", "t"}`` to an events list, then
  sleeps. Exclusive on ``(run, key)``; ``tag`` and ``seconds`` are not part of the lock.
* ``unique(run, n)``: does nothing. Unique at enqueue time on ``(run, n)`` until it finishes: a
  call while a copy is queued is not published (plain: no such notion, always published).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery, Task
from floors import COMPARE_AND_DELETE, SET_AND_FENCE

VARIANTS = ("plain", "celery_redislock", "celery_singleton", "celery_once", "floor")
# The overhead benchmark's: also the floor of a fenced lease taken and given back in the worker.
OVERHEAD_VARIANTS = (*VARIANTS, "floor_fenced")
# The enqueue benchmark's: also the floor of a claim confirmed after its publish.
ENQUEUE_VARIANTS = (*VARIANTS, "floor_confirmed")
FENCED_TTL_MS = 3000  # the fenced floor's lease (as our benchmark's ttl)
ONCE_DEFAULT_TIMEOUT_S = 60 * 60  # celery-once's default lock timeout (QueueOnce.default_timeout)


@dataclass(frozen=True)
class Keys:
    """The benchmark's own Redis keys for one variant of one run."""

    run: str
    variant: str

    @property
    def prefix(self) -> str:
        return f"celerybench-{self.run}"

    @property
    def done(self) -> str:
        return f"{self.prefix}:{self.variant}:done"

    @property
    def events(self) -> str:
        return f"{self.prefix}:{self.variant}:events"

    @property
    def parser(self) -> str:
        return f"{self.prefix}:{self.variant}:parser"


def parser_in_use() -> str:
    """The parser redis-py uses in this process by default (hiredis packs commands too)."""
    import redis.utils

    return "hiredis" if redis.utils.HIREDIS_AVAILABLE else "python"


_clients: dict[str, redis.Redis] = {}


def _client(url: str) -> redis.Redis:
    # One client per process and URL; redis-py reconnects by itself in a forked pool child.
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url)
    return _clients[url]


class WorkerRoundTrips(Task):  # type: ignore[misc]
    """The floor of a lock held in the worker: one round trip before the body, one after it."""

    abstract = True
    floor_url = ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        client = _client(self.floor_url)
        client.ping()
        try:
            return super().__call__(*args, **kwargs)
        finally:
            client.ping()


class WorkerFencedLease(Task):  # type: ignore[misc]
    """The floor of a fenced lock held in the worker: the fenced floor's take (``SET NX PX`` and
    an ``INCR`` in one script) before the body, its compare-and-delete after it, on a key made
    from the first two arguments (``noop``'s: one per call, never held)."""

    abstract = True
    floor_url = ""
    _scripts: tuple[Any, Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        client = _client(self.floor_url)
        if WorkerFencedLease._scripts is None:
            scripts = (
                client.register_script(SET_AND_FENCE),
                client.register_script(COMPARE_AND_DELETE),
            )
            WorkerFencedLease._scripts = scripts
        take, give_back = WorkerFencedLease._scripts
        name = f"{{bench:{args[0]}:{args[1]}}}"
        keys, token = [f"{name}:lease", f"{name}:fence"], os.urandom(16).hex()
        if not take(keys=keys, args=[token, FENCED_TTL_MS]):
            raise RuntimeError(f"fenced floor: {name} is held")
        try:
            return super().__call__(*args, **kwargs)
        finally:
            give_back(keys=keys[:1], args=[token])


class _PublishRoundTrip(Task):  # type: ignore[misc]
    """The floor of a claim made at enqueue: one round trip before each publish."""

    abstract = True
    floor_url = ""

    def apply_async(self, *args: Any, **kwargs: Any) -> Any:
        _client(self.floor_url).ping()
        return super().apply_async(*args, **kwargs)


class _ConfirmedPublishRoundTrips(Task):  # type: ignore[misc]
    """The floor of a claim made at enqueue and confirmed after the publish: one round trip
    before each publish, one after it."""

    abstract = True
    floor_url = ""

    def apply_async(self, *args: Any, **kwargs: Any) -> Any:
        client = _client(self.floor_url)
        client.ping()
        result = super().apply_async(*args, **kwargs)
        client.ping()
        return result


def make_app(variant: str, url: str, run: str, *, ttl: float, expiry: float) -> Celery:
    """The app of one variant; only the task base / lock options differ between variants."""
    if variant not in (*OVERHEAD_VARIANTS, *ENQUEUE_VARIANTS):
        raise ValueError(f"unknown variant {variant!r}")
    keys = Keys(run, variant)
    app = Celery(f"celerybench_{variant}", broker=url, backend=url, set_as_current=False)
    app.conf.update(
        # Queue and keys carry the run id: runs against a shared --url Redis do not mix.
        task_default_queue=keys.prefix,
        broker_transport_options={"global_keyprefix": f"{keys.prefix}:"},
        result_backend_transport_options={"global_keyprefix": f"{keys.prefix}:"},
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
    )
    base: type[Task] | None = None
    noop_opts: dict[str, Any] = {}
    hold_opts: dict[str, Any] = {}
    unique_opts: dict[str, Any] = {}
    if variant == "celery_redislock":
        import celery_redislock

        app.conf.redislock_url = url
        app.conf.redislock_namespace = f"{keys.prefix}:redislock"
        app.conf.redislock_ttl = ttl
        celery_redislock.install(app)
        noop_opts = {"lock": {"key": "bench:{run}:{i}"}}
        hold_opts = {"lock": {"key": "bench:{run}:hold:{key}"}}
        unique_opts = {"unique": {"lifecycle": "until_finished", "key": "bench:{run}:{n}"}}
    elif variant == "celery_singleton":
        from celery_singleton import Singleton

        app.conf.singleton_backend_url = url
        app.conf.singleton_key_prefix = f"{keys.prefix}:singleton:"
        # Its documented guard against locks left by lost workers; without it they never expire.
        # Whole seconds: it goes to SET ... EX, which redis-py refuses as a float.
        app.conf.singleton_lock_expiry = round(expiry)
        base = Singleton
        hold_opts = {"unique_on": ["run", "key"]}
    elif variant == "celery_once":
        from celery_once import QueueOnce

        app.conf.ONCE = {
            "backend": "celery_once.backends.Redis",
            "settings": {"url": url, "default_timeout": ONCE_DEFAULT_TIMEOUT_S},
        }
        base = QueueOnce
        hold_opts = {"once": {"keys": ["run", "key"]}}
        unique_opts = {"once": {"graceful": True}}  # a duplicate returns instead of raising
    if base is not None:
        noop_opts["base"] = base
        hold_opts["base"] = base
        unique_opts["base"] = base  # celery-singleton, celery-once: unique on all arguments
    if variant == "floor":
        noop_opts = hold_opts = {"base": WorkerRoundTrips, "floor_url": url}
        unique_opts = {"base": _PublishRoundTrip, "floor_url": url}
    if variant == "floor_fenced":
        noop_opts = hold_opts = {"base": WorkerFencedLease, "floor_url": url}
    if variant == "floor_confirmed":
        unique_opts = {"base": _ConfirmedPublishRoundTrips, "floor_url": url}

    # shared=False: a shared task would be added to every app this process creates.
    @app.task(name="celerybench.noop", shared=False, **noop_opts)  # type: ignore[untyped-decorator]
    def noop(run: str, i: int) -> None:
        _client(url).incr(keys.done)

    @app.task(name="celerybench.hold", shared=False, **hold_opts)  # type: ignore[untyped-decorator]
    def hold(run: str, key: str, tag: str, seconds: float) -> None:
        event = {"tag": tag, "pid": os.getpid(), "t": time.time()}
        _client(url).rpush(keys.events, json.dumps(event))
        time.sleep(seconds)

    @app.task(name="celerybench.unique", shared=False, **unique_opts)  # type: ignore[untyped-decorator]
    def unique(run: str, n: int) -> None:
        pass

    return app


if "CELERYBENCH_VARIANT" in os.environ:  # a worker: ``celery -A celery_apps worker``
    app = make_app(
        os.environ["CELERYBENCH_VARIANT"],
        os.environ["CELERYBENCH_URL"],
        os.environ["CELERYBENCH_RUN"],
        ttl=float(os.environ.get("CELERYBENCH_TTL", "3")),
        expiry=float(os.environ.get("CELERYBENCH_EXPIRY", "10")),
    )
    _client(os.environ["CELERYBENCH_URL"]).set(
        Keys(os.environ["CELERYBENCH_RUN"], os.environ["CELERYBENCH_VARIANT"]).parser,
        parser_in_use(),
    )
