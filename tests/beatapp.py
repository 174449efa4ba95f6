"""A beat that cannot import the tasks it schedules: it knows ``lockapp.unique_finished`` by
name only, and learns that it is unique from what the workers published in Redis."""

from __future__ import annotations

import os

from celery import Celery

from celery_redislock import install

URL = os.environ["LOCKAPP_REDIS_URL"]
app = install(Celery("beatapp", broker=URL, backend=URL))
app.conf.redislock_url = URL
app.conf.beat_schedule = {
    "report": {
        "task": "lockapp.unique_finished",
        "schedule": float(os.environ.get("LOCKAPP_BEAT", "0.3")),
        "args": ("beat", 60),
    }
}
