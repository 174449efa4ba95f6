"""The soak's workers (``benchmarks/soak``): ``celery -A soak.soakapp worker`` processes, run
from ``benchmarks/``, each start of one with a log of its own."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

# benchmarks/: the workers run here, with it on PYTHONPATH (they import soak.soakapp)
HERE = Path(__file__).resolve().parents[1]
# The checkout, for demos._common.processes (not installed). Appended: an installed
# celery_redislock stays the one imported.
if str(HERE.parent) not in sys.path:
    sys.path.append(str(HERE.parent))

WORKERS = ("w1", "w2")
CONCURRENCY = 2
READY_TIMEOUT_S = 60


class Fleet:
    """The soak's workers by name; each start of one is an incarnation with a log of its own
    (``w1.0.log``, ``w1.1.log``, ...), in a process group of its own."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        from demos._common.processes import Children

        self.log_dir = log_dir
        self.children = Children(log_dir, cwd=HERE, env=env)
        self.current: dict[str, str] = {}
        self.incarnations: Counter[str] = Counter()

    @staticmethod
    def command(name: str) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "soak.soakapp", "worker", "-P", "prefork",
            "-c", str(CONCURRENCY), "-n", f"{name}@%h", "-Q", "soak", "-l", "info",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip

    def start(self, name: str) -> None:
        label = f"{name}.{self.incarnations[name]}"
        self.incarnations[name] += 1
        self.children.start(label, self.command(name))
        self.current[name] = label

    def proc(self, name: str) -> subprocess.Popen[bytes]:
        return self.children.procs[self.current[name]]

    def ready(self, name: str) -> bool:
        label = self.current[name]
        return self.proc(name).poll() is None and " ready." in self.children.log(label)

    def wait_ready(self, names: Sequence[str], timeout: float = READY_TIMEOUT_S) -> None:
        self.children.wait_ready([self.current[n] for n in names], timeout)

    def pool(self, name: str) -> list[int]:
        from workers import children_of

        return children_of(self.proc(name).pid)

    def logs(self) -> list[Path]:
        return sorted(self.log_dir.glob("w*.log"))

    def stop(self, grace: float = 10) -> None:
        self.children.stop(grace)
