"""Lua scripts, read from the package's ``lua/`` folder and registered once per process.

redis-py's :class:`~redis.commands.core.Script` runs EVALSHA and falls back to SCRIPT LOAD on
NOSCRIPT, so the scripts survive ``SCRIPT FLUSH``, restarts and failover.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from redis.commands.core import Script


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
