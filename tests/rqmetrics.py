"""The RQ worker class of the metrics tests: ``rq worker -w rqmetrics.MetricsWorker`` imports
this module in the worker's main process, which installs the Prometheus metrics there before any
work horse is forked (as a settings module, ``rq worker -c``, does in production)."""

from __future__ import annotations

from celery_redislock.contrib import prometheus
from celery_redislock.integrations.rq import LockWorker

METRICS = prometheus.install()


class MetricsWorker(LockWorker):
    """RQ's forking worker with parent-side release, in a process with the metrics installed."""
