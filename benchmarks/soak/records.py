"""What the soak saw happen (``benchmarks/soak``): runs, kills, sends and publishes, as the
ledger noted them, and the result states that end a task."""

from __future__ import annotations

from dataclasses import dataclass

SKIPPED = "SKIPPED"
FINAL_STATES = ("SUCCESS", "FAILURE", "REVOKED", SKIPPED)


@dataclass(frozen=True)
class Run:
    """One run of a task body, as the ledger noted it (times: ledger µs)."""

    run_id: str
    task_id: str
    kind: str
    lock: str
    mode: str
    pid: int
    ppid: int
    worker: str
    start: int
    end: int | None


@dataclass(frozen=True)
class Kill:
    """A SIGKILL the chaos sent: ``before``/``after`` are ledger µs read around the kill."""

    kind: str  # "child": one pool child; "worker": the worker's whole process group
    worker: str
    group: int  # the worker's main pid (its process group)
    pids: tuple[int, ...]
    before: int
    after: int
    # Redis broker, whole worker: when Redis dropped the dead worker's blocked BRPOP (µs; a
    # message pushed before then went to that dead connection); None: not measured.
    brpop_gone: int | None = None

    def hits(self, run: Run) -> bool:
        if run.pid in self.pids:
            return True
        # A child forked after the group's pids were listed died with its group too.
        return self.kind == "worker" and run.ppid == self.group


@dataclass(frozen=True)
class Sent:
    task_id: str
    kind: str
    lock: str
    at: int = 0  # when it was published, µs of this host's clock (the ledger's too: one host)


@dataclass(frozen=True)
class Publish:
    """A message published for a task (the producer's, or a worker's retry or re-publish): it
    went out between ``before`` and ``after`` (µs, this host's clock, the ledger's too)."""

    task_id: str
    before: int
    after: int
    pid: int = 0
    host: str = ""


def _seconds(us: int) -> float:
    return round(us / 1e6, 6)
