"""What a request gets instead of a page or an action: each a status and a message that names
what was wrong and what is allowed. Nothing has changed when one is raised."""

from __future__ import annotations

__all__ = ["BadInput", "NotFound", "Refused", "WebError"]


class WebError(Exception):
    """A request answered with ``status`` and this message (plain text, for people)."""

    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadInput(WebError):
    """A parameter or a form field is malformed: 400."""

    status = 400


class Refused(WebError):
    """Not allowed: actions are off, no session, a wrong token or CSRF token, a foreign
    origin: 403."""

    status = 403


class NotFound(WebError):
    """Nothing of that name (a lock not held, a claim gone, an unknown action): 404."""

    status = 404
