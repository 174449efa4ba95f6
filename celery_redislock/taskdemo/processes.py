"""Child processes for the demo and the examples: each in a process group of its own, so that
a worker and its pool processes are stopped together, however the parent ends (Ctrl-C too)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["Children"]


def _local(command: Sequence[str]) -> list[str]:
    """The command with ``python`` and ``celery`` of this interpreter's environment: a
    virtualenv's python may run the example without that virtualenv on PATH."""
    head, *rest = command
    if head == "python":
        return [sys.executable, *rest]
    if head == "celery":
        script = Path(sys.executable).with_name("celery")
        return [str(script), *rest] if script.exists() else [sys.executable, "-m", "celery", *rest]
    return [head, *rest]


class Children:
    """Subprocesses started in ``examples/``, each in a process group of its own; :meth:`stop`
    ends every one of them and whatever they forked."""

    def __init__(
        self, log_dir: Path, cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.log_dir, self.cwd, self.env = log_dir, cwd, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, label: str, command: Sequence[str], *, log: bool = True) -> None:
        """Starts ``command``; its output goes to ``<label>.log``, or to our own stdout."""
        with contextlib.ExitStack() as stack:
            out = stack.enter_context(open(self.log_path(label), "ab")) if log else None
            stack.enter_context(_interrupts_held())
            self.procs[label] = subprocess.Popen(
                _local(command),
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT if log else None,
                env=self.env,
                start_new_session=True,
            )

    def log_path(self, label: str) -> Path:
        return self.log_dir / f"{label}.log"

    def log(self, label: str) -> str:
        path = self.log_path(label)
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_ready(self, labels: Sequence[str], timeout: float = 60) -> None:
        """Blocks until each worker logged `` ready.``; raises if one died or took too long."""
        deadline = time.monotonic() + timeout
        for label in labels:
            while " ready." not in self.log(label):
                if self.procs[label].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{label} did not start:\n{self.log(label)[-3000:]}")
                time.sleep(0.05)

    def wait(self, label: str, timeout: float) -> int:
        return self.procs[label].wait(timeout)

    def stop(self, grace: float = 10) -> None:
        """SIGTERM to each group, last started first (producer, beat, then the workers, whose
        warm shutdown lets running tasks finish); SIGKILL to whatever is left after ``grace``
        seconds, also when a second Ctrl-C cuts the wait short."""
        procs = list(reversed(self.procs.values()))
        try:
            for proc in procs:
                _signal_group(proc, signal.SIGTERM)
            deadline = time.monotonic() + grace
            for proc in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(0.1, deadline - time.monotonic()))
        finally:
            for proc in procs:
                _signal_group(proc, signal.SIGKILL)  # also pool children that outlived theirs
                proc.wait()
            self.procs.clear()


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Holds back SIGINT and SIGTERM until the block is done: one between the fork and the
    bookkeeping would leave a child that nobody stops. Python handlers, not a blocked signal
    mask: exec keeps the mask, and the child would never see SIGTERM."""
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.signal(signum, lambda s, _: caught.append(s)) for signum in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if caught:
            signal.raise_signal(caught[0])  # now, through the handler it was held back from


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    # start_new_session made the child's pid its group id. ProcessLookupError: the group is gone.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signum)
