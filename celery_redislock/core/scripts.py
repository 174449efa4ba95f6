"""Lua scripts, read from the package's ``lua/`` folder and registered once per process.

redis-py's :class:`~redis.commands.core.Script` runs EVALSHA and falls back to SCRIPT LOAD on
NOSCRIPT, so the scripts survive ``SCRIPT FLUSH``, restarts and failover.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib.resources import files
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError


def _source(name: str) -> bytes:
    return (files(__package__) / "lua" / f"{name}.lua").read_bytes()


# The partials each script is built on, prepended in this order: _time.lua (the server's clock)
# to every script that reads it, lockbase.lua (the lock's keys and the helpers a fast path needs)
# after it. A line ``-- #include common`` in a lock script is replaced by common.lua (the rest of
# the helpers): a script whose fast path comes before that line does not pay, on that path, for
# defining helpers it does not use.
_PARTS: dict[str, tuple[str, ...]] = {
    "acquire": ("_time", "lockbase"),
    "release": ("_time", "lockbase"),
    "release_where": ("_time", "lockbase", "common"),
    "finish": ("_time", "lockbase"),
    "line_sweep": ("_time", "lockbase", "common"),
    "line_sent": ("_time", "lockbase", "common"),
    "line_forget": (),
    "line_drop": ("_time", "lockbase", "common"),
    "line_lapse": ("_time", "lockbase"),
    "renew": ("_time",),
    "holders": ("_time",),
    "unique_claim": ("_time",),
    "rate": ("_time",),
    "notify": (),
    "unique_release": (),
    "redlock_fence": ("_time", "lockbase", "common"),
}
_INCLUDE = re.compile(rb"^-- #include (\w+)$", re.MULTILINE)


def assembled(name: str) -> bytes:
    """Script ``name`` as it is sent to Redis: its partials prepended, its includes expanded."""
    body = b"\n".join([*(_source(part) for part in _PARTS[name]), _source(name)])
    return _INCLUDE.sub(lambda found: _source(found.group(1).decode()), body)


def _load_all() -> dict[str, Script]:
    # A Script made from bytes needs no client: each call names the client it runs on.
    return {name: Script(None, assembled(name)) for name in _PARTS}  # type: ignore[arg-type]


# Read at import, never later: reading package files takes the import system's module locks,
# and a thread holding one when a worker forks its pool children deadlocks those children.
_SCRIPTS = _load_all()


def script(name: str) -> Script:
    """The registered script ``name``, with the partials it is built on prepended."""
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
