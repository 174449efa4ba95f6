"""The soak's brokers (``benchmarks/soak``): which one to use, and what is queued or
unacknowledged in it (kombu's Redis transport, or a throwaway ``rabbitmq-server``)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import redis

from .ledger import _text

BROKERS = ("rabbitmq", "redis")


class RedisBroker:
    """kombu's Redis transport on ``main``: its queue lists and its ``unacked`` hash."""

    name = "redis"
    QUEUES = ("soak", *(f"soak\x06\x16{p}" for p in (3, 6, 9)))  # kombu's priority steps

    def __init__(self, main: redis.Redis, url: str) -> None:
        self.main, self.url = main, url

    def describe(self, visibility_timeout: float) -> str:
        return f"Redis (main), visibility timeout {visibility_timeout:g} s"

    def backlog(self) -> int | None:
        """Messages queued or delivered but not acknowledged."""
        queued = sum(self.main.llen(q) for q in self.QUEUES)
        return queued + int(self.main.hlen("unacked"))

    def message_ids(self) -> set[str] | None:
        """Task ids of every message queued or unacknowledged."""
        raws = [raw for q in self.QUEUES for raw in self.main.lrange(q, 0, -1)]
        for raw in self.main.hvals("unacked"):
            with contextlib.suppress(ValueError, IndexError, TypeError):
                raws.append(json.dumps(json.loads(raw)[0]))  # [message, exchange, routing key]
        ids = set()
        for raw in raws:
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                ids.add(json.loads(raw)["headers"]["id"])
        return ids


class RabbitBroker:
    """A throwaway ``rabbitmq-server`` (``tests/rabbit.py``), read with ``rabbitmqctl``."""

    name = "rabbitmq"

    def __init__(self, server: Any) -> None:
        self.server, self.url = server, server.url

    def describe(self, visibility_timeout: float) -> str:
        version = "?"
        with contextlib.suppress(Exception):
            from kombu import Connection

            with Connection(self.url, connect_timeout=5) as conn:
                conn.connect()
                version = _text(conn.connection.server_properties.get("version", "?"))
        return f"RabbitMQ {version} (:{self.server.port})"

    def backlog(self) -> int | None:
        """Messages ready or delivered but not acknowledged in the soak's queue (None: unknown)."""
        ctl = Path(self.server.binary).with_name("rabbitmqctl")
        try:
            done = subprocess.run(
                [str(ctl), "-n", f"test{self.server.port}@localhost", "-q", "list_queues",
                 "name", "messages"],
                env={**os.environ, "HOME": str(self.server.dir)},  # its Erlang cookie
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return None
        for line in done.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "soak" and parts[1].isdigit():
                return int(parts[1])
        return None

    def message_ids(self) -> set[str] | None:
        return None  # RabbitMQ lists no message without taking it


def rabbit_binary() -> str:
    from rabbit import RabbitServer

    return RabbitServer.binary


def pick_broker(asked: str | None) -> tuple[str, str]:
    """The broker to soak with, and why."""
    binary = rabbit_binary()
    if asked is not None:
        return asked, "--broker"
    if os.path.exists(binary):
        return "rabbitmq", f"the default: {binary} is installed"
    return "redis", f"the default without RabbitMQ: {binary} is not installed"
