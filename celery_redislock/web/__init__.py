"""A web view of the locks, task lines, unique claims and limits, for operators (the ``web``
extra: Starlette, Jinja2, uvicorn): read-only, or with actions behind a token.

Serve it with ``redislock web --url redis://...``, or mount it into an ASGI app::

    app.mount("/locks", create_app(redis.Redis.from_url(url)))

Its modules: :mod:`.app` (``create_app``, the routes, the security headers), :mod:`.views` (the
endpoints), :mod:`.snapshot` (one page of locks, claims and limits, read through the admin API),
:mod:`.actions` (releases, pauses and limits, through the admin API), :mod:`.auth` (the token,
the session and its CSRF token), :mod:`.site` (what an app is made with), :mod:`.errors` (the
answers to a bad or refused request).
"""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
