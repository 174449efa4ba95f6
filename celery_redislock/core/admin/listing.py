"""Finding locks by a glob over their names (with SCAN, never KEYS)."""

from __future__ import annotations

from collections.abc import Iterator

from ...errors import LockConfigError
from ..keys import DEFAULT_NAMESPACE, check_namespace
from ..layout import lean_allowed
from ..protocol import text
from ..store import RedisClient, backend_errors
from .reading import LockState, describe_lock

__all__ = ["check_pattern", "glob_escape", "iter_locks", "list_locks", "scan_names"]

_SCAN_COUNT = 500


def glob_escape(text: str) -> str:
    """``text`` as a Redis glob that matches only itself."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def check_pattern(pattern: object) -> str:
    if not isinstance(pattern, str) or not pattern:
        raise LockConfigError(
            f"pattern must be a non-empty glob over lock names (e.g. 'sync:*'), got {pattern!r}"
        )
    return pattern


def scan_names(client: RedisClient, namespace: str, pattern: str, suffix: str) -> Iterator[str]:
    """Names in ``namespace`` matching the glob ``pattern`` that have a ``suffix`` key (SCAN)."""
    check_namespace(namespace)
    match = f"{glob_escape(namespace)}:{{{check_pattern(pattern)}}}:{suffix}"
    head, tail = f"{namespace}:{{", f"}}:{suffix}"
    with backend_errors(None):
        for raw in client.scan_iter(match=match, count=_SCAN_COUNT):
            key = text(raw)
            if key.startswith(head) and key.endswith(tail) and len(key) > len(head) + len(tail):
                yield key[len(head) : -len(tail)]


def iter_locks(
    client: RedisClient, namespace: str = DEFAULT_NAMESPACE, pattern: str = "*"
) -> Iterator[str]:
    """Names of the locks in ``namespace`` that have leases, found with SCAN (never KEYS);
    ``pattern`` is a Redis glob over the names (``*``, ``?``, ``[...]``).

    A lock whose leases all lapsed may still be listed until Redis expires its keys; use
    :meth:`Lock.holders` (or :func:`list_locks`) for the live truth. Where the namespace's
    layout is ``lean`` (see ``core/layout.py``), a plain mutex's lease has no leases key: every
    name with a meta key is listed then (one used within ``fence_keep``).

    >>> sorted(iter_locks(redis.Redis()))   # doctest: +SKIP
    ['nightly-report', 'sync:42']
    """
    suffix = "meta" if lean_allowed(client, namespace) else "leases"
    return scan_names(client, namespace, pattern, suffix)


def list_locks(
    client: RedisClient, pattern: str = "*", namespace: str = DEFAULT_NAMESPACE
) -> list[LockState]:
    """Every lock of ``namespace`` whose name matches the glob ``pattern`` and that is held or
    waited for now, sorted by name (one SCAN, then one :func:`describe_lock` per lock).

    >>> [s.name for s in list_locks(redis.Redis(), "sync:*")]   # doctest: +SKIP
    ['sync:42']
    """
    states = (
        describe_lock(client, name, namespace)
        for name in sorted(set(iter_locks(client, namespace, pattern)))
    )
    return [state for state in states if state.holders or state.waited_for]
