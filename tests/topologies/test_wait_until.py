"""The topology tests' wait (tests/topologies.py): a wait that sees progress goes on past its
timeout; one that sees none times out, saying what it saw last."""

from __future__ import annotations

import itertools

import pytest
import topologies
from topologies import PROGRESS_EVERY_S, wait_until


@pytest.fixture(autouse=True)
def idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timeouts as on an idle machine, whatever the load now: the same wait in every run."""
    monkeypatch.setattr(topologies, "load_factor", lambda: 1.0)


def test_a_wait_goes_on_while_what_it_sees_keeps_changing() -> None:
    looks = itertools.count()
    seen: list[int] = []

    def progress() -> int:
        seen.append(next(looks))
        return seen[-1]

    # Done only after 6 looks at the progress, 2.5 s at least: past the timeout of 1 s, which
    # holds the wait only while nothing changes.
    wait_until(lambda: len(seen) > 5, "six looks", 1, progress=progress, cap=60)
    assert len(seen) > 5


def test_a_wait_that_sees_no_change_times_out_naming_what_it_saw() -> None:
    with pytest.raises(TimeoutError, match=r"waiting until never .*last seen: the same"):
        wait_until(lambda: False, "never", PROGRESS_EVERY_S / 2, progress=lambda: "the same")


def test_a_wait_that_keeps_changing_stops_at_its_cap() -> None:
    looks = itertools.count()
    with pytest.raises(TimeoutError, match=r"waiting until never .*last seen: \d+"):
        wait_until(lambda: False, "never", 60, progress=lambda: next(looks), cap=1)
