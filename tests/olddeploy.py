"""An older deploy of the test app (tests/lockapp.py) during a rolling deploy: the same broker,
results and lock Redis, installed, but without the unique tasks the new code declares. Workers
import it as ``olddeploy``; a worker of it receives the new tasks' messages and discards them
as unregistered."""

from __future__ import annotations

import os

from celery import Celery

from celery_redislock import install

URL = os.environ["LOCKAPP_REDIS_URL"]
# The broker may be another (LOCKAPP_BROKER_URL, e.g. RabbitMQ); results and locks stay on URL.
app = install(Celery("lockapp", broker=os.environ.get("LOCKAPP_BROKER_URL", URL), backend=URL))
app.conf.update(worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True)
app.conf.redislock_url = URL


@app.task(lock="old:{name}")
def old_task(name: str) -> str:
    return name
