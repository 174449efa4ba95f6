"""Per-customer syncs that never overlap for one customer, calling an API capped at 2 at once.

``sync_customer`` locks ``sync:{customer_id}``: syncs of different customers run side by side,
two of one customer never do (a second one is retried a moment later). Each sync pushes its
changes in pages, one ``call_api`` task per page; ``call_api`` holds one of the 2 slots of the
fleet-wide cap ``external-api``, whichever worker runs it. The producer fires bursts of syncs for
5 customers, waits until every sync and call is done, and prints, from the intervals each task
noted in Redis, the most syncs one customer ever had at once and the most API calls at once.

Run: python examples/customer_sync.py           (REDIS_URL, else a throwaway redis-server;
                                                 starts two workers)
     python examples/customer_sync.py produce   (only the producer, against running workers)
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

from _runner import example_app, main, noted, worker_command

from celery_redislock.integrations.celery import lock_conflict

# demos/ is in the checkout, not installed: importing _runner put it on sys.path.
from demos._common.spans import most_at_once

NAME = "customer_sync"
CUSTOMERS = [101, 102, 103, 104, 105]
BURSTS = 2  # each: every customer's sync asked for twice in a row
PAGES = 2  # API calls per sync
API_SLOTS = 2
WORKERS = [worker_command(NAME, "w1", concurrency=4), worker_command(NAME, "w2", concurrency=4)]

app, r = example_app(
    NAME,
    task_ignore_result=True,  # the producer reads what the tasks noted, not their results
)


def key(what: str) -> str:
    return f"{NAME}:{what}"


@app.task(lock={"key": "sync:{customer_id}", "on_conflict": "retry", "countdown": 0.2})
def sync_customer(customer_id: int) -> None:
    """Reads and diffs the customer's records (a sleep), then queues one API call per page."""
    with noted(r, key("intervals"), f"customer:{customer_id}"):
        time.sleep(0.3)
        for page in range(PAGES):
            call_api.delay(customer_id, page)


@app.task(
    lock={"key": "external-api", "limit": API_SLOTS, "on_conflict": "retry", "countdown": 0.1}
)
def call_api(customer_id: int, page: int) -> None:
    """One request to the rate-limited API (a sleep)."""
    with noted(r, key("intervals"), "external-api"):
        time.sleep(0.15)


def _count_retry(sender: Any = None, action: str = "", **_: Any) -> None:
    """In the workers: a run that found its lock held and was retried."""
    if action == "retry":
        r.hincrby(key("retries"), getattr(sender, "name", str(sender)).rsplit(".", 1)[-1])


lock_conflict.connect(_count_retry, weak=False)


def produce() -> bool:
    """Fires the bursts, waits until every sync and call has run, prints what overlapped."""
    r.delete(key("intervals"), key("retries"))
    for _ in range(BURSTS):
        for customer_id in CUSTOMERS:
            sync_customer.delay(customer_id)
            sync_customer.delay(customer_id)
        time.sleep(0.3)
    syncs, calls = BURSTS * 2 * len(CUSTOMERS), BURSTS * 2 * len(CUSTOMERS) * PAGES
    deadline = time.monotonic() + 40
    while r.llen(key("intervals")) < syncs + calls and time.monotonic() < deadline:
        time.sleep(0.1)

    syncs_of: dict[str, list[tuple[float, float]]] = defaultdict(list)
    api: list[tuple[float, float]] = []
    for raw in r.lrange(key("intervals"), 0, -1):
        what, start, end = json.loads(raw)
        (api if what == "external-api" else syncs_of[what]).append((start, end))
    all_syncs = [span for spans in syncs_of.values() for span in spans]
    most_per_customer = {what: most_at_once(spans) for what, spans in sorted(syncs_of.items())}
    for what, most in most_per_customer.items():
        print(f"{what}: {len(syncs_of[what])} syncs, at most {most} at once")
    most_customer = max(most_per_customer.values(), default=0)
    most_api = most_at_once(api)
    retries = r.hgetall(key("retries"))
    print(f"syncs run: {len(all_syncs)} of {syncs}")
    print(f"api calls run: {len(api)} of {calls}")
    print(f"max syncs at once, all customers: {most_at_once(all_syncs)}")
    print(f"max syncs at once of one customer: {most_customer}")
    print(f"max api calls at once: {most_api} (cap {API_SLOTS})")
    print(
        f"conflict retries: sync_customer {retries.get('sync_customer', 0)}, "
        f"call_api {retries.get('call_api', 0)}"
    )
    held = len(all_syncs) == syncs and len(api) == calls and most_customer == 1
    held = held and 1 <= most_api <= API_SLOTS
    print("invariant: " + ("held" if held else "BROKEN"))
    return held


if __name__ == "__main__":
    main(NAME, produce, WORKERS)
