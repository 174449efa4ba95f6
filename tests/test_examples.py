"""The examples run as a user would run them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from celery_redislock.server import RedisServer

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_lock_basics(redis_server: RedisServer) -> None:
    env = {**os.environ, "REDIS_URL": redis_server.url}
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "lock_basics.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "stripe-api: 3 of 3 slots taken" in out
    assert "sync:42: re-entered, count 2" in out
    assert "sync:42: free again: True" in out
