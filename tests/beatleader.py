"""The app of the leader-beat tests: a 1 s and a 5 s entry (``BEAT_ENTRIES`` to choose) sent by
``LeaderScheduler`` over ``PersistentScheduler``, to a Redis broker that no worker reads, so that
a test counts the messages themselves. ``BEAT_SKIP`` names entries whose missed ticks are
skipped; ``BEAT_TTL`` is the leader lease's ttl. Locks on ``BEAT_REDIS_URL`` (the broker too,
unless ``BEAT_BROKER_URL``), or on the master the Sentinels ``BEAT_SENTINELS`` name (service
``locks``, ``BEAT_MIN_REPLICAS`` replicas acknowledging); ``BEAT_PLAIN=1``: Celery's own
scheduler, no leader (what a fleet of beats does without this package)."""

from __future__ import annotations

import os

from celery import Celery

URL = os.environ["BEAT_REDIS_URL"]
app = Celery("beatleader", broker=os.environ.get("BEAT_BROKER_URL", URL), set_as_current=False)
if "BEAT_SENTINELS" in os.environ:
    app.conf.redislock_sentinels = os.environ["BEAT_SENTINELS"]
    app.conf.redislock_sentinel_master = "locks"
    app.conf.redislock_min_replicas = int(os.environ.get("BEAT_MIN_REPLICAS", "0"))
else:
    app.conf.redislock_url = URL
if not os.environ.get("BEAT_PLAIN"):
    app.conf.beat_scheduler = "celery_redislock:LeaderScheduler"
app.conf.redislock_beat_ttl = float(os.environ.get("BEAT_TTL", "2"))
app.conf.beat_max_loop_interval = 1
if "BEAT_INNER" in os.environ:
    app.conf.redislock_beat_scheduler = os.environ["BEAT_INNER"]

_SKIP = set(filter(None, os.environ.get("BEAT_SKIP", "").split(",")))
_MISSED = os.environ.get("BEAT_MISSED", "skip")  # (another value: a bad declaration)
app.conf.beat_schedule = {
    name: {
        "task": "beatleader.tick",
        "schedule": float(seconds),
        "args": (name,),
        **({"options": {"redislock": {"missed": _MISSED}}} if name in _SKIP else {}),
    }
    for name, seconds in (
        entry.split("=") for entry in os.environ.get("BEAT_ENTRIES", "1s=1,5s=5").split(",")
    )
}


@app.task(name="beatleader.tick")
def tick(name: str) -> str:
    return name
