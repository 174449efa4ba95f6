"""A small HTTP client for the web view's tests (http.client: no extra dependency), keeping its
session cookie, and the page's CSRF token read from a page."""

from __future__ import annotations

import http.client
import re
from dataclasses import dataclass, field
from urllib.parse import urlencode, urlsplit

TOKEN = "tests-web-token-0123456789"
CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


@dataclass
class Answer:
    status: int
    text: str
    headers: dict[str, str]


@dataclass
class WebClient:
    """Requests to the view at ``base`` (``http://127.0.0.1:PORT/prefix/``)."""

    base: str
    cookie: str = ""
    origin: str = field(default="")

    def __post_init__(self) -> None:
        parts = urlsplit(self.base)
        self.origin = self.origin or f"{parts.scheme}://{parts.netloc}"

    def request(
        self,
        method: str,
        path: str,
        fields: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> Answer:
        parts = urlsplit(self.base + path)
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        sent = {"Cookie": self.cookie} if self.cookie else {}
        if fields is not None:
            body = urlencode(fields).encode()
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        if method == "POST" and self.origin:
            sent["Origin"] = self.origin
        sent.update({k.title(): v for k, v in (headers or {}).items()})
        sent = {k: v for k, v in sent.items() if v and v != "-"}
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            connection.request(method, target, body=body, headers=sent)
            response = connection.getresponse()
            return Answer(
                response.status,
                response.read().decode(),
                {k.lower(): v for k, v in response.getheaders()},
            )
        finally:
            connection.close()

    def get(self, path: str = "") -> Answer:
        return self.request("GET", path)

    def post(self, path: str, fields: dict[str, str], **headers: str) -> Answer:
        return self.request(
            "POST", path, fields, {k.replace("_", "-"): v for k, v in headers.items()}
        )

    def login(self, token: str = TOKEN) -> Answer:
        answer = self.post("login", {"token": token})
        cookie = answer.headers.get("set-cookie", "")
        if answer.status == 303 and cookie:
            self.cookie = cookie.split(";", 1)[0]
        return answer

    def csrf(self) -> str:
        found = CSRF.search(self.get().text)
        assert found, "the page has no CSRF token (not logged in?)"
        return found.group(1)

    def act(self, action: str, **fields: str) -> Answer:
        """An action as the page's script posts it (answered in plain text)."""
        return self.post(
            f"actions/{action}", {"csrf": self.csrf(), **fields}, x_requested_with="fetch"
        )
