"""The timeline picture: every run, per use case and key, coloured by worker process, so a
reader can check by eye that no forbidden overlap happened; and, beside the runs, what the
locks kept from running: duplicates refused as they were published, calls that waited for the
lock (parked in its task line, or in a worker), retries and skips. Needs matplotlib (the
``demo`` extra); without it the demo says so and goes on.

:func:`panels` works out what to draw (and :meth:`Panel.counts` how many of each), :func:`draw`
draws it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._common.runs import Event
from .runs import TaskRun

__all__ = ["KINDS", "MIN_WAIT", "Panel", "Row", "draw", "lanes", "panels"]

MIN_WAIT = 0.01
"""Seconds: a wait in a worker shorter than this, with every slot of its key taken, is not
drawn (a task parked in the task line is, however short its wait)."""

KINDS = {
    "refused": "duplicate refused (not queued)",
    "retry": "lock held: retried later",
    "skipped": "lock held: not run",
    "parked": "parked in the task line (no worker slot)",
    "waited": "waited for the lock in a worker",
}
"""What a mark shows, as the legend says it."""

_ACTIONS = {
    "existing": "refused",
    "raise": "refused",
    "retry": "retry",
    "await": "retry",
    "rate": "retry",
    "skip": "skipped",
    "superseded": "skipped",
    "drop": "skipped",
    "wait": "skipped",
    "expired": "skipped",
    "full": "skipped",
}
"""A ``lock_conflict`` action -> the mark it makes (``queue`` makes a parked wait, drawn with
the lease taken at its end)."""


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


def _pack(spans: Sequence[tuple[float, float]]) -> list[int]:
    """The lane of each span (in the order given), as :func:`lanes` places runs."""
    ends: list[float] = []
    out = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: spans[i][0]):
        start, end = spans[i]
        lane = next((k for k, e in enumerate(ends) if e <= start), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = end
        out[i] = lane
    return out


@dataclass
class Row:
    """One key of a use case: its runs on lanes, the waits before them (``(lane, start, end,
    parked)``), and the times of each kind of mark."""

    key: str
    runs: list[tuple[int, TaskRun]]
    waits: list[tuple[int, float, float, bool]] = field(default_factory=list)
    marks: dict[str, list[float]] = field(default_factory=dict)

    @property
    def run_lanes(self) -> int:
        return max((lane for lane, _ in self.runs), default=-1) + 1

    @property
    def wait_lanes(self) -> int:
        return max((lane for lane, *_ in self.waits), default=-1) + 1


@dataclass
class Panel:
    """One use case: its rows, from ``origin`` (its first run or mark) to ``end`` (its last);
    a run killed midway is drawn until ``now`` (the kill)."""

    case: str
    origin: float
    end: float
    now: float
    rows: list[Row]

    def counts(self) -> dict[str, int]:
        """How many runs, and of each kind of mark, the picture shows."""
        found: Counter[str] = Counter(runs=sum(len(row.runs) for row in self.rows))
        for row in self.rows:
            for kind, times in row.marks.items():
                found[kind] += len(times)
            for *_, parked in row.waits:
                found["parked" if parked else "waited"] += 1
        return dict(found)


def _full(spans: Sequence[tuple[float, float]], allowed: int) -> list[tuple[float, float]]:
    """The stretches of time in which at least ``allowed`` of ``spans`` were in progress."""
    edges = sorted(edge for start, end in spans for edge in ((start, 1), (end, -1)))
    found, level, since = [], 0, 0.0
    for at, step in edges:
        level += step
        if step > 0 and level == allowed:
            since = at
        elif step < 0 and level == allowed - 1:
            found.append((since, at))
    return found


def _blocked(
    start: float, end: float, full: Sequence[tuple[float, float]]
) -> tuple[float, float] | None:
    """The wait ``(start, end)`` from the first moment every slot of its key was taken (until
    then the lease was being asked for, not waited for); ``None`` if it was never blocked for
    ``MIN_WAIT``."""
    overlaps = [(max(start, a), min(end, b)) for a, b in full if a < end and start < b]
    if sum(b - a for a, b in overlaps) < MIN_WAIT:
        return None
    return (overlaps[0][0], end)


def panels(
    runs: Sequence[TaskRun],
    events: Sequence[Event],
    cases: Sequence[str],
    killed_at: Mapping[str, float],
    allowed: Mapping[str, int],
) -> list[Panel]:
    """A panel per use case that ran (``killed_at``: use case -> when its run was killed;
    ``allowed``: how many may run at once per key). A mark goes on the row of the key its task
    ran on, else on the use case's only key. A wait in a worker is drawn from the moment every
    slot of its key was taken by runs."""
    found = []
    for case in cases:
        mine = [r for r in runs if r.case == case]
        if not mine:
            continue
        noted = [e for e in events if e.case == case]
        now = killed_at.get(case, max(r.until(r.start) for r in mine))
        keys = sorted({r.key for r in mine})
        key_of = {r.task_id: r.key for r in mine}
        rows = {key: Row(key, lanes([r for r in mine if r.key == key], now)) for key in keys}
        parked = {e.task_id for e in noted if e.action == "queue"}
        waits: dict[str, list[tuple[float, float, bool]]] = {key: [] for key in keys}
        for event in noted:
            key = key_of.get(event.task_id, keys[0] if len(keys) == 1 else None)
            if key is None:
                continue
            if event.action == "acquired":
                since = event.at - event.waited
                if event.task_id in parked:  # however short: it did find the lock taken
                    waits[key].append((since, event.at, True))
                else:
                    full = _full([r.span(now) for r in mine if r.key == key], allowed[case])
                    blocked = _blocked(since, event.at, full)
                    if blocked is not None:
                        waits[key].append((*blocked, False))
            elif event.action in _ACTIONS:
                rows[key].marks.setdefault(_ACTIONS[event.action], []).append(event.at)
        for key, spans in waits.items():
            packed = _pack([(start, end) for start, end, _ in spans])
            rows[key].waits = [(lane, *span) for lane, span in zip(packed, spans, strict=True)]
        times = [t for r in mine for t in r.span(now)]
        times += [t for row in rows.values() for _, *span, _ in row.waits for t in span]
        times += [t for row in rows.values() for marks in row.marks.values() for t in marks]
        found.append(Panel(case, min(times), max(times), now, list(rows.values())))
    return found


# Marker, colour and size of each kind of point mark; the waits' faces and hatches.
_MARKS = {
    "refused": ("x", "black", 28),
    "retry": ("o", "crimson", 22),
    "skipped": ("v", "black", 26),
}
_SAID = {"refused": ("refused", "refused"), "retry": ("retry", "retries"),
         "skipped": ("skipped", "skipped")}  # fmt: skip
_WAITS = {True: ("#9ecae1", None), False: ("#d9d9d9", "....")}
_RUN, _STRIP, _WAIT = 1.0, 0.8, 0.5  # the height of a run lane, a strip of marks, a wait lane


def _height(panel: Panel) -> float:
    return sum(
        row.run_lanes * _RUN + (_STRIP if row.marks else 0) + row.wait_lanes * _WAIT
        for row in panel.rows
    )


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"


def _draw_panel(ax: object, panel: Panel, colours: Mapping[str, object]) -> None:
    from matplotlib.axes import Axes

    assert isinstance(ax, Axes)
    ticks: list[float] = []
    labels: list[str] = []
    y = 0.0
    for row in panel.rows:
        for lane, run in row.runs:
            end = run.until(panel.now)
            ax.barh(
                y + lane * _RUN,
                end - run.start,
                left=run.start - panel.origin,
                color=colours[run.process],
                edgecolor="red" if run.end is None else "black",
                hatch="//" if run.end is None else None,
                height=0.8 * _RUN,
            )
        used = row.run_lanes
        ticks.append(y + (used - 1) * _RUN / 2)
        labels.append(f"{row.key} ({_plural(used, 'lane')})")
        y += used * _RUN
        if row.marks:
            strip = y - _RUN / 2 + _STRIP / 2
            said = []
            for kind, times in row.marks.items():
                marker, colour, size = _MARKS[kind]
                xs = [t - panel.origin for t in times]
                ax.scatter(xs, [strip] * len(xs), marker=marker, color=colour, s=size,
                           linewidths=1, facecolors="none" if marker == "o" else colour,
                           zorder=3)  # fmt: skip
                said.append(_plural(len(times), *_SAID[kind]))
            ticks.append(strip)
            labels.append(", ".join(said))
            y += _STRIP
        if row.waits:
            top = y - _RUN / 2 + _WAIT / 2
            for lane, start, end, parked in row.waits:
                face, hatch = _WAITS[parked]
                ax.barh(top + lane * _WAIT, end - start, left=start - panel.origin, color=face,
                        hatch=hatch, edgecolor="grey", linewidth=0.4,
                        height=0.8 * _WAIT)  # fmt: skip
            n_parked = sum(parked for *_, parked in row.waits)
            said = []
            if n_parked:
                said.append(f"{n_parked} parked")
            if len(row.waits) - n_parked:
                said.append(f"{len(row.waits) - n_parked} waited")
            ticks.append(top + (row.wait_lanes - 1) * _WAIT / 2)
            labels.append(", ".join(said))
            y += row.wait_lanes * _WAIT
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.set_ylim(y - _RUN / 2, -_RUN / 2)  # the first row on top
    width = max(panel.end - panel.origin, 1e-3)
    ax.set_xlim(-0.01 * width, 1.01 * width)
    ax.set_title(panel.case, fontsize=9, loc="left", fontweight="bold")
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel("seconds", fontsize=7, labelpad=1)


def draw(shown: Sequence[Panel], path: Path, description: str = "") -> bool:
    """Writes the PNG (``description`` goes in its metadata); returns False if matplotlib is
    missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.artist import Artist
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError:
        return False
    workers = sorted({run.process for p in shown for row in p.rows for _, run in row.runs})
    colours = {w: plt.get_cmap("tab10")(i % 10) for i, w in enumerate(workers)}
    handles: list[Artist] = [Patch(facecolor=colours[w], edgecolor="black") for w in workers]
    names = list(workers)
    drawn: Counter[str] = Counter()
    for panel in shown:
        drawn.update(panel.counts())
    handles.append(Patch(facecolor="white", edgecolor="red", hatch="//"))
    names.append("run killed midway")
    for kind, (marker, colour, _) in _MARKS.items():
        if drawn[kind]:
            face = "none" if marker == "o" else colour
            handles.append(Line2D([], [], marker=marker, color=colour, markerfacecolor=face,
                                  linestyle="none"))  # fmt: skip
            names.append(KINDS[kind])
    for parked, (face, hatch) in _WAITS.items():
        if drawn["parked" if parked else "waited"]:
            handles.append(Patch(facecolor=face, hatch=hatch, edgecolor="grey"))
            names.append(KINDS["parked" if parked else "waited"])
    legend = 0.3 + 0.17 * -(-len(names) // 4)  # inches
    heights = [_height(p) for p in shown]
    fig, axes = plt.subplots(
        len(shown), 1, squeeze=False,
        figsize=(11, 0.6 + legend + sum(0.2 * h + 0.75 for h in heights)),
        gridspec_kw={"height_ratios": heights},
    )  # fmt: skip
    for ax, panel in zip(axes[:, 0], shown, strict=True):
        _draw_panel(ax, panel, colours)
    fig.legend(handles, names, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.suptitle(
        "celery-redislock demo: every run per key, and what the locks kept from running",
        fontsize=11,
    )
    tall = fig.get_figheight()
    fig.tight_layout(rect=(0, legend / tall, 1, 1 - 0.4 / tall), h_pad=0.8)
    fig.savefig(path, dpi=100, metadata={"Description": description})
    plt.close(fig)
    return True
