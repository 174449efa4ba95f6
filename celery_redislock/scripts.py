"""Lua scripts, read from the package's ``lua/`` folder and registered once per process.

redis-py's :class:`~redis.commands.core.Script` runs EVALSHA and falls back to SCRIPT LOAD on
NOSCRIPT, so the scripts survive ``SCRIPT FLUSH``, restarts and failover.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError


def _source(name: str) -> bytes:
    return (files(__package__) / "lua" / f"{name}.lua").read_bytes()


@cache
def script(name: str) -> Script:
    """The registered script ``name``; lock scripts get the shared helpers prepended."""
    body = _source(name)
    if name in ("acquire", "release", "release_where"):
        body = _source("common") + b"\n" + body
    # A Script made from bytes needs no client: each call names the client it runs on.
    return Script(None, body)  # type: ignore[arg-type]


def run(name: str, client: Any, keys: Sequence[str | bytes], args: Sequence[str]) -> Any:
    """Runs script ``name`` on ``client`` with EVALSHA, loading it first if the server lacks it.

    Calls EVALSHA directly rather than through ``Script.__call__``: this is the hot path.
    """
    registered = script(name)
    try:
        return client.execute_command("EVALSHA", registered.sha, len(keys), *keys, *args)
    except NoScriptError:
        registered.sha = client.script_load(registered.script)
        return client.execute_command("EVALSHA", registered.sha, len(keys), *keys, *args)
