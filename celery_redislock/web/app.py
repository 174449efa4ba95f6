"""``create_app``: the web view as an ASGI app (Starlette), to serve alone (``redislock web``)
or to mount into an existing app."""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.handover import DEFAULT_HANDOVER_WINDOW, Handover
from ..core.keys import DEFAULT_NAMESPACE, check_namespace
from ..core.lease import RedisClient
from ..core.lock import DEFAULT_FENCE_KEEP
from .auth import Guard
from .site import Site
from .views import Views

__all__ = ["SECURITY_HEADERS", "create_app"]

_STATIC = Path(__file__).parent / "static"

SECURITY_HEADERS = {
    # Scripts and styles from this app only (no inline script can run), forms post here only,
    # no page may frame this one (a framed button could be clicked for the operator).
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
"""Headers of every answer of the app."""


class _SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every HTTP answer (static files included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [
                    (name.encode(), value.encode())
                    for name, value in SECURITY_HEADERS.items()
                    if name.encode() not in present
                ]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def create_app(
    client: RedisClient,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    actions: bool = False,
    token: str | None = None,
    title: str = "celery-redislock",
    fence_keep: float = DEFAULT_FENCE_KEEP,
    handover: Handover | None = None,
    handover_window: float = DEFAULT_HANDOVER_WINDOW,
) -> Starlette:
    """The web view of the locks, task lines, unique claims and limits of ``namespace`` on
    ``client``'s Redis, as an ASGI app. Read-only unless ``actions=True`` and a ``token`` (at
    least 16 characters) are given: then an operator who logs in with the token can release
    leases and claims, pause and resume locks and rate limits, and set limits.

    ``fence_keep``, ``handover`` and ``handover_window`` are as a lock's: a release or a resume
    hands the lock on through them (without a ``handover``, a worker's sweeper publishes the
    parked tasks at its next sweep). Mount it under a prefix of another app as any ASGI app:

    >>> app.mount("/locks", create_app(redis.Redis()))   # doctest: +SKIP
    """
    guard = Guard(token=token, actions=actions)
    site = Site(
        client=client,
        namespace=check_namespace(namespace),
        guard=guard,
        fence_keep=fence_keep,
        handover=handover,
        handover_window=handover_window,
        title=title,
    )
    views = Views(site)
    routes = [
        Route("/", views.page, name="page"),
        Route("/live", views.live, name="live"),
        Route("/api/state", views.api, name="api"),
        Route("/login", views.login_form, methods=["GET"], name="login_form"),
        Route("/login", views.login, methods=["POST"], name="login"),
        Route("/logout", views.logout, methods=["POST"], name="logout"),
        Route("/actions/{action}", views.action, methods=["POST"], name="action"),
        Mount("/static", StaticFiles(directory=_STATIC), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(_SecurityHeaders)])
