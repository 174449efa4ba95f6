"""What the page shows, read through the admin API (:mod:`celery_redislock.core.admin`) and
shaped as the CLI's JSON (:mod:`celery_redislock.core.admin.render`): one page of locks (holders and
their line), one of unique claims, one of names with limits or a pause.

Names are found with SCAN (cheap, even for 10,000 locks), sorted, and only the page shown is
described: a page costs a few round trips per row whatever the number of locks. A search by task
id, or for what is paused, has to describe names to find them: it looks at the first
:data:`TASK_SEARCH_LIMIT` names (of the name search, if any) and says so when there were more.

Synchronous, as the admin API is: the views run it in a worker thread.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from ..core import admin
from ..core.admin import render
from ..core.admin.listing import glob_escape, scan_names
from ..core.lease import RedisClient
from .errors import BadInput

__all__ = [
    "MAX_PER_PAGE",
    "NAMES_KEPT_FOR",
    "NAMES_KEPT_FROM",
    "PER_PAGE",
    "TASK_SEARCH_LIMIT",
    "NameCache",
    "Query",
    "Section",
    "Snapshot",
    "parse_query",
    "read",
]

PER_PAGE = 50
MAX_PER_PAGE = 500
TASK_SEARCH_LIMIT = 2_000
"""The most names a search by task id (or for pauses) describes, in name order."""
MAX_SEARCH = 200
NAMES_KEPT_FOR = 5.0
"""Seconds a listing of names is used again on a large database (:data:`NAMES_KEPT_FROM` keys
or more): the rows shown are read at every request, the names only this often."""
NAMES_KEPT_FROM = 2_000
"""The fewest keys (``DBSIZE``) of a database whose listings are kept: on a smaller one, names
are listed at every request."""

_GLOB = "*?["


@dataclass(frozen=True, slots=True)
class Query:
    """What the page is asked for: a search over names, a task id, a page of each section."""

    search: str = ""
    """A Redis glob over names when it holds ``*``, ``?`` or ``[``; else a substring."""
    task_id: str = ""
    """Only the locks held or waited for by this task id, and its claims."""
    paused: bool = False
    """Only the locks and the names whose lock or rate limit is paused now."""
    page: int = 1
    claims_page: int = 1
    limits_page: int = 1
    per_page: int = PER_PAGE

    @property
    def pattern(self) -> str:
        """The Redis glob that finds the names searched for."""
        if not self.search:
            return "*"
        if any(c in self.search for c in _GLOB):
            return self.search
        return f"*{glob_escape(self.search)}*"

    def params(self, **changed: object) -> dict[str, str]:
        """The query string of this query with ``changed`` (defaults left out)."""
        values = {
            "q": self.search,
            "task": self.task_id,
            "paused": "1" if self.paused else "",
            "page": self.page,
            "cpage": self.claims_page,
            "lpage": self.limits_page,
            "per": self.per_page,
            **changed,
        }
        defaults = {
            "q": "",
            "task": "",
            "paused": "",
            "page": 1,
            "cpage": 1,
            "lpage": 1,
            "per": PER_PAGE,
        }
        return {k: str(v) for k, v in values.items() if v != defaults[k]}


def _whole(params: Mapping[str, str], key: str, default: int, most: int) -> int:
    raw = params.get(key, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise BadInput(f"{key} must be a whole number from 1 to {most:,}, got {raw!r}")
    return int(raw)


def parse_query(params: Mapping[str, str]) -> Query:
    """The query of the page's query string; :class:`BadInput` names a bad parameter."""
    search, task_id = params.get("q", "").strip(), params.get("task", "").strip()
    for key, value in (("q", search), ("task", task_id)):
        if len(value) > MAX_SEARCH:
            raise BadInput(f"{key} must be at most {MAX_SEARCH} characters, got {len(value)}")
    paused = params.get("paused", "")
    if paused not in ("", "0", "1", "on"):
        raise BadInput(f"paused must be 1 (only what is paused) or left out, got {paused!r}")
    pages = 10**9
    return Query(
        search=search,
        task_id=task_id,
        paused=paused in ("1", "on"),
        page=_whole(params, "page", 1, pages),
        claims_page=_whole(params, "cpage", 1, pages),
        limits_page=_whole(params, "lpage", 1, pages),
        per_page=_whole(params, "per", PER_PAGE, MAX_PER_PAGE),
    )


@dataclass(frozen=True, slots=True)
class Section:
    """One page of one list: its rows (the CLI's JSON of each) and where it stands."""

    rows: list[dict[str, Any]]
    total: int
    """How many matched (of the names looked at, for a search by task id)."""
    page: int
    per_page: int
    looked_at: int | None = None
    """A search by task id or for pauses: how many names it described (``None``: every one)."""
    names: int = 0
    """How many names the name search found."""

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.per_page))

    @property
    def first(self) -> int:
        """The place of the first row shown (1-based; 0 when none)."""
        return (self.page - 1) * self.per_page + 1 if self.rows else 0

    @property
    def last(self) -> int:
        return self.first + len(self.rows) - 1 if self.rows else 0

    @property
    def partial(self) -> bool:
        """A search by task id or for pauses that did not look at every name."""
        return self.looked_at is not None and self.looked_at < self.names


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one look at Redis found, for the page and the JSON view."""

    namespace: str
    query: Query
    locks: Section
    claims: Section
    limits: Section


def _page_of(names: list[str], query: Query, page: int) -> list[str]:
    start = (page - 1) * query.per_page
    return names[start : start + query.per_page]


def _section(
    names: list[str],
    describe: Callable[[str], dict[str, Any] | None],
    query: Query,
    page: int,
    matches: Callable[[dict[str, Any]], bool] | None = None,
) -> Section:
    """A page of ``names`` described; with ``matches`` (a search by task id), the names are
    described in order (up to :data:`TASK_SEARCH_LIMIT`) and the page taken from the matches."""
    if matches is None:
        rows = [row for row in map(describe, _page_of(names, query, page)) if row is not None]
        return Section(rows, len(names), page, query.per_page, names=len(names))
    looked = names[:TASK_SEARCH_LIMIT]
    found = [row for row in map(describe, looked) if row is not None and matches(row)]
    start = (page - 1) * query.per_page
    return Section(
        found[start : start + query.per_page],
        len(found),
        page,
        query.per_page,
        looked_at=len(looked),
        names=len(names),
    )


def _sorted(found: Iterable[str]) -> list[str]:
    return sorted(set(found))


class NameCache:
    """Listings of names, kept for :data:`NAMES_KEPT_FOR` seconds on a large database.

    Listing the names is most of what a page costs with many keys: each SCAN walks the whole
    database (an empty listing too) and hands back every name, each parsed, and the page asks
    again every second while it is open. On a database of :data:`NAMES_KEPT_FROM` keys or more
    (``DBSIZE``), a listing is used again for ``kept_for`` seconds: the rows of the page shown
    are still read at every request; only a lock taken (or gone) since the listing shows up (or
    leaves) up to that many seconds late. Shared by the requests of one app (worker threads)."""

    def __init__(self, kept_for: float = NAMES_KEPT_FOR, kept_from: int = NAMES_KEPT_FROM) -> None:
        self.kept_for = kept_for
        self.kept_from = kept_from
        self._found: dict[tuple[str, ...], tuple[float, list[str]]] = {}
        self._large: tuple[float, bool] | None = None
        self._guard = threading.Lock()

    def names(
        self, client: RedisClient, key: tuple[str, ...], listing: Callable[[], list[str]]
    ) -> list[str]:
        """The names ``listing`` finds for ``key``: as kept, if kept less than ``kept_for``
        seconds ago."""
        now = time.monotonic()
        with self._guard:
            kept = self._found.get(key)
        if kept is not None and now - kept[0] < self.kept_for:
            return kept[1]
        names = listing()
        large = self._is_large(client, now)
        with self._guard:
            if large:
                if len(self._found) >= _MAX_KEPT:  # searches vary: keep a bounded few
                    self._found.clear()
                self._found[key] = (now, names)
            else:
                self._found.pop(key, None)
        return names

    def _is_large(self, client: RedisClient, now: float) -> bool:
        """Whether the database holds ``kept_from`` keys or more (asked every ``kept_for``
        seconds at most)."""
        with self._guard:
            known = self._large
        if known is not None and now - known[0] < self.kept_for:
            return known[1]
        try:
            large = int(client.dbsize()) >= self.kept_from
        except redis.ResponseError:  # DBSIZE not allowed (ACL): listings are kept
            large = True
        with self._guard:
            self._large = (now, large)
        return large


_MAX_KEPT = 32


def _listed(
    client: RedisClient,
    cache: NameCache | None,
    key: tuple[str, ...],
    listing: Callable[[], list[str]],
) -> list[str]:
    return listing() if cache is None else cache.names(client, key, listing)


def _lock_row(client: RedisClient, namespace: str, name: str) -> dict[str, Any]:
    state = admin.describe_lock(client, name, namespace)
    limits = admin.describe_rate(client, name, namespace)
    # The CLI's `show --json` of the lock, and `list --json`'s cap and pause; and the lock's
    # limit (2 or more), as its holders' records carry it (None: one at a time, or unknown).
    limit = max((_limit_of(h.info) for h in state.holders), default=0)
    return {
        **render.lock_dict(state, detail=True),
        **render.live_dict(limits),
        "limit": limit or None,
    }


def _limit_of(info: Mapping[str, str]) -> int:
    value = info.get("limit", "")
    return int(value) if value.isdigit() else 0


def _claim_row(client: RedisClient, namespace: str, name: str) -> dict[str, Any] | None:
    claim = admin.describe_claim(client, name, namespace)
    return None if claim is None else render.claim_dict(claim)


def _limits_row(client: RedisClient, namespace: str, name: str) -> dict[str, Any]:
    return render.rate_dict(admin.describe_rate(client, name, namespace))


def _has_task(task_id: str) -> Callable[[dict[str, Any]], bool]:
    def matches(row: dict[str, Any]) -> bool:
        if row.get("task_id") == task_id:  # a claim
            return True
        people = [*row.get("holders", ()), *row.get("waiters", ())]
        return any(p.get("task_id") == task_id for p in people)

    return matches


def _is_paused(row: dict[str, Any]) -> bool:
    return bool(row.get("paused_for") or row.get("lock_paused_for"))


def _all_of(*tests: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
    return lambda row: all(test(row) for test in tests)


def _empty(query: Query) -> Section:
    return Section([], 0, 1, query.per_page)


def read(
    client: RedisClient, namespace: str, query: Query, cache: NameCache | None = None
) -> Snapshot:
    """One look at the locks, claims and limits of ``namespace`` that ``query`` asks for; with
    ``cache``, the names as listed up to a few seconds ago on a large database.

    Raises the admin API's errors: ``LockConfigError`` for a bad pattern, ``LockBackendError``
    when Redis fails."""
    pattern = query.pattern
    task = [_has_task(query.task_id)] if query.task_id else []
    paused = [_is_paused] if query.paused else []
    # A lock with leases, or with a line and no lease (paused, or between two holders).
    lock_names = _listed(
        client,
        cache,
        (namespace, pattern, "locks"),
        lambda: _sorted(
            [
                *admin.iter_locks(client, namespace, pattern),
                *scan_names(client, namespace, pattern, "queue"),
            ]
        ),
    )
    locks = _section(
        lock_names,
        lambda n: _lock_row(client, namespace, n),
        query,
        query.page,
        _all_of(*task, *paused) if task or paused else None,
    )
    if query.paused:  # a claim is never paused
        claims = _empty(query)
    else:
        claim_names = _listed(
            client,
            cache,
            (namespace, pattern, "claims"),
            lambda: _sorted(admin.iter_claims(client, namespace, pattern)),
        )
        claims = _section(
            claim_names,
            lambda n: _claim_row(client, namespace, n),
            query,
            query.claims_page,
            task[0] if task else None,
        )
    if query.task_id:  # limits belong to no task
        limits = _empty(query)
    else:
        limit_names = _listed(
            client,
            cache,
            (namespace, pattern, "limits"),
            lambda: _sorted(
                [
                    *scan_names(client, namespace, pattern, "limits"),
                    *scan_names(client, namespace, pattern, "bucket"),
                ]
            ),
        )
        limits = _section(
            limit_names,
            lambda n: _limits_row(client, namespace, n),
            query,
            query.limits_page,
            _is_paused if query.paused else None,
        )
    return Snapshot(namespace, query, locks, claims, limits)
