"""The endpoints: the page, its live part (polled every second), the same as JSON, logging in
and out, and the actions. Every read and action runs the synchronous admin API in a worker
thread (:func:`~starlette.concurrency.run_in_threadpool`): the event loop never waits on Redis.
Every URL is made with ``request.url_for``, so the app works mounted under a prefix."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)

from ..errors import LockBackendError, LockConfigError
from .actions import run_action
from .auth import SESSION_COOKIE, SESSION_SECONDS, check_origin
from .errors import BadInput, Refused, WebError
from .site import Site
from .snapshot import NameCache, Query, Snapshot, parse_query, read

__all__ = ["Views"]

T = TypeVar("T")

MAX_FORM = 16 * 1024
"""The largest form body read (bytes): every form of the page is far smaller."""
FETCH = "x-requested-with"
"""The header the page's script sends: its requests are answered in plain text."""

_TEMPLATES = Path(__file__).parent / "templates"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def visible(text: object) -> str:
    """``text`` with each character Python deems unprintable (controls, format characters such
    as the bidirectional overrides and zero-width ones, separators other than the space) as its
    ``\\uXXXX`` escape: U+202E would show "abc\\u202edef" as "abcfed", passing for another
    name."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["seconds"] = _seconds
    env.filters["visible"] = visible
    return env


class Views:
    """The endpoints of one app, over its :class:`~.site.Site`."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self.env = _environment()
        self.names = NameCache()

    # -- helpers ----------------------------------------------------------------------------

    async def _admin(self, call: Callable[[], T]) -> T:
        """``call`` (the admin API) in a worker thread; its errors as the request's answer."""
        try:
            return await run_in_threadpool(call)
        except LockConfigError as exc:
            raise BadInput(str(exc)) from exc
        except LockBackendError as exc:
            cause = exc.__cause__ or exc
            raise _Unavailable(f"Redis failed: {cause}") from exc

    def _html(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        """The template ``name`` with ``context``, the site and ``url`` (``request.url_for``)."""

        def url(route: str, **path: str) -> str:
            return request.url_for(route, **path).path

        text = self.env.get_template(name).render(site=self.site, url=url, **context)
        return HTMLResponse(text, status_code=status)

    def _session(self, request: Request) -> str | None:
        return self.site.guard.session(request.cookies.get(SESSION_COOKIE))

    def _context(self, request: Request, snapshot: Snapshot | None = None) -> dict[str, Any]:
        sid = self._session(request)
        query = snapshot.query if snapshot is not None else Query()

        def page_url(**changed: object) -> str:
            params = urlencode(query.params(**changed))
            return request.url_for("page").path + (f"?{params}" if params else "")

        live = urlencode(query.params())
        return {
            "snap": snapshot,
            "query": query,
            "page_url": page_url,
            "live_url": request.url_for("live").path + (f"?{live}" if live else ""),
            "actions_on": self.site.guard.enabled,
            "can_act": sid is not None,
            "csrf": self.site.guard.csrf(sid) if sid is not None else "",
            "now": time.strftime("%H:%M:%S"),
        }

    def _error(self, request: Request, error: WebError, *, plain: bool = False) -> Response:
        """The answer to a refused request: plain text for the page's script (and ``plain``),
        else a page."""
        if plain or request.headers.get(FETCH):
            return PlainTextResponse(error.message, status_code=error.status)
        back = request.url_for("page").path
        return self._html(
            request, "message.html", error.status, ok=False, lines=[error.message], back=back
        )

    async def _form(self, request: Request) -> dict[str, str]:
        """The fields of a urlencoded form body (each form of the page posts one)."""
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        if kind != "application/x-www-form-urlencoded":
            raise BadInput(
                f"an action is a form post (application/x-www-form-urlencoded), got {kind!r}"
            )
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM:
                raise BadInput(f"the form is over {MAX_FORM:,} bytes")
        try:
            return dict(parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=False))
        except (UnicodeDecodeError, ValueError) as exc:
            raise BadInput(f"the form could not be read: {exc}") from exc

    async def _snapshot(self, request: Request) -> Snapshot:
        query = parse_query(_single(request.query_params))
        site = self.site
        return await self._admin(lambda: read(site.client, site.namespace, query, self.names))

    # -- endpoints --------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        """The whole page: search, the live part, the log-in state and the action forms."""
        try:
            snapshot = await self._snapshot(request)
        except WebError as exc:
            return self._error(request, exc)
        return self._html(request, "page.html", **self._context(request, snapshot))

    async def live(self, request: Request) -> Response:
        """The live part of the page alone (the page's script fetches it every second)."""
        try:
            snapshot = await self._snapshot(request)
        except WebError as exc:
            return self._error(request, exc)
        return self._html(request, "live.html", **self._context(request, snapshot))

    async def api(self, request: Request) -> Response:
        """The page's data as JSON: each row as the CLI's ``--json`` prints it."""
        try:
            snapshot = await self._snapshot(request)
        except WebError as exc:
            return self._error(request, exc, plain=True)
        sections = {"locks": snapshot.locks, "claims": snapshot.claims, "limits": snapshot.limits}
        body = {
            "namespace": snapshot.namespace,
            **{
                key: {
                    "rows": section.rows,
                    "total": section.total,
                    "page": section.page,
                    "pages": section.pages,
                    "per_page": section.per_page,
                    "looked_at": section.looked_at,
                }
                for key, section in sections.items()
            },
        }
        return JSONResponse(body)

    async def login_form(self, request: Request) -> Response:
        return self._html(request, "login.html", **self._context(request), error="")

    async def login(self, request: Request) -> Response:
        """Checks the token; on a match, opens a session (the cookie) and goes to the page."""
        guard = self.site.guard
        try:
            if not guard.enabled:
                raise Refused(
                    "actions are off: this view is read-only; there is nothing to log in to"
                )
            check_origin(request)
            form = await self._form(request)
            if not guard.check_token(form.get("token", "")):
                raise Refused("wrong token: not logged in")
        except WebError as exc:
            if request.headers.get(FETCH):
                return self._error(request, exc)
            context = self._context(request)
            return self._html(request, "login.html", exc.status, **context, error=exc.message)
        page = request.url_for("page")
        response = RedirectResponse(page.path, status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            guard.new_session(),
            max_age=SESSION_SECONDS,
            path=page.path,
            secure=request.url.scheme == "https",
            httponly=True,
            samesite="strict",
        )
        return response

    async def logout(self, request: Request) -> Response:
        """Ends the session here (its cookie), after the same checks as an action."""
        try:
            self.site.guard.check_action(request, await self._form(request))
        except WebError as exc:
            return self._error(request, exc)
        page = request.url_for("page")
        response = RedirectResponse(page.path, status_code=303)
        response.delete_cookie(SESSION_COOKIE, path=page.path)
        return response

    async def action(self, request: Request) -> Response:
        """One action (``actions/<name>``): refused unless actions are on, the session is
        valid, the form carries its CSRF token and the post comes from the page's origin."""
        name = request.path_params["action"]
        try:
            form = await self._form(request)
            self.site.guard.check_action(request, form)
            lines = await self._admin(lambda: run_action(self.site, name, form))
        except WebError as exc:
            return self._error(request, exc)
        if request.headers.get(FETCH):
            return PlainTextResponse("\n".join(lines))
        back = request.url_for("page").path
        return self._html(request, "message.html", ok=True, lines=lines, back=back)


class _Unavailable(WebError):
    """Redis failed or could not be reached: 503."""

    status = 503


def _single(params: Mapping[str, str]) -> dict[str, str]:
    return {key: params[key] for key in params}
