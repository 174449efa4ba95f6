"""Who may act: the operator's token, the session it opens, and the CSRF token of the session.

Actions are on only when the app was made with ``actions=True`` and a token. The operator types
the token once into the log-in form (compared with :func:`hmac.compare_digest`); the answer is a
session cookie (HttpOnly, SameSite=Strict) holding a random session id, the time it was issued
and an HMAC of both under a secret made when the app is (so a restart ends every session). Each
action is a POST carrying the session's CSRF token, an HMAC of the session id under the same
secret, and is refused unless the token matches and the request comes from the page's own
origin (``Origin``, else ``Referer``; ``Sec-Fetch-Site`` when a browser sends it).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.requests import Request

from ..errors import LockConfigError
from .errors import Refused

__all__ = ["MIN_TOKEN", "SESSION_COOKIE", "SESSION_SECONDS", "Guard"]

SESSION_COOKIE = "redislock_session"
SESSION_SECONDS = 12 * 3600
"""How long a session lasts: log in again after."""
MIN_TOKEN = 16
"""The shortest token accepted (characters)."""


def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


@dataclass(frozen=True)
class Guard:
    """The token, sessions and CSRF tokens of one app (one per :func:`~.app.create_app`)."""

    token: str | None
    actions: bool
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    def __post_init__(self) -> None:
        if self.token is not None and (not isinstance(self.token, str) or not self.token.strip()):
            raise LockConfigError(f"token must be a non-empty string, got {self.token!r}")
        if self.actions and self.token is None:
            raise LockConfigError(
                "actions=True needs a token (the operator types it to log in): "
                "create_app(client, actions=True, token=...)"
            )
        if self.token is not None and len(self.token) < MIN_TOKEN:
            raise LockConfigError(
                f"token must be at least {MIN_TOKEN} characters, got {len(self.token)} "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )

    @property
    def enabled(self) -> bool:
        """Whether actions can be taken at all (on, with a token)."""
        return self.actions and self.token is not None

    def check_token(self, given: str) -> bool:
        """Whether ``given`` is the token (in constant time)."""
        if self.token is None:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())

    def new_session(self, now: float | None = None) -> str:
        """A session cookie's value: a random id, when it was issued, and their HMAC."""
        sid = secrets.token_urlsafe(18)
        issued = str(int(time.time() if now is None else now))
        return f"{sid}.{issued}.{_mac(self.secret, 'session', sid, issued)}"

    def session(self, cookie: str | None, now: float | None = None) -> str | None:
        """The session id of a valid, unexpired session cookie; ``None`` otherwise."""
        if not self.enabled or not cookie or cookie.count(".") != 2:
            return None
        sid, issued, mac = cookie.split(".")
        if not hmac.compare_digest(mac, _mac(self.secret, "session", sid, issued)):
            return None
        age = (time.time() if now is None else now) - int(issued)
        return sid if 0 <= age <= SESSION_SECONDS else None

    def csrf(self, sid: str) -> str:
        """The CSRF token of session ``sid`` (each form of the page carries it)."""
        return _mac(self.secret, "csrf", sid)

    def check_action(self, request: Request, form: dict[str, str]) -> str:
        """The session id of an action ``request`` with the fields ``form``, once every check
        passed; raises :class:`Refused` naming the first that failed."""
        if not self.enabled:
            raise Refused(
                "actions are off: this view is read-only (start it with --allow-actions and a "
                "token, or create_app(client, actions=True, token=...)); nothing changed"
            )
        check_origin(request)
        sid = self.session(request.cookies.get(SESSION_COOKIE))
        if sid is None:
            raise Refused("not logged in (or the session ended): log in with the token first")
        given = form.get("csrf", "")
        if not given:
            raise Refused("the form has no CSRF token: reload the page and try again")
        if not hmac.compare_digest(given, self.csrf(sid)):
            raise Refused("the form's CSRF token is wrong: reload the page and try again")
        return sid


def check_origin(request: Request) -> None:
    """Refuses a POST from another site: its ``Origin`` (else its ``Referer``; one of them must
    be there) must be the page's own; a browser's ``Sec-Fetch-Site`` must not be ``cross-site``
    or ``same-site``."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site in ("cross-site", "same-site"):
        raise Refused(f"a form posted from another site ({fetch_site}) is refused")
    own = _origin(str(request.base_url))
    origin = request.headers.get("origin")
    if origin is not None:
        if origin.lower() != own:
            raise Refused(f"a form posted from origin {origin!r} is refused: only from {own!r}")
        return
    referer = request.headers.get("referer")
    if referer is None:
        # Browsers send one of the two with a form post: a post with neither proves nothing of
        # where it came from.
        raise Refused(
            f"a form posted with neither Origin nor Referer is refused: only from {own!r}"
        )
    if _origin(referer) != own:
        raise Refused(f"a form posted from {_origin(referer)!r} is refused: only from {own!r}")
