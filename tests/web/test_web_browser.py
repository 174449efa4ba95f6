"""The web view in a real browser (Debian's Chromium under Playwright) over a real Celery
worker: the page shows who holds a lock and who waits in its task line, updates itself, and a
click on release, by an operator logged in with the token, hands the lock to the waiting task.
Without the token, nothing can be freed."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from helpers import started, wait_for, wait_started
from playwright.sync_api import expect
from webclient import TOKEN
from workers import Worker

from celery_redislock import Lock
from celery_redislock.core import admin
from celery_redislock.web import create_app


def _waiting_ids(lockapp: ModuleType, name: str) -> list[str]:
    return [w.info.get("task_id", "") for w in admin.describe_lock(lockapp.r, name).waiters]


def _holder_ids(lockapp: ModuleType, name: str) -> list[str]:
    return [h.info.get("task_id", "") for h in admin.describe_lock(lockapp.r, name).holders]


def _log_in(page: Any, url: str, token: str) -> None:
    page.goto(url)
    page.click("#login-link")
    page.fill("input[name=token]", token)
    page.click("#login button[type=submit]")


@pytest.mark.slow  # a real worker: about 6 s
def test_a_click_on_release_hands_the_lock_to_the_task_waiting_in_its_line(
    lockapp: ModuleType, workers: Callable[..., Worker], serve: Callable[[Any], str], page: Any
) -> None:
    workers(name="w1", concurrency=2)
    holder = lockapp.in_line.delay("web", 0, 30)  # holds line:web until stop:web is set
    wait_started(lockapp, "line:web")
    waiting = lockapp.in_line.delay("web", 1, 30)
    wait_for(lambda: _waiting_ids(lockapp, "line:web") == [waiting.id], "the second to park")
    url = serve(create_app(lockapp.r, actions=True, token=TOKEN))

    page.goto(url)
    row = page.locator("tr.lock[data-name='line:web']")
    expect(row.locator("tr.holder")).to_contain_text(holder.id)
    expect(row.locator("tr.holder")).to_contain_text("lockapp.in_line")
    expect(row.locator("li.waiter")).to_contain_text(waiting.id)
    expect(row.locator("li.waiter")).to_contain_text("parked")
    expect(page.locator("button[data-action]")).to_have_count(0)  # not logged in yet

    _log_in(page, url, TOKEN)
    expect(page.locator(".badge.on")).to_have_text("actions on")
    row.get_by_role("button", name="release all").click()
    expect(page.locator("#outcome")).to_contain_text("freed lock 'line:web'")
    expect(page.locator("#outcome")).to_contain_text(holder.id)

    wait_for(lambda: waiting.id in started(lockapp, "line:web"), "the parked task to start", 30)
    assert _holder_ids(lockapp, "line:web") == [waiting.id]
    # The page follows by itself (every second): the waiting task is now the holder.
    expect(row.locator("tr.holder")).to_contain_text(waiting.id, timeout=10_000)
    expect(row.locator("li.waiter")).to_have_count(0)

    lockapp.r.set("stop:web", 1)
    wait_for(lambda: holder.state == waiting.state == "SUCCESS", "both tasks to end", 30)
    assert started(lockapp, "line:web") == [holder.id, waiting.id]


def test_without_the_token_nothing_is_freed(
    lockapp: ModuleType, serve: Callable[[Any], str], page: Any
) -> None:
    client = lockapp.r
    lease = Lock(client, "sync:ro", ttl=30).acquire(info={"task_id": "task-ro", "task": "t.ro"})
    try:
        before = admin.describe_lock(client, "sync:ro").holders
        read_only = serve(create_app(client))
        page.goto(read_only)
        expect(page.locator("tr.lock[data-name='sync:ro'] tr.holder")).to_contain_text("task-ro")
        expect(page.locator(".badge")).to_have_text("read-only")
        expect(page.locator("button[data-action]")).to_have_count(0)
        # A post from the page itself is refused: actions are off.
        status, text = page.evaluate(
            """async () => {
                const r = await fetch("actions/release", {method: "POST",
                    headers: {"Content-Type": "application/x-www-form-urlencoded"},
                    body: "name=sync%3Aro&all=1"});
                return [r.status, await r.text()];
            }"""
        )
        assert (status, "actions are off" in text) == (403, True)

        acting = serve(create_app(client, actions=True, token=TOKEN))
        _log_in(page, acting, "not-the-token-at-all")
        expect(page.locator("#outcome")).to_contain_text("wrong token")
        page.goto(acting)
        expect(page.locator("#login-link")).to_be_visible()
        expect(page.locator("button[data-action]")).to_have_count(0)
        status = page.evaluate(
            """async () => (await fetch("actions/release", {method: "POST",
                headers: {"Content-Type": "application/x-www-form-urlencoded"},
                body: "name=sync%3Aro&all=1&csrf=0"})).status"""
        )
        assert status == 403
        assert admin.describe_lock(client, "sync:ro").holders[0].token == before[0].token
    finally:
        lease.release()


def test_a_very_long_lock_name_keeps_the_page_within_the_window(
    lockapp: ModuleType, serve: Callable[[Any], str], page: Any
) -> None:
    """A 3,000-character name is cut (its full text on hover): the page is no wider than the
    window, and the other columns stay on screen."""
    client = lockapp.r
    name = "long:" + "x" * 2995
    lease = Lock(client, name, ttl=30).acquire(info={"task_id": "t-long", "task": "t.long"})
    try:
        page.set_viewport_size({"width": 1280, "height": 800})
        page.goto(serve(create_app(client)))
        row = page.locator("tr.lock").filter(has_text="t-long")
        expect(row).to_have_count(1)
        widths = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
        assert widths[0] <= widths[1], widths
        shown = row.locator("th code.name")
        assert shown.get_attribute("title") == name  # the full name on hover
        box = shown.bounding_box()
        assert box is not None and box["x"] + box["width"] <= widths[1]
        assert row.locator("td.task-id").bounding_box()["x"] < widths[1]
    finally:
        lease.release()


def test_bidirectional_controls_in_a_name_are_shown_escaped(
    lockapp: ModuleType, serve: Callable[[Any], str], page: Any
) -> None:
    """A name with a right-to-left override (U+202E) would display reversed, passing for
    another name: the page shows such characters as escapes, in the name and its hover text."""
    client = lockapp.r
    name = "invoice:\u202etxt.exe"
    lease = Lock(client, name, ttl=30).acquire(info={"task_id": "t-bidi"})
    try:
        page.goto(serve(create_app(client)))
        shown = page.locator("tr.lock").filter(has_text="t-bidi").locator("th code.name")
        expect(shown).to_have_count(1)
        assert shown.inner_text() == "invoice:\\u202etxt.exe"
        assert shown.get_attribute("title") == "invoice:\\u202etxt.exe"
    finally:
        lease.release()
