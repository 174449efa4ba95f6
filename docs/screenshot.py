"""The web view's screenshot for docs/web.md, docs/web.png (``make docs-screenshot``): a
throwaway ``redis-server`` with a few locks (holders, a call waiting in a line), a unique claim,
a rate limit set and paused and a paused lock, the view served by uvicorn on a free port, and
Chromium (Debian's, through Playwright) taking the picture.

    python docs/screenshot.py docs/web.png

The picture is committed, so that docs/web.md shows it on GitHub and in the built docs alike;
take it again when the page's look changes.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import redis
import uvicorn
from playwright.sync_api import sync_playwright

from celery_redislock import Lease, Lock, RateLimit
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core import admin
from celery_redislock.core.claims import claim
from celery_redislock.core.protocol import ClaimKind
from celery_redislock.web import create_app

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "docs-screenshot-token-0123"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _task(task_id: str, task: str) -> dict[str, str]:
    return {"task_id": task_id, "task": task, "host": "worker-1"}


def populate(client: redis.Redis) -> list[Lease]:
    """Leases held by "tasks" (their records as a worker's), a unique claim, a rate limit set
    and paused, a paused lock."""
    held = [
        Lock(client, "sync:42", ttl=60).acquire(info=_task("9b1c2f0e", "tasks.sync_customer")),
        *(
            Lock(client, "stripe-api", ttl=60, limit=5).acquire(
                info=_task(task_id, "tasks.call_stripe")
            )
            for task_id in ("4f0e77aa", "51d3c9b2")
        ),
        Lock(client, "nightly-report", ttl=60).acquire(
            info=_task("a7e01c44", "tasks.nightly_report")
        ),
    ]
    admin.pause_lock(client, "nightly-report", 600)
    admin.set_limits(client, "partner-api", rate="100/m", burst=10)
    admin.pause_rate(client, "partner-api", 45)
    search = RateLimit(client, "search-api", "2/s")  # in use: its slots booked seconds ahead
    for i in range(8):
        search.reserve(f"search-{i}")
    claim(
        client,
        "redislock",
        "report:daily",
        task_id="e1f2a3b4",
        lifetime=600,
        kind=ClaimKind.NEW,
        running_counts=False,
    )
    return held


def _wait_in_line(client: redis.Redis, got: list[Lease]) -> threading.Thread:
    """A call blocked on ``sync:42``, standing in its line until the holder lets go."""

    def wait() -> None:
        lock = Lock(client, "sync:42", ttl=60)
        got.append(lock.acquire(timeout=60, info=_task("c3d4e5f6", "tasks.sync_customer")))

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def main(out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        held = populate(client)
        got: list[Lease] = []
        waiter = _wait_in_line(client, got)
        port = _port()
        app = create_app(client, actions=True, token=TOKEN)
        web = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
        )
        thread = threading.Thread(target=web.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not web.started:
            if time.monotonic() > deadline:
                raise SystemExit("the web view did not start")
            time.sleep(0.02)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 760})
                page.goto(f"http://127.0.0.1:{port}/login")
                page.fill("input[name=token]", TOKEN)
                page.click("#login button[type=submit]")
                page.wait_for_selector("tr.lock[data-name='sync:42'] li.waiter")
                page.screenshot(path=str(out), full_page=True)
                browser.close()
        finally:
            web.should_exit = True
            thread.join(10)
            for lease in held:
                lease.release()
            waiter.join(10)
            for lease in got:
                lease.release()
            client.close()
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/web.png"))
