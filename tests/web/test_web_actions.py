"""The web view's actions over HTTP on a real uvicorn server and a real Redis: each one only
with actions on, a session opened with the token, the session's CSRF token and the page's own
origin; anything else is refused (403) and changes nothing. Bad input is refused naming what
is allowed (400), unknown names are 404, and Redis is as it was."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import redis
from webclient import TOKEN, WebClient

from celery_redislock import Lock
from celery_redislock.core import admin
from celery_redislock.web import create_app
from celery_redislock.web.actions import ACTIONS


def _state(client: redis.Redis) -> dict[bytes, Any]:
    """Every key with its content (not its TTL): what an action would change."""
    found: dict[bytes, Any] = {}
    for key in sorted(client.scan_iter(count=1000)):
        kind = client.type(key).decode()
        if kind == "zset":
            found[key] = [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == "hash":
            found[key] = client.hgetall(key)
        elif kind == "string":
            found[key] = client.get(key)
        else:
            found[key] = kind
    return found


@pytest.fixture
def held(lockapp: ModuleType) -> Iterator[redis.Redis]:
    """lockapp's Redis with lock ``sync:1`` held by task ``task-1``."""
    lease = Lock(lockapp.r, "sync:1", ttl=30).acquire(info={"task_id": "task-1", "task": "t"})
    yield lockapp.r
    if admin.describe_lock(lockapp.r, "sync:1").holders:
        lease.release()


def test_an_action_needs_the_session_its_csrf_token_and_the_pages_origin(
    held: redis.Redis, serve: Callable[[Any], str]
) -> None:
    web = WebClient(serve(create_app(held, actions=True, token=TOKEN)))
    before = _state(held)
    release = {"name": "sync:1", "all": "1"}

    assert web.post("actions/release", release).status == 403  # no session
    assert "not logged in" in web.post("actions/release", release).text
    wrong = web.login("a-wrong-token-of-the-right-length")
    assert (wrong.status, "set-cookie" in wrong.headers) == (403, False)
    assert "wrong token" in wrong.text
    foreign = WebClient(web.base, origin="http://evil.example").login()
    assert foreign.status == 403 and "origin" in foreign.text

    assert web.login().status == 303
    cookie = web.cookie
    assert web.login().headers["set-cookie"].lower().count("httponly") == 1
    assert "samesite=strict" in web.login().headers["set-cookie"].lower()
    csrf = web.csrf()
    refusals = {
        "no CSRF token": web.post("actions/release", release),
        "a wrong CSRF token": web.post("actions/release", {**release, "csrf": "0" * 64}),
        "another origin": web.post(
            "actions/release", {**release, "csrf": csrf}, origin="http://evil.example"
        ),
        "another site (Referer)": WebClient(web.base, cookie=cookie, origin="-").post(
            "actions/release", {**release, "csrf": csrf}, referer="http://evil.example/x"
        ),
        "a cross-site fetch": web.post(
            "actions/release", {**release, "csrf": csrf}, sec_fetch_site="cross-site"
        ),
        "a forged cookie": WebClient(web.base, cookie=cookie[:-4] + "0000").post(
            "actions/release", {**release, "csrf": csrf}
        ),
    }
    for why, answer in refusals.items():
        assert answer.status == 403, (why, answer.status, answer.text)
    assert _state(held) == before  # nothing changed

    done = web.post("actions/release", {**release, "csrf": csrf}, x_requested_with="fetch")
    assert done.status == 200, done.text
    assert "freed lock 'sync:1'" in done.text and "task-1" in done.text
    assert admin.describe_lock(held, "sync:1").holders == []


def test_a_read_only_view_refuses_every_action_and_shows_no_button(
    held: redis.Redis, serve: Callable[[Any], str]
) -> None:
    web = WebClient(serve(create_app(held)))
    before = _state(held)
    page = web.get()
    assert page.status == 200 and "task-1" in page.text and "read-only" in page.text
    assert "data-action" not in page.text and 'name="csrf"' not in page.text
    for action in ACTIONS:
        answer = web.post(f"actions/{action}", {"name": "sync:1", "all": "1", "seconds": "5"})
        assert answer.status == 403, (action, answer.text)
        assert "actions are off" in answer.text
    assert web.login(TOKEN).status == 403
    assert _state(held) == before


def test_bad_input_is_refused_naming_what_is_allowed(
    held: redis.Redis, serve: Callable[[Any], str]
) -> None:
    web = WebClient(serve(create_app(held, actions=True, token=TOKEN)))
    assert web.login().status == 303
    before = _state(held)
    cases: list[tuple[str, dict[str, str], int, str]] = [
        ("release", {"name": "no-such-lock", "all": "1"}, 404, "no lease of lock 'no-such-lock'"),
        ("release", {"name": "sync:1", "token": "not-a-lease"}, 404, "nothing freed"),
        ("release", {"name": "sync:1", "task_id": "task-2"}, 404, "nothing freed"),
        ("release", {"name": "sync:1"}, 400, "exactly one of token"),
        ("release", {"name": "sync:1", "all": "1", "task_id": "task-1"}, 400, "exactly one"),
        ("release", {"name": "", "all": "1"}, 400, "name is missing"),
        ("release", {"name": "}x", "all": "1"}, 400, "must not start with '}'"),
        ("release-claim", {"name": "no-such-key"}, 404, "no queued claim"),
        ("pause-lock", {"name": "sync:1", "seconds": "soon"}, 400, "seconds must be a number"),
        ("pause-lock", {"name": "sync:1", "seconds": "-1"}, 400, "above 0"),
        ("pause-lock", {"name": "sync:1", "seconds": "nan"}, 400, "seconds must be"),
        ("pause-rate", {"name": "sync:1", "seconds": "1e99"}, 400, "30 days"),
        ("set-limits", {"name": "api"}, 400, "needs a rate"),
        ("set-limits", {"name": "api", "rate": "fast"}, 400, "rate"),
        ("set-limits", {"name": "api", "cap": "many"}, 400, "cap must be a whole number"),
        ("set-limits", {"name": "api", "cap": "0"}, 400, "cap"),
        ("set-limits", {"name": "api", "burst": "-2"}, 400, "burst must be"),
        ("explode", {"name": "sync:1"}, 404, "no action 'explode': one of release"),
    ]
    for action, fields, status, says in cases:
        answer = web.act(action, **fields)
        assert (answer.status, says in answer.text) == (status, True), (action, fields, answer.text)
    wrong_kind = web.request(
        "POST", "actions/release", headers={"Content-Type": "application/json"}, body=b"{}"
    )
    assert wrong_kind.status == 400 and "form post" in wrong_kind.text
    for query, says in [
        ("?page=0", "page must be a whole number from 1"),
        ("?per=100000", "per must be a whole number from 1 to 500"),
        ("?paused=maybe", "paused must be 1"),
        ("?q=" + "x" * 300, "q must be at most 200 characters"),
    ]:
        for path in ("", "live", "api/state"):
            answer = web.get(path + query)
            assert (answer.status, says in answer.text) == (400, True), (path, query, answer.text)
    assert _state(held) == before


def test_each_action_does_what_the_cli_would(
    lockapp: ModuleType, held: redis.Redis, serve: Callable[[Any], str]
) -> None:
    web = WebClient(serve(create_app(held, actions=True, token=TOKEN)))
    assert web.login().status == 303
    claimed = lockapp.unique_started.delay("web")  # no worker: its claim stays queued
    [claim] = admin.list_claims(held)

    def ok(action: str, **fields: str) -> str:
        answer = web.act(action, **fields)
        assert answer.status == 200, (action, answer.text)
        return answer.text

    assert claimed.id in web.get().text
    assert "paused lock 'sync:1' for 30.0s" in ok("pause-lock", name="sync:1", seconds="30")
    assert admin.describe_rate(held, "sync:1").lock_paused_for > 29
    assert 'class="paused">30.0s' in web.get().text or "29." in web.get().text
    assert "resumed lock 'sync:1'" in ok("resume-lock", name="sync:1")
    assert admin.describe_rate(held, "sync:1").lock_paused_for == 0
    assert "rate 50/60s" in ok("set-limits", name="api", rate="50/m", burst="5", cap="3")
    state = admin.describe_rate(held, "api")
    assert (str(state.rate), state.burst, state.cap) == ("50/60s", 5, 3)
    assert "paused for" in ok("pause-rate", name="api", seconds="20")
    assert admin.describe_rate(held, "api").paused_for > 19
    assert "not paused" in ok("resume-rate", name="api")
    assert "the code's rate" in ok("clear-limits", name="api")
    assert admin.describe_rate(held, "api").rate is None
    assert claimed.id in ok("release-claim", name=claim.name, task_id=claimed.id)
    assert admin.list_claims(held) == []
    token = admin.describe_lock(held, "sync:1").holders[0].token
    assert "task-1" in ok("release", name="sync:1", token=token)
    assert admin.describe_lock(held, "sync:1").holders == []
    logout = web.post("logout", {"csrf": web.csrf()})
    assert logout.status == 303 and "max-age=0" in logout.headers["set-cookie"].lower()


def test_a_post_with_neither_origin_nor_referer_is_refused(
    held: redis.Redis, serve: Callable[[Any], str]
) -> None:
    """docs/web.md: the `Origin`, else the `Referer`, must be the view's own; a post with neither
    proves nothing of where it comes from, so it is refused (a browser sends one of them)."""
    web = WebClient(serve(create_app(held, actions=True, token=TOKEN)))
    bare = WebClient(web.base, origin="-")  # sends no Origin (and no Referer)
    login = bare.login()
    assert (login.status, "set-cookie" in login.headers) == (403, False), login.text
    assert "neither" in login.text

    assert web.login().status == 303
    csrf = web.csrf()
    before = _state(held)
    release = {"name": "sync:1", "all": "1", "csrf": csrf}
    bare.cookie = web.cookie
    answer = bare.post("actions/release", release, x_requested_with="fetch")
    assert answer.status == 403, answer.text
    assert "neither" in answer.text
    assert _state(held) == before
    # With its own origin as the Referer alone, the same post goes through.
    through = bare.post("actions/release", release, x_requested_with="fetch", referer=web.base)
    assert through.status == 200, through.text
    assert admin.describe_lock(held, "sync:1").holders == []
