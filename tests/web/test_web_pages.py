"""What the web view shows, over HTTP on a real uvicorn server and a real Redis: 10,000 locks
paged (names found with SCAN, only the page described), searches by name and by task id, the
JSON view, and the app mounted under a prefix of another app."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from helpers import load_factor, wait_for
from starlette.applications import Starlette
from starlette.routing import Mount
from webclient import TOKEN, WebClient

from celery_redislock import Lock, RateLimit
from celery_redislock.core import admin, layout
from celery_redislock.core.beat import BeatLeader
from celery_redislock.web import create_app
from celery_redislock.web.snapshot import NameCache, Query, read

MANY = 10_000


def _names(text: str) -> list[str]:
    return [part.split('"', 1)[0] for part in text.split('<tr class="lock" data-name="')[1:]]


@pytest.mark.slow  # 10,000 leases taken one by one: about 6 s
def test_ten_thousand_locks_are_paged_and_searched(
    lockapp: ModuleType, serve: Callable[[Any], str]
) -> None:
    client = lockapp.r
    for i in range(MANY):  # real leases, through the lock's own script
        Lock(client, f"bulk:{i:05d}", ttl=600).acquire(
            blocking=False, info={"task_id": f"task-{i:05d}"}
        )
    web = WebClient(serve(create_app(client)))

    began = time.monotonic()
    first = web.get()
    took = time.monotonic() - began
    assert first.status == 200
    assert "1\u201350 of 10,000" in first.text and "page 1 of 200" in first.text
    assert _names(first.text) == [f"bulk:{i:05d}" for i in range(50)]
    # (a liveness bound, stretched with the machine's load)
    assert took < 20 * load_factor(), f"the first page of 10,000 locks took {took:.1f}s"

    third = web.get("live?page=3")
    assert "101\u2013150 of 10,000" in third.text
    assert _names(third.text) == [f"bulk:{i:05d}" for i in range(100, 150)]
    assert 'href="/?page=2"' in third.text and 'href="/?page=4"' in third.text
    last = web.get("?page=200&per=50")
    assert _names(last.text) == [f"bulk:{i:05d}" for i in range(9950, 10_000)]
    assert _names(web.get("?page=201").text) == []  # past the end: an empty page, no error

    found = web.get("?q=bulk:0999")  # a substring
    assert "1\u201310 of 10" in found.text
    assert _names(found.text) == [f"bulk:{i:05d}" for i in range(9990, 10_000)]
    assert _names(web.get("?q=bulk:000[12]?").text) == [
        f"bulk:{i:05d}" for i in range(10, 30)
    ]  # a glob
    assert "No lock matches this search." in web.get("?q=nothing-like-it").text

    by_task = web.get("?task=task-00007")
    assert _names(by_task.text) == ["bulk:00007"]
    assert "found among the first 2,000 of 10,000 names" in by_task.text
    far = web.get("?task=task-09999&q=bulk:09*")  # narrowed by name: looked at them all
    assert _names(far.text) == ["bulk:09999"] and "found among" not in far.text

    api = web.get("api/state?per=10&page=2")
    assert api.status == 200
    body = json.loads(api.text)
    assert body["locks"]["total"] == MANY and body["locks"]["pages"] == 1000
    assert [r["name"] for r in body["locks"]["rows"]] == [f"bulk:{i:05d}" for i in range(10, 20)]
    [holder] = body["locks"]["rows"][0]["holders"]
    assert holder["task_id"] == "task-00010" and 0 < holder["expires_in"] <= 600


def test_a_lock_with_its_line_claims_limits_and_pauses_are_shown(
    lockapp: ModuleType, serve: Callable[[Any], str]
) -> None:
    client = lockapp.r
    lease = Lock(client, "report", ttl=30).acquire(info={"task_id": "t-hold", "task": "t.report"})
    try:
        admin.pause_lock(client, "report", 60)
        admin.set_limits(client, "partner-api", rate="50/m", burst=5)
        admin.pause_rate(client, "partner-api", 45)
        claimed = lockapp.unique_started.delay("shown")
        reserved = time.monotonic()
        for i in range(3):  # usage: 3 slots of 2/s book the bucket 1 s ahead and more
            RateLimit(client, "busy-api", "2/s").reserve(f"r-{i}")
        web = WebClient(serve(create_app(client)))
        page = web.get().text
        assert 'data-name="report"' in page and "t-hold" in page and "t.report" in page
        assert claimed.id in page and "queued" in page
        assert 'data-name="partner-api"' in page and "50/60s" in page
        state = json.loads(web.get("api/state").text)
        (busy,) = [r for r in state["limits"]["rows"] if r["name"] == "busy-api"]
        # Booked 1 s ahead and more as the third slot was reserved, less what has gone by since.
        assert 1.0 - (time.monotonic() - reserved) < busy["booked_for"] <= 1.5
        paused = web.get("?paused=1").text
        assert 'data-name="report"' in paused and 'data-name="partner-api"' in paused
        assert "a claim is never paused" in paused
        assert claimed.id in web.get(f"?task={claimed.id}").text
    finally:
        lease.release()


def test_a_caller_blocked_on_the_lean_fast_path_is_shown(
    lockapp: ModuleType, serve: Callable[[Any], str]
) -> None:
    """The lean layout: a refused caller has no place in line; the page shows its deadline."""
    client = lockapp.r
    layout.set_layout(client, "redislock", "lean")
    lease = Lock(client, "fast", ttl=30).acquire(info={"task_id": "t-fast"})
    waiter = threading.Thread(
        target=lambda: Lock(client, "fast", ttl=30).acquire(timeout=60).release()
    )
    try:
        waiter.start()
        wait_for(lambda: client.hget(lease.lock.keys.meta, "Q"), "the caller refused once")
        web = WebClient(serve(create_app(client)))
        page = web.get().text
        assert 'data-name="fast"' in page and "t-fast" in page
        assert "callers blocked on the fast path (no place in line) for at most" in page
    finally:
        lease.release()
        waiter.join(60)
        layout.set_layout(client, "redislock", "shared")


def test_mounted_under_a_prefix_every_link_and_the_session_stay_under_it(
    lockapp: ModuleType, serve: Callable[[Any], str]
) -> None:
    client = lockapp.r
    lease = Lock(client, "mounted", ttl=30).acquire(info={"task_id": "t-mounted"})
    try:
        outer = Starlette(
            routes=[Mount("/ops/locks", create_app(client, actions=True, token=TOKEN))]
        )
        base = serve(outer)
        web = WebClient(base + "ops/locks/")
        page = web.get()
        assert page.status == 200 and "t-mounted" in page.text
        assert 'href="/ops/locks/static/style.css"' in page.text
        assert 'data-src="/ops/locks/live"' in page.text
        assert 'href="/ops/locks/login"' in page.text
        assert web.get("static/live.js").status == 200
        login = web.login()
        assert login.status == 303 and login.headers["location"] == "/ops/locks/"
        assert "path=/ops/locks/" in login.headers["set-cookie"].lower()
        answer = web.act("release", name="mounted", all="1")
        assert answer.status == 200 and "t-mounted" in answer.text
        assert admin.describe_lock(client, "mounted").holders == []
    finally:
        if admin.describe_lock(client, "mounted").holders:
            lease.release()


def _holder_cells(page: str, name: str, cls: str) -> list[str]:
    """The text of each cell (or block) of class ``cls`` in lock ``name``'s row."""
    row = page.split(f'<tr class="lock" data-name="{name}">', 1)[1].split('<tr class="lock"')[0]
    return [
        re.sub(r"<[^>]+>", "", cell).strip()
        for _, cell in re.findall(rf'<(td|div) class="{cls}"[^>]*>(.*?)</\1>', row, re.S)
    ]


def test_a_bare_lease_shows_no_task_id_and_its_token_apart(
    lockapp: ModuleType, serve: Callable[[Any], str]
) -> None:
    """A lease taken without a task (``Lock.acquire()``) has no task id: its column says so
    ("—"), and the token is shown as the token, not as a task id."""
    client = lockapp.r
    lease = Lock(client, "bare", ttl=30).acquire()
    try:
        page = WebClient(serve(create_app(client))).get().text
        assert _holder_cells(page, "bare", "task-id") == ["\u2014"]
        assert _holder_cells(page, "bare", "token") == [lease.token[:8] + "\u2026"]
        assert f'<code title="{lease.token}">' in page  # the whole token on hover
    finally:
        lease.release()


def test_a_capped_lock_shows_its_holders_of_its_limit(
    lockapp: ModuleType, serve: Callable[[Any], str]
) -> None:
    """A lock with ``limit=5`` held twice reads "2 of 5"; with a cap set at runtime, the cap
    takes the place of the limit and the page says so."""
    client = lockapp.r
    capped = Lock(client, "capped", ttl=30, limit=5)
    leases = [capped.acquire(info={"task_id": f"t-{i}"}) for i in range(2)]
    try:
        web = WebClient(serve(create_app(client)))
        assert _holder_cells(web.get().text, "capped", "count") == ["2 of 5"]
        admin.set_limits(client, "capped", cap=3)
        assert _holder_cells(web.get().text, "capped", "count") == ["2 of 3 (cap set)"]
        assert json.loads(web.get("api/state").text)["locks"]["rows"][0]["limit"] == 5
    finally:
        for lease in leases:
            lease.release()


def test_a_beat_leader_shows_as_such_with_its_host_and_since_when(
    lockapp: ModuleType, serve: Callable[[Any], str]
) -> None:
    """The leader lease of a fleet of beats (LeaderScheduler) is a lock like any other: its row
    names it the beat leader, since when, on which host and pid."""
    client = lockapp.r
    leader = BeatLeader(client, "proj", ttl=30)
    assert leader.lead(0) and leader.since is not None
    try:
        page = WebClient(serve(create_app(client))).get().text
        since = leader.since.isoformat(timespec="seconds")
        assert _holder_cells(page, "beat:proj", "task") == [f"beat leader since {since}"]
        row = page.split('<tr class="lock" data-name="beat:proj">', 1)[1]
        assert f"<td>{socket.gethostname()}</td>" in row and f"<td>{os.getpid()}</td>" in row
    finally:
        leader.step_down()


def test_on_a_large_database_a_listing_is_used_again_for_a_few_seconds(
    lockapp: ModuleType,
) -> None:
    """On a large database, the page lists the names at most every few seconds (each SCAN walks
    every key and each name is parsed: most of a page's cost), while the rows shown are read at
    every request."""
    client = lockapp.r
    leases = [Lock(client, f"many:{i}", ttl=30).acquire(info={"task_id": f"m-{i}"}) for i in (1, 2)]
    try:
        large = NameCache(kept_for=3600, kept_from=1)  # "large": a key or more; kept an hour
        small = NameCache(kept_for=3600, kept_from=10**9)
        query = Query(search="many:*")
        assert read(client, "redislock", query, large).locks.total == 2
        assert read(client, "redislock", query, small).locks.total == 2
        leases[0].release()
        leases.append(Lock(client, "many:3", ttl=30).acquire(info={"task_id": "m-3"}))
        kept = read(client, "redislock", query, large).locks
        assert [r["name"] for r in kept.rows] == ["many:1", "many:2"]  # the names as listed...
        assert kept.rows[0]["holders"] == []  # ...and each row as it is now
        fresh = read(client, "redislock", query, small).locks  # too small to keep listings
        assert [r["name"] for r in fresh.rows] == ["many:2", "many:3"]
        assert read(client, "redislock", query).locks.total == 2  # no cache: as it is now
    finally:
        for lease in leases[1:]:
            lease.release()
