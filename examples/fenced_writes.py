"""A writer that pauses past its lease, and a store that refuses its late write by its fence.

Both writes are runs of ``post_balance``, which holds ``ledger`` while it works. Writer A stalls
for 2.5 s before writing (a long GC pause, a frozen VM). Its lease lasts 1 s unless renewed, and
``max_hold=0.5`` stops the renewal after half a second, as a frozen process would stop renewing:
the lease lapses while A still means to write. Writer B, waiting for the lock, takes it then and
writes. When A wakes it writes too, with the fence of its lapsed lease. The store, an SQLite
table, keeps the fence of the last write it accepted and takes a write only with a greater one
(``UPDATE ... WHERE fence < :fence``), so A's late write is rejected and B's balance stands.

Run: python examples/fenced_writes.py           (REDIS_URL, else a throwaway redis-server;
                                                 starts two workers)
     python examples/fenced_writes.py produce   (only the producer, against running workers on
                                                 this machine: they share the SQLite file)
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _runner import example_app, main, worker_command

NAME = "fenced_writes"
LEDGER = Path(os.environ.get("LEDGER_DB", Path(tempfile.gettempdir()) / f"{NAME}.sqlite"))
STALL_SECONDS = 2.5
WORKERS = [worker_command(NAME, "w1"), worker_command(NAME, "w2")]

app, r = example_app(NAME)


@contextmanager
def store() -> Iterator[sqlite3.Connection]:
    """The store, shared by the workers' processes: one transaction, committed at the end."""
    db = sqlite3.connect(LEDGER, timeout=10)
    try:
        with db:
            yield db
    finally:
        db.close()


def create_ledger() -> None:
    """One account; ``fence`` is the fence of the last write the store accepted."""
    with store() as db:
        db.execute("DROP TABLE IF EXISTS ledger")
        db.execute(
            "CREATE TABLE ledger"
            " (id INTEGER PRIMARY KEY, balance INTEGER, writer TEXT, fence INTEGER)"
        )
        db.execute("INSERT INTO ledger VALUES (1, 0, 'nobody', 0)")


def write_balance(balance: int, writer: str, fence: int) -> bool:
    """Writes unless the store has seen this fence or a newer one; True if it was taken."""
    with store() as db:
        taken = db.execute(
            "UPDATE ledger SET balance = :balance, writer = :writer, fence = :fence"
            " WHERE id = 1 AND fence < :fence",
            {"balance": balance, "writer": writer, "fence": fence},
        ).rowcount
    return taken == 1


@app.task(
    bind=True,
    lock={"key": "ledger", "ttl": 1, "max_hold": 0.5, "on_conflict": "wait", "timeout": 10},
)
def post_balance(self: Any, writer: str, balance: int, stall: float = 0.0) -> dict[str, Any]:
    """Computes the new balance, stalls ``stall`` seconds, then writes it with its fence.

    It does not call ``self.lease.check()`` before writing: a stalled process gets no say in
    when it wakes, and a check just before the write could pass and the lease lapse right
    after. The fence is what makes the late write harmless.
    """
    took, fence = time.time(), self.lease.fence
    r.set(f"{NAME}:holding", writer)
    time.sleep(stall)
    accepted = write_balance(balance, writer, fence)
    return {"writer": writer, "fence": fence, "took": took, "accepted": accepted, "at": time.time()}


def produce() -> bool:
    """Writer A, then writer B once A holds the ledger; prints which writes the store took."""
    create_ledger()
    r.delete(f"{NAME}:holding")
    first = post_balance.delay("A", 100, STALL_SECONDS)
    deadline = time.monotonic() + 20
    while r.get(f"{NAME}:holding") != "A":
        if time.monotonic() > deadline:
            print("writer A never took the ledger")
            return False
        time.sleep(0.02)
    second = post_balance.delay("B", 250)
    late, newer = first.get(timeout=20), second.get(timeout=20)
    print(f"A took the ledger: fence {late['fence']}, then stalled {STALL_SECONDS} s")
    print(f"B took the ledger {newer['took'] - late['took']:.1f} s later: fence {newer['fence']}")
    for w in sorted((late, newer), key=lambda w: w["at"]):
        verdict = "accepted" if w["accepted"] else "rejected"
        print(f"write {w['writer']} (fence {w['fence']}): {verdict}")
    with store() as db:
        balance, writer, fence = db.execute(
            "SELECT balance, writer, fence FROM ledger WHERE id = 1"
        ).fetchone()
    print(f"stored: balance {balance} by {writer}, fence {fence}")
    held = not late["accepted"] and newer["accepted"] and late["at"] > newer["at"]
    held = held and fence == newer["fence"] > late["fence"] and writer == "B"
    print("invariant: " + ("held" if held else "BROKEN"))
    return held


if __name__ == "__main__":
    main(NAME, produce, WORKERS)
