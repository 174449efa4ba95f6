"""A nightly report that beat fires again and again, and that is never queued or run twice.

``unique="until_finished"``: from the moment a report is published until it has finished, a
second publish of it is refused, not queued. Beat fires it every 0.5 s here (a nightly crontab,
sped up, or fired again by a second beat after a failover); a report takes 3 s. The producer
watches for a while, then prints how often beat fired, how many reports were queued and ran, and
the most that were ever running, or queued or running, at once.

Run: python examples/singleton_report.py           (REDIS_URL, else a throwaway redis-server;
                                                    two workers and beat, as docker-compose.yml)
     python examples/singleton_report.py produce   (only the watching, against running workers)
"""

from __future__ import annotations

import time
from typing import Any

from _runner import beat_command, example_app, main, worker_command
from celery.signals import before_task_publish

from celery_redislock.integrations.celery import lock_conflict

NAME = "singleton_report"
REPORT_SECONDS = 3.0
WATCH_SECONDS = 8.0
WORKERS = [worker_command(NAME, "w1"), worker_command(NAME, "w2")]
BEAT = beat_command(NAME)

app, r = example_app(
    NAME,
    # Beat keeps its schedule in memory: no celerybeat-schedule file in the source tree.
    beat_scheduler="celery.beat:Scheduler",
    beat_schedule={"nightly-report": {"task": f"{NAME}.nightly_report", "schedule": 0.5}},
)


def key(what: str) -> str:
    return f"{NAME}:{what}"


@app.task(unique="until_finished")
def nightly_report() -> None:
    """Builds the report (a sleep), noting how many reports were running as it started."""
    r.incr(key("runs"))
    r.rpush(key("running"), r.incr(key("active")))
    try:
        time.sleep(REPORT_SECONDS)
    finally:
        # Still inside the run: the next publish can only come after these.
        r.decr(key("active"))
        r.decr(key("outstanding"))


def _published(sender: str | None = None, **_: Any) -> None:
    """In beat, before a report goes out: one more is queued or running."""
    if sender == nightly_report.name:
        r.incr(key("published"))
        r.rpush(key("outstanding-seen"), r.incr(key("outstanding")))


def _refused(sender: Any = None, action: str = "", **_: Any) -> None:
    """In beat, for a publish refused because the report is already queued or running."""
    if getattr(sender, "name", sender) == nightly_report.name and action == "existing":
        r.incr(key("refused"))


before_task_publish.connect(_published, weak=False)
lock_conflict.connect(_refused, weak=False)


def _count(what: str) -> int:
    return int(r.get(key(what)) or 0)


def _most(what: str) -> int:
    return max((int(n) for n in r.lrange(key(what), 0, -1)), default=0)


def produce() -> bool:
    """Watches beat and the workers for WATCH_SECONDS, sampling the queue; prints the counts."""
    longest_queue = 0
    deadline = time.monotonic() + WATCH_SECONDS
    while time.monotonic() < deadline:
        longest_queue = max(longest_queue, r.llen(NAME))
        time.sleep(0.05)
    published, refused, runs = _count("published"), _count("refused"), _count("runs")
    most_running, most_outstanding = _most("running"), _most("outstanding-seen")
    print(f"beat fired: {published + refused}")
    print(f"reports queued: {published}")
    print(f"refused as duplicates: {refused}")
    print(f"report runs: {runs}")
    print(f"max running at once: {most_running}")
    print(f"max queued or running at once: {most_outstanding}")
    print(f"max queue length: {longest_queue}")
    held = runs >= 2 and refused > 0 and most_running == 1 and most_outstanding == 1
    held = held and longest_queue <= 1
    print("invariant: " + ("held" if held else "BROKEN"))
    return held


if __name__ == "__main__":
    main(NAME, produce, WORKERS, BEAT)
