"""Child processes of the demos, the examples and the soak benchmark, stopped however the
parent ends (Ctrl-C and SIGTERM too).

``Children`` runs commands (Celery workers, beat, a producer), each in a process group of its
own, so that a worker and its pool processes are stopped together: a warm shutdown first, then
SIGKILL. ``signals_blocked`` is the same guard for processes forked by ``multiprocessing`` (the
lock-core demo's workers).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType

__all__ = [
    "ROOT",
    "STOP_SIGNALS",
    "Children",
    "demos_importable",
    "signals_blocked",
    "sigterm_as_interrupt",
    "unblock_stop_signals",
]

ROOT = Path(__file__).resolve().parents[2]  # the checkout: demos/ is not installed
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


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


def demos_importable(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the checkout first on PYTHONPATH, so that a child started in any directory
    (``celery -A demos.celery.app worker``) can import ``demos``."""
    paths = [str(ROOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


class Children:
    """Subprocesses, each in a process group of its own; :meth:`stop` ends every one of them and
    whatever they forked."""

    def __init__(
        self, log_dir: Path, cwd: Path | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        self.log_dir, self.cwd = log_dir, cwd
        self.env = dict(env) if env is not None else None
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

    def start_workers(self, commands: Mapping[str, Sequence[str]], timeout: float = 60) -> None:
        """Starts every worker (label -> command), then waits until each one is ready."""
        for label, command in commands.items():
            self.start(label, command)
        self.wait_ready(list(commands), timeout)

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
    previous = {
        signum: signal.signal(signum, lambda s, _: caught.append(s)) for signum in STOP_SIGNALS
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if caught:
            signal.raise_signal(caught[0])  # now, through the handler it was held back from


@contextlib.contextmanager
def signals_blocked() -> Iterator[None]:
    """Blocks SIGINT and SIGTERM while ``multiprocessing`` forks a child: Python drops an
    exception raised while it forks (in an at-fork callback), so a Ctrl-C then would be lost.
    A blocked mask, not handlers (as for ``Children``): the forked child inherits it, and a
    signal sent to it before it is set up waits until it calls :func:`unblock_stop_signals`."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def unblock_stop_signals() -> None:
    """In a child forked under :func:`signals_blocked`, once its own handlers are in place."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    # start_new_session made the child's pid its group id. ProcessLookupError: the group is gone.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signum)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def sigterm_as_interrupt() -> None:
    """A demo's SIGTERM unwinds like a Ctrl-C: through the blocks that stop its children."""
    signal.signal(signal.SIGTERM, _interrupted)
