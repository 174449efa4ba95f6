"""``beatleader`` on django-celery-beat's ``DatabaseScheduler`` (its entries in a SQLite file,
``BEAT_DB``, shared by the beats of a test): the entries of ``beat_schedule`` are written to
the database as each beat starts, and read from it."""

from __future__ import annotations

import os

import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django_celery_beat"],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ["BEAT_DB"],
            "OPTIONS": {"timeout": 30},  # (beats write the same file as they start)
        }
    },
    USE_TZ=True,
    TIME_ZONE="UTC",
)
django.setup()

from beatleader import app  # noqa: E402

app.conf.redislock_beat_scheduler = "django_celery_beat.schedulers:DatabaseScheduler"

__all__ = ["app"]
