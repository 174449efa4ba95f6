"""Lua scripts, read from the package's ``lua/`` folder and registered once per process.

A script is ``lua/<name>.lua``; a part, ``lua/_<name>.lua``, holds helpers shared by scripts. A
line ``-- #include _<name>.lua`` is replaced by that part (see :func:`assembled`) where it
stands, so a script's fast path can come before helpers it does not need (each run pays for
their definitions). Scripts run by EVALSHA, loaded again on NOSCRIPT (``SCRIPT FLUSH``, restarts
and failover).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib.resources import files
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError

_LUA = files(__package__) / "lua"
# `-- #include _part.lua` alone on a line: that part's text goes in its place.
_INCLUDE = re.compile(rb"^-- #include (\S*)$", re.MULTILINE)
_PART = re.compile(r"_[a-z0-9_]+\.lua")


class ScriptSourceError(LookupError):
    """A script includes a part that is not in ``core/lua`` (or not named as a part)."""


def _source(file: str) -> bytes:
    return (_LUA / file).read_bytes()


def _assemble(name: str) -> tuple[bytes, tuple[str, ...]]:
    """Script ``name``'s text as sent to Redis, and the parts in it, in the order they went in."""
    included: list[str] = []

    def expand(file: str, chain: str) -> bytes:
        def include(found: re.Match[bytes]) -> bytes:
            part = found.group(1).decode()
            where = f"{chain} -> {part}"
            if not _PART.fullmatch(part) or not (_LUA / part).is_file():
                raise ScriptSourceError(
                    f"{name}.lua: {chain} includes {part!r}, which is not a part in "
                    "celery_redislock/core/lua (a part is a file named _<name>.lua)"
                )
            if part in included:  # each part once: its helpers are in scope already
                return f"-- ({part}: included above)".encode()
            included.append(part)
            return expand(part, where).rstrip(b"\n")

        return _INCLUDE.sub(include, _source(file))

    return expand(f"{name}.lua", f"{name}.lua"), tuple(included)


def assembled(name: str) -> bytes:
    """Script ``name`` as it is sent to Redis: each ``-- #include _part.lua`` line replaced by
    that part, whose own includes are expanded first; a part already in is not put in again."""
    return _assemble(name)[0]


def includes(name: str) -> tuple[str, ...]:
    """The parts script ``name`` is built with (file names), in the order their includes are met."""
    return _assemble(name)[1]


# Every .lua file in lua/ whose name does not start with "_" is a script; the others are parts.
NAMES: tuple[str, ...] = tuple(
    sorted(
        entry.name.removesuffix(".lua")
        for entry in _LUA.iterdir()
        if entry.name.endswith(".lua") and not entry.name.startswith("_")
    )
)


# Read at import, never later: reading package files takes the import system's module locks,
# and a thread holding one when a worker forks its pool children deadlocks those children.
# A Script made from bytes needs no client: each call names the client it runs on.
_SCRIPTS = {name: Script(None, assembled(name)) for name in NAMES}  # type: ignore[arg-type]


def script(name: str) -> Script:
    """The registered script ``name``, assembled (see :func:`assembled`)."""
    return _SCRIPTS[name]


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


async def run_async(
    name: str, client: Any, keys: Sequence[str | bytes], args: Sequence[str]
) -> Any:
    """:func:`run` on redis-py's asyncio client (``redis.asyncio.Redis`` or ``RedisCluster``):
    the same script, EVALSHA first, loaded on NOSCRIPT."""
    registered = script(name)
    try:
        return await client.execute_command("EVALSHA", registered.sha, len(keys), *keys, *args)
    except NoScriptError:
        registered.sha = await client.script_load(registered.script)
        return await client.execute_command("EVALSHA", registered.sha, len(keys), *keys, *args)


_DENIED_AT = re.compile(r"([0-9a-f]{40}).*@user_script:\s*(\d+)", re.DOTALL)
_CALL = re.compile(r"redis\.call\('([A-Z]+)'")


def explain_denial(error: BaseException) -> str | None:
    """For an ACL refusal inside one of our scripts (Redis names only the script's line), the
    command that line runs and the permission it needs; ``None`` for any other error."""
    text = str(error)
    if "can't run this command" not in text and "o permissions" not in text:
        return None
    found = _DENIED_AT.search(text)
    if found is None:
        return None
    sha, line = found.group(1), int(found.group(2))
    for registered in _SCRIPTS.values():
        if registered.sha == sha:
            raw = registered.script
            lines = (raw if isinstance(raw, str) else bytes(raw).decode()).splitlines()
            call = _CALL.search(lines[line - 1]) if 0 < line <= len(lines) else None
            if call is None:
                return None
            command = call.group(1)
            if "key" in text:
                return f"the Redis user may not touch this lock's keys (its {command} call)"
            return f"the Redis user lacks the permission +{command.lower()} (ACL)"
    return None
