"""Looking at locks without taking them."""

from __future__ import annotations

from collections.abc import Iterator

from .keys import DEFAULT_NAMESPACE, check_namespace, name_from_leases_key
from .lock import RedisClient, _text, backend_errors

__all__ = ["iter_locks"]


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def iter_locks(client: RedisClient, namespace: str = DEFAULT_NAMESPACE) -> Iterator[str]:
    """Names of the locks in ``namespace`` that have leases, found with SCAN (never KEYS).

    A lock whose leases all lapsed may still be listed until Redis expires its keys; use
    :meth:`Lock.holders` for the live truth.

    >>> sorted(iter_locks(redis.Redis()))   # doctest: +SKIP
    ['nightly-report', 'sync:42']
    """
    check_namespace(namespace)
    pattern = f"{_glob_escape(namespace)}:{{*}}:leases"
    with backend_errors(None):
        for key in client.scan_iter(match=pattern, count=500):
            name = name_from_leases_key(namespace, _text(key))
            if name is not None:
                yield name
