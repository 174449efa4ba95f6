"""The web view's tests: the real app served by a real uvicorn server (in a thread, on a free
port) and, for the browser tests, Debian's Chromium driven by Playwright (never a downloaded
browser). Without /usr/bin/chromium the browser tests are skipped, unless
``REDISLOCK_REQUIRE_CHROMIUM=1`` (CI), which fails them instead."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from helpers import free_port, wait_for

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class Served:
    """An ASGI app served by uvicorn in a thread of the test process, on a free port."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="web-test-server")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> Served:
        self.thread.start()
        wait_for(lambda: self.server.started or not self.thread.is_alive(), "uvicorn to start")
        assert self.server.started, "uvicorn did not start"
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def serve() -> Iterator[Callable[[Any], str]]:
    """Serves an app (``serve(create_app(...))`` -> its base URL) until the test ends."""
    started: list[Served] = []

    def start(app: Any) -> str:
        served = Served(app).start()
        started.append(served)
        return served.url

    yield start
    for served in started:
        served.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium under Playwright, headless, for one module's tests: Playwright's sync
    API keeps an event loop running in the main thread while it is open, so it must close
    before a test of another module calls ``asyncio.run`` in the same process."""
    if not CHROMIUM.exists():
        message = (
            f"{CHROMIUM} is missing: install Debian's chromium (make chromium, or "
            "apt-get install chromium); Playwright's own browsers are never downloaded"
        )
        if os.environ.get("REDISLOCK_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"{message} (REDISLOCK_REQUIRE_CHROMIUM=1)", pytrace=False)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser page (its own cookies); actions' confirmations are accepted."""
    context = browser.new_context()
    context.set_default_timeout(15_000)
    tab = context.new_page()
    tab.on("dialog", lambda dialog: dialog.accept())
    yield tab
    context.close()
