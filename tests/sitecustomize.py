"""``REDISLOCK_TEST_LAYOUT=lean``: the suite run in the lean layout. Every process with tests/ on
its path (the workers the tests start; conftest imports it for pytest's own) lets every lock take
the fast path where it may, whatever its namespace's layout key says. Unset, nothing changes.

``REDISLOCK_TEST_CONFIRM_LINGER``: see :func:`hold_back_confirmations`.

Python imports a ``sitecustomize`` module found on the path as it starts (the ``site`` module)."""

from __future__ import annotations

import os
from typing import Any


def force_layout() -> None:
    if os.environ.get("REDISLOCK_TEST_LAYOUT") != "lean":
        return
    from celery_redislock.core import layout, server_store
    from celery_redislock.core.admin import listing
    from celery_redislock.core.aio import store

    def allowed(client: Any, namespace: str) -> bool:
        return True

    async def allowed_async(client: Any, namespace: str) -> bool:
        return True

    # Where each module holds its own name for it.
    for module in (layout, server_store, listing):
        module.lean_allowed = allowed  # type: ignore[attr-defined]
    layout.lean_allowed_async = allowed_async  # type: ignore[assignment]
    store.lean_allowed_async = allowed_async  # type: ignore[assignment]


def hold_back_confirmations() -> None:
    """``REDISLOCK_TEST_CONFIRM_LINGER=60``: a unique claim's confirmation waits that long for
    the process's next claim (or its end): a test sees which ending of a worker process sends
    what is left."""
    linger = os.environ.get("REDISLOCK_TEST_CONFIRM_LINGER")
    if linger:
        from celery_redislock.core import confirmations

        confirmations.LINGER = float(linger)


force_layout()
hold_back_confirmations()
