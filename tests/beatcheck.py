"""Real beats of ``beatleader`` (:class:`Beat`), and what the leader-beat tests and
``benchmarks/beat_failover.py`` read back: the messages beats
sent to a Redis broker that no worker reads (each names its tick in the ``redislock_beat``
header), the ticks' marks, and each entry's chain of ticks: every message's tick follows the
run the message before it recorded (or one a new leader skipped), none twice."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from celery_redislock.core.beat_leader import leader_of

TESTS = Path(__file__).parent


@dataclass(frozen=True, slots=True)
class Sent:
    """One message a beat sent: its entry, the run its tick follows, its own run, its due time
    (µs since the epoch)."""

    entry: str
    after: int
    run: int
    due: int | None


def sent(client: redis.Redis, queue: str = "celery") -> list[Sent]:
    """Every message in ``queue`` (kombu's Redis list), oldest run first."""
    found = []
    for raw in client.lrange(queue, 0, -1):
        tick = json.loads(raw)["headers"]["redislock_beat"]
        found.append(Sent(tick["entry"], tick["after"], tick["run"], tick.get("due")))
    return sorted(found, key=lambda s: s.run)


def skips(client: redis.Redis, namespace: str = "redislock") -> dict[tuple[str, int], int]:
    """The ticks a new leader skipped: (entry, the run it followed) -> the run it recorded."""
    found = {}
    for key in client.scan_iter(match=f"{namespace}:{{beat:*}}:tick:*"):
        value = client.get(key)
        if value is not None and value.startswith(b"skip:"):
            entry, after = key.decode().split("}:tick:", 1)[1].rsplit(":", 1)
            found[(entry, int(after))] = int(value[5:])
    return found


@dataclass
class Chain:
    """One entry's ticks as sent: the messages, the ticks sent twice, the links broken (a
    message whose tick follows no run recorded before it: a tick lost), and the skipped ticks
    the chain went through."""

    entry: str
    messages: list[Sent]
    doubled: list[int] = field(default_factory=list)
    broken: list[tuple[int, int]] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)

    @property
    def late(self) -> list[float]:
        """Each message's lateness (s): from its due time to its run."""
        return [(m.run - m.due) / 1e6 for m in self.messages if m.due is not None]


def chains(messages: Iterable[Sent], skipped: dict[tuple[str, int], int]) -> dict[str, Chain]:
    """Each entry's chain."""
    by_entry: dict[str, list[Sent]] = {}
    for m in messages:
        by_entry.setdefault(m.entry, []).append(m)
    found = {}
    for entry, ms in by_entry.items():
        chain = Chain(entry, ms)
        afters = [m.after for m in ms]
        chain.doubled = sorted({a for a in afters if afters.count(a) > 1})
        for before, after in itertools.pairwise(ms):
            link = before.run
            while (entry, link) in skipped:  # a new leader skipped that tick
                chain.skipped.append(link)
                link = skipped[(entry, link)]
            if after.after != link:
                chain.broken.append((link, after.after))
        found[entry] = chain
    return found


class Beat:
    """``celery -A beatleader beat`` (or ``worker --beat``, which runs beat in a child process)
    as a subprocess in its own process group, its log in a file, its schedule file its own."""

    def __init__(
        self,
        url: str,
        log_dir: Path,
        name: str,
        env: dict[str, str] | None = None,
        app: str = "beatleader",
    ) -> None:
        self.name, self.app = name, app
        self.log_path = log_dir / f"beat-{name}.log"
        self.schedule = log_dir / f"schedule-{name}"
        self.env = {
            **os.environ,
            "BEAT_REDIS_URL": url,
            "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
            **(env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, worker: bool = False) -> Beat:
        command = [sys.executable, "-m", "celery", "-A", self.app]
        if worker:
            # A queue nobody sends to: the messages stay in "celery" to be counted.
            command += ["worker", "--beat", "-P", "solo", "-Q", "unused", "-n", f"{self.name}@%h",
                        "--without-heartbeat", "--without-gossip", "--without-mingle"]  # fmt: skip
        else:
            command += ["beat"]
        command += ["-l", "info", "-s", str(self.schedule)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.log_path.parent,
                start_new_session=True,
            )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def pids(self) -> set[int]:
        """Its process and every process of its group (an embedded beat's too)."""
        found = {self.pid}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getpgid(int(entry.name)) == self.pid:
                        found.add(int(entry.name))
                except OSError:
                    pass
        return found

    def signal(self, signum: int) -> None:
        """``signum`` to the whole process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signum)

    def kill(self) -> None:
        if self.proc is not None:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM (beat gives the lead back as it stops), then SIGKILL if it takes longer."""
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGCONT)  # (a test may have stopped it)
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self.kill()


def leader_pid(client: redis.Redis, name: str = "beatleader") -> int | None:
    """The pid the fleet's leader lease names, if a beat leads."""
    leader = leader_of(client, name)
    return None if leader is None or leader.pid is None else int(leader.pid)
