"""A throwaway RabbitMQ broker for the test that runs Celery over AMQP (Debian's package)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from helpers import free_port


class RabbitServer:
    """``rabbitmq-server`` on free ports with all its state in a temporary folder."""

    # The package's own script, not the /usr/sbin wrapper: that one switches user in a new
    # session, out of reach of our process group.
    binary = "/usr/lib/rabbitmq/bin/rabbitmq-server"

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="rabbit-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def start(self, timeout: float = 60) -> RabbitServer:
        for sub in ("mnesia", "log"):
            (self.dir / sub).mkdir()
        (self.dir / "plugins").write_text("[].\n")
        env = {
            **os.environ,
            "HOME": str(self.dir),
            "RABBITMQ_NODENAME": f"test{self.port}@localhost",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "plugins"),
            "RABBITMQ_FEATURE_FLAGS_FILE": str(self.dir / "feature_flags"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "none"),
        }
        with open(self.dir / "server.log", "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log_text = (self.dir / "server.log").read_text(errors="replace")
                    self.stop()
                    raise AssertionError(f"rabbitmq-server did not start:\n{log_text}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            for signum in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, signum)
                    self.proc.wait(10)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RabbitServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
