"""The ``redislock`` console script: see and free locks and unique claims on a Redis given by
flags or the environment, for RQ and bare-core users (Celery users have ``celery -A proj
redislock``, which reads the app's settings).

    redislock --url redis://localhost:6379/0 list 'sync:*'
    REDISLOCK_URL=redis://cache:6379/2 redislock show sync:42 --json

It needs click (the ``cli`` extra; Celery and RQ bring it too).
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Runs the console script, ending the process with its exit code (see :mod:`.commands`)."""
    try:
        from .script import redislock
    except ModuleNotFoundError as exc:
        if exc.name != "click":
            raise
        print(
            "Error: the redislock command needs click: pip install 'celery-redislock[cli]'",
            file=sys.stderr,
        )
        sys.exit(2)
    redislock.main(args=argv, prog_name="redislock")
