"""Operating on locks from outside their holders: list them, describe a holder, free a whole
namespace. What the pytest plugin and the integrations call; never imports a framework."""

from __future__ import annotations

from collections.abc import Iterator

from .keys import DEFAULT_NAMESPACE, check_namespace, name_from_leases_key
from .lease import Holder, RedisClient, backend_errors
from .protocol import text

__all__ = ["TEST_HOLDER", "describe_holder", "iter_locks", "release_all"]

# Who a lease taken by the test helpers' ``hold_lock`` says it is (``holder.info["task_id"]``).
TEST_HOLDER = "pytest"

_DELETE_BATCH = 500


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
            name = name_from_leases_key(namespace, text(key))
            if name is not None:
                yield name


def release_all(client: RedisClient, namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    """Frees every lock of ``namespace``: deletes all its keys (leases, metadata, waiting lines),
    found with SCAN. Returns the names of the locks that had leases.

    Fencing tokens start over afterwards; holders still running find their leases lost. Keys of
    other namespaces and other data are left alone.

    >>> release_all(redis.Redis.from_url(url))   # doctest: +SKIP
    ['sync:42']
    """
    check_namespace(namespace)
    names = sorted(set(iter_locks(client, namespace)))
    batch: list[bytes | str] = []
    with backend_errors(None):
        for key in client.scan_iter(match=f"{_glob_escape(namespace)}:*", count=_DELETE_BATCH):
            batch.append(key)
            if len(batch) >= _DELETE_BATCH:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
    return names


def describe_holder(holder: Holder) -> str:
    """One line about a lease for failure messages: who holds it, how, where, for how long.

    >>> describe_holder(lock.holders()[0])   # doctest: +SKIP
    'task 9b1c… (tasks.sync_customer): write lease, pid 4242 on web-1, expires in 14.2s'
    """
    info = holder.info
    if info.get("task_id") == TEST_HOLDER:
        who = "the test itself (hold_lock)"
    else:
        who = f"task {info['task_id']}" if "task_id" in info else f"lease {holder.token}"
        if "task" in info:
            who += f" ({info['task']})"
    how = [f"{holder.mode} lease"]
    if holder.count > 1:
        how.append(f"entered {holder.count} times")
    if "pid" in info:
        how.append(f"pid {info['pid']}" + (f" on {info['host']}" if "host" in info else ""))
    how.append(f"expires in {holder.expires_in:.1f}s")
    return f"{who}: {', '.join(how)}"
