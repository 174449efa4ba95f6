"""The timeline picture: every run, per use case and key, coloured by worker process, so a
reader can check by eye that no forbidden overlap happened. Needs matplotlib (the ``demo``
extra); without it the demo says so and goes on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from .runs import TaskRun


def lanes(runs: Sequence[TaskRun], now: float) -> list[tuple[int, TaskRun]]:
    """Places runs of one key on lanes so that runs on one lane never overlap: a key allowed
    N at once needs N lanes, and more lanes would mean more than N ran together."""
    ends: list[float] = []
    placed = []
    for run in sorted(runs, key=lambda r: r.start):
        lane = next((i for i, end in enumerate(ends) if end <= run.start), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = run.until(now)
        placed.append((lane, run))
    return placed


def draw(
    runs: Sequence[TaskRun], cases: Sequence[str], path: Path, killed_at: Mapping[str, float]
) -> bool:
    """Writes the PNG (``killed_at``: use case -> when its run was killed); returns False if
    matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
    except ImportError:
        return False
    shown = [c for c in cases if any(r.case == c for r in runs)]
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, 2.2 * len(shown)), squeeze=False)
    workers = sorted({r.process for r in runs if r.case in shown})
    colours = {w: plt.get_cmap("tab10")(i % 10) for i, w in enumerate(workers)}
    for ax, case in zip(axes[:, 0], shown, strict=True):
        mine = [r for r in runs if r.case == case]
        origin = min(r.start for r in mine)
        # A run killed midway ends at the kill; the picture ends with the last run.
        now = killed_at.get(case, max(r.until(r.start) for r in mine))
        ticks, labels, row = [], [], 0
        for key in sorted({r.key for r in mine}):
            placed = lanes([r for r in mine if r.key == key], now)
            for lane, run in placed:
                end = run.until(now)
                ax.barh(
                    row + lane,
                    end - run.start,
                    left=run.start - origin,
                    color=colours[run.process],
                    edgecolor="red" if run.end is None else "black",
                    hatch="//" if run.end is None else None,
                    height=0.8,
                )
            used = max(lane for lane, _ in placed) + 1
            ticks.append(row + (used - 1) / 2)
            labels.append(f"{key} ({used} lane{'s' if used > 1 else ''})")
            row += used
        ax.set_yticks(ticks, labels, fontsize=8)
        ax.set_title(case, fontsize=10, loc="left")
        ax.set_xlabel("seconds", fontsize=8)
        ax.invert_yaxis()
    handles = [Rectangle((0, 0), 1, 1, color=colours[w]) for w in workers]
    fig.legend(handles, workers, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.suptitle("celery-redislock demo: every run, per key (hatched: killed mid-run)")
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
