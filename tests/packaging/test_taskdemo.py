"""The Celery demo, run as a user runs it: ``python -m demos.celery --quick``.

Assertions are on its JSON summary and on processes; the printed summary only against the
sample in docs/examples.md, numbers aside (the docs show what the demo prints, use cases,
notes and verdicts alike: ``python -m demos.celery --write-docs`` writes them again).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import alive, processes, wait_for
from PIL import Image

from celery_redislock.contrib.redis_server import RedisServer

DEMO = [sys.executable, "-m", "demos.celery", "--quick"]
ROOT = Path(__file__).resolve().parents[2]  # demos/ is in the checkout, not installed
SAMPLE_PAGE, SAMPLE_PNG = ROOT / "docs" / "examples.md", ROOT / "docs" / "demo-timeline.png"
BEGIN = "<!-- demo output: written by python -m demos.celery --write-docs -->"
END = "<!-- end of demo output -->"


def _env(redis_url: str) -> dict[str, str]:
    """The demo runs in a temporary directory, to leave nothing in the checkout: the checkout,
    where ``demos`` is, goes on PYTHONPATH."""
    path = [str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {**os.environ, "REDIS_URL": redis_url, "PYTHONPATH": os.pathsep.join(path)}


@pytest.fixture
def demo_redis() -> Iterator[RedisServer]:
    """One Redis version is enough here: the lock core runs on each elsewhere."""
    with RedisServer() as server:
        yield server


def _printed_summary(stdout: str) -> list[str]:
    """The summary the demo printed: from the table's head to the blank line after the notes."""
    lines = stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("  use case "))
    return lines[first : lines.index("", first)]


def _sample() -> list[str]:
    """The summary in docs/examples.md: the ``text`` block between the markers."""
    page = SAMPLE_PAGE.read_text()
    found = re.findall(re.escape(BEGIN) + r"\s*```text\n(.*?)\n```\s*" + re.escape(END), page,
                       re.DOTALL)  # fmt: skip
    assert len(found) == 1, f"{SAMPLE_PAGE}: one text block between {BEGIN!r} and {END!r}"
    return str(found[0]).split("\n")


def _shape(lines: Sequence[str]) -> list[str]:
    """The lines with every number masked and spaces squeezed (column widths follow the
    numbers): what stays is the use cases, their order, the notes' names and the verdicts."""
    return [" ".join(re.sub(r"\d+(\.\d+)?", "#", line).split()) for line in lines]


FIGURES = ("sent", "queued", "ran", "skipped", "retried", "max_together", "allowed", "fences")
ROW = re.compile(r"  (\S+)" + r"\s+(\d+)" * 6 + r" \((\d+)\)\s+(\d+)  (.*)")


def _table(summary: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The printed summary's table: use case -> its figures, under the JSON summary's names."""
    rows = [ROW.fullmatch(line) for line in summary[1:]]
    return {
        m[1]: {**dict(zip(FIGURES, map(int, m.groups()[1:-1]), strict=True)), "verdict": m[10]}
        for m in rows
        if m is not None
    }


def _check_figures(cases: Mapping[str, Mapping[str, Any]]) -> None:
    """What every run's figures show (this run's, and the docs' sample's)."""
    assert set(cases) == {
        *("singleton", "per-customer", "cap", "read-write", "line", "recovery"),
        *("rq-singleton", "rq-cap", "rq-recovery"),
    }
    singleton = cases["singleton"]
    assert singleton["queued"] == 1 and singleton["ran"] == 1 and singleton["sent"] > 1
    assert cases["per-customer"]["max_together"] == 1
    assert cases["cap"]["max_together"] == cases["cap"]["allowed"] == 3
    assert cases["cap"]["retried"] == 0  # the cap drains through its task line
    line = cases["line"]
    assert line["ran"] == line["sent"] and line["max_together"] == 1 and line["retried"] == 0
    rq_singleton = cases["rq-singleton"]
    assert rq_singleton["queued"] == 1 and rq_singleton["ran"] == 1 and rq_singleton["sent"] > 1
    assert cases["rq-cap"]["max_together"] == cases["rq-cap"]["allowed"] == 3
    assert cases["rq-cap"]["ran"] == cases["rq-cap"]["sent"]
    assert cases["rq-recovery"]["ran"] == 2
    for case in cases.values():
        assert case["fences"] == case["ran"]


def _png_description(path: Path) -> str:
    with Image.open(path) as image:
        return str(image.info.get("Description", ""))


def _demo_processes(redis_url: str) -> list[int]:
    """Pids of live demo workers and RQ work horses (their command line names the demo's app,
    or an RQ demo worker: ``rqdemo<n>-<pid>``) of the demo run on ``redis_url``: other tests
    running beside this one start demos too, each on a Redis of its own."""
    return [
        p.pid
        for p in processes()
        if (b"demos.celery.app" in p.cmdline or b"\0rqdemo" in p.cmdline)
        and _environ_has(p.pid, f"REDIS_URL={redis_url}")
        and alive(p.pid)
    ]


def _environ_has(pid: int, entry: str) -> bool:
    try:
        return entry.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone meanwhile
        return False


@pytest.mark.slow
def test_demo_runs_end_to_end(
    demo_redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary_path, png = tmp_path / "summary.json", tmp_path / "timeline.png"
    done = subprocess.run(
        [*DEMO, "--json", str(summary_path), "--png", str(png)],
        env=_env(demo_redis.url),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    summary: dict[str, Any] = json.loads(summary_path.read_text())
    cases = summary["cases"]
    _check_figures(cases)
    assert all(case["passed"] for case in cases.values())
    singleton, line, rq_singleton = cases["singleton"], cases["line"], cases["rq-singleton"]
    assert cases["per-customer"]["notes"]["customers in progress at once (max)"] > 1
    assert line["notes"]["waited in line"] > 0
    assert cases["read-write"]["notes"]["reader beside a writer"] == 0
    assert cases["read-write"]["notes"]["readers at once (max)"] > 1
    assert 0 < cases["recovery"]["notes"]["recovery seconds"] < 5
    # Well within the lease's ttl (10 s): the dead horse's worker released it.
    assert 0 < cases["rq-recovery"]["notes"]["recovery seconds"] < 5
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    # The picture shows every run, and what the locks kept from running, as the summary counts.
    drawn = summary["drawn"]
    assert set(drawn) == set(cases)
    for name, case in cases.items():
        assert drawn[name]["runs"] == case["ran"], name
        assert drawn[name].get("retry", 0) == case["retried"], name
    assert drawn["singleton"]["refused"] == singleton["notes"]["not published (duplicates)"]
    assert drawn["rq-singleton"]["refused"] == rq_singleton["notes"]["not enqueued (duplicates)"]
    assert drawn["line"]["parked"] == line["notes"]["waited in line"]
    # What it printed is what the docs show (numbers aside, but the sample's hold as this
    # run's do), and the picture beside it comes from the same run as the sample: else
    # `python -m demos.celery --write-docs`.
    printed = _printed_summary(done.stdout)
    monkeypatch.syspath_prepend(str(ROOT))
    from demos.celery.cli import legend_lines

    out = done.stdout.splitlines()
    end = out.index(printed[0]) + len(printed)  # the blank line after the summary
    assert out[end + 1 : end + 1 + len(legend_lines())] == legend_lines()
    assert _png_description(png) == "\n".join(printed)
    assert _table(printed) == {
        name: {**{k: case[k] for k in FIGURES}, "verdict": "ok"} for name, case in cases.items()
    }
    assert _shape(printed) == _shape(_sample()), (
        "docs/examples.md's demo output is not what the demo prints: "
        "python -m demos.celery --write-docs"
    )
    _check_figures(_table(_sample()))
    assert _png_description(SAMPLE_PNG) == "\n".join(_sample()), (
        "docs/demo-timeline.png is not from the run that wrote the sample: "
        "python -m demos.celery --write-docs"
    )
    assert _demo_processes(demo_redis.url) == []


def test_docs_are_written_between_the_markers_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--write-docs`` replaces the block between the markers and nothing else, and refuses a
    page without them, or with them twice."""
    monkeypatch.syspath_prepend(str(ROOT))
    from demos.celery.cli import write_sample

    page = tmp_path / "page.md"
    page.write_text(f"# Before\n\n{BEGIN}\n\nold\n\n{END}\n\nAfter.\n")
    write_sample(page, ["  a 1", "  b: 2"])
    assert page.read_text() == (
        f"# Before\n\n{BEGIN}\n\n```text\n  a 1\n  b: 2\n```\n\n{END}\n\nAfter.\n"
    )
    page.write_text(f"{BEGIN}\n{END}\n{BEGIN}\n{END}\n")
    with pytest.raises(ValueError, match="markers"):
        write_sample(page, ["x"])
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="markers"):
        write_sample(page, ["x"])
    assert page.read_text() == "no markers\n"


def test_write_docs_needs_the_full_demo() -> None:
    done = subprocess.run(
        [*DEMO, "--write-docs"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "not with --quick" in done.stderr, done.stderr


@pytest.mark.parametrize("during", ["- per-customer", "- rq-recovery"])
@pytest.mark.faults
@pytest.mark.slow
def test_ctrl_c_stops_every_worker(demo_redis: RedisServer, tmp_path: Path, during: str) -> None:
    """During the Celery part, and during the RQ part (a work horse, in a process group of its
    own, runs a long import then)."""
    log = tmp_path / "out.log"
    with open(log, "wb") as out:
        demo = subprocess.Popen(
            DEMO, env=_env(demo_redis.url), stdout=out, stderr=out, cwd=tmp_path,
        )  # fmt: skip
    try:
        wait_for(lambda: during in log.read_text(), "the workers run tasks", 120)
        assert _demo_processes(demo_redis.url), "the workers are running"
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=30) == 130
    finally:
        demo.kill()
    wait_for(lambda: _demo_processes(demo_redis.url) == [], "every worker process is gone", 10)


@pytest.mark.slow  # about 3 s on 2 quiet cores
@pytest.mark.faults
def test_workers_hear_their_own_sigterm(
    demo_redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Signals held back while a worker starts must not stay blocked in the worker itself."""
    import signal as signals

    monkeypatch.syspath_prepend(str(ROOT))
    from demos.celery.workers import start_workers

    workers = start_workers(demo_redis.url, tmp_path, ["solo"], concurrency=1)
    try:
        proc = workers.procs["solo"]
        status = Path(f"/proc/{proc.pid}/status").read_text()
        blocked = int(
            next(ln for ln in status.splitlines() if ln.startswith("SigBlk:")).split()[1], 16
        )
        assert not blocked & (1 << (signals.SIGTERM - 1) | 1 << (signals.SIGINT - 1))
        proc.send_signal(signals.SIGTERM)
        assert proc.wait(timeout=30) == 0, "a warm shutdown, not a kill"
    finally:
        workers.stop()


def test_the_legend_explains_every_column_here_and_in_the_docs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The demo prints a line per column of its table saying what it counts, and
    docs/examples.md gives the same words, column by column."""
    monkeypatch.syspath_prepend(str(ROOT))
    from demos.celery.cli import LEGEND, legend_lines, summary_lines

    columns = ["use case", *(column for column, _ in LEGEND)]
    assert summary_lines([])[0].split() == " ".join(columns).split()  # each, in order
    assert legend_lines() == [f"  {column}: {meaning}" for column, meaning in LEGEND]
    page = SAMPLE_PAGE.read_text()
    for column, meaning in LEGEND:
        assert f"| `{column}` | {meaning} |" in page, column
