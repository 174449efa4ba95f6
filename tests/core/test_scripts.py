"""The Lua scripts' assembly (core/scripts.py): every script assembles, every include names a
part that exists, no part goes in twice, each part's header names what it defines, no helper is
defined twice, and luacheck finds nothing (when it is installed: `make lint` runs it too). Fast:
no Redis."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from celery_redislock.core import scripts
from celery_redislock.core.scripts import NAMES, ScriptSourceError, assembled, includes

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "celery_redislock" / "core" / "lua"
PARTS = sorted(path.name for path in LUA.glob("_*.lua"))
_TOP_LOCAL = re.compile(r"^local (?:function )?([\w, ]+?)\s*(?:=|\(|$)", re.MULTILINE)
_DEFINES = re.compile(r"^-- Defines: (.*?)\.$", re.MULTILINE | re.DOTALL)
_REDIS_GLOBALS = ["redis", "KEYS", "ARGV", "cjson", "cmsgpack", "struct", "bit"]


def _top_level_names(text: str) -> list[str]:
    names: list[str] = []
    for found in _TOP_LOCAL.finditer(text):
        names += [name.strip() for name in found.group(1).split(",")]
    return names


def test_the_scripts_are_the_files_not_named_as_parts() -> None:
    assert set(NAMES) == {p.stem for p in LUA.glob("*.lua")} - {p.stem for p in LUA.glob("_*")}
    assert {"acquire", "release", "renew", "notify"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_script_assembles_with_each_part_once(name: str) -> None:
    text = assembled(name).decode()
    assert "-- #include" not in text, "an include left unresolved"
    parts = includes(name)
    assert len(parts) == len(set(parts))
    for part in PARTS:
        # Each part's first line names it: it is in the script once, or not at all.
        assert text.count(f"\n-- {part} (a part") + text.startswith(f"-- {part} (a part") == (
            1 if part in parts else 0
        ), part
    # The header of the script itself is first: its KEYS and ARGV.
    assert text.startswith(f"-- {name}.lua: ")
    header = text.split("\n\n", 1)[0]
    assert "\n-- KEYS: " in header and "\n-- ARGV: " in header, header


def test_a_part_names_what_it_defines_and_nothing_is_defined_twice() -> None:
    defined_by: dict[str, list[str]] = {}
    functions: dict[str, str] = {}
    for path in sorted(LUA.glob("*.lua")):
        text = path.read_text()
        names = defined_by[path.name] = _top_level_names(text)
        if path.name.startswith("_"):
            header = _DEFINES.search(text)
            assert header, f"{path.name}: no '-- Defines: ...' line in its header"
            listed = [n.strip() for n in header.group(1).replace("\n--", " ").split(",")]
            assert listed == names, f"{path.name}: its header says {listed}, it defines {names}"
        # Each helper is written once, in one file.
        for name in re.findall(r"^\s*local function (\w+)", text, re.MULTILINE):
            assert name not in functions, f"{name}: in {functions[name]} and {path.name}"
            functions[name] = path.name
    for name in NAMES:
        # A script does not define again a name of a part it is built with.
        mine = set(defined_by[f"{name}.lua"])
        for part in includes(name):
            assert not mine & set(defined_by[part]), (name, part, mine & set(defined_by[part]))


def test_every_part_is_used() -> None:
    used = {part for name in NAMES for part in includes(name)}
    assert used == set(PARTS)


def test_an_include_of_a_missing_part_names_the_script_and_the_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = scripts._source
    fake = {"broken.lua": b"-- broken.lua: a test\n-- #include _lock.lua\n-- #include _gone.lua\n"}
    monkeypatch.setattr(scripts, "_source", lambda file: fake.get(file) or real(file))
    with pytest.raises(ScriptSourceError, match=r"broken\.lua: broken\.lua includes '_gone\.lua'"):
        assembled("broken")
    fake["broken.lua"] = b"-- #include lockbase\n"
    with pytest.raises(ScriptSourceError, match="not a part"):
        assembled("broken")


def test_a_part_included_again_goes_in_once(monkeypatch: pytest.MonkeyPatch) -> None:
    real = scripts._source
    fake = {"twice.lua": b"-- #include _lease.lua\nlocal x = 1\n-- #include _lock.lua\n"}
    monkeypatch.setattr(scripts, "_source", lambda file: fake.get(file) or real(file))
    text = assembled("twice").decode()
    assert text.count("-- _lock.lua (a part") == 1
    assert "-- (_lock.lua: included above)" in text
    assert includes("twice") == ("_lease.lua", "_lock.lua", "_ids.lua", "_lean.lua", "_time.lua")


_LUACHECK = shutil.which("luacheck")


@pytest.mark.skipif(_LUACHECK is None, reason="luacheck is not installed (make lint installs it)")
def test_luacheck_passes_on_the_files() -> None:
    done = subprocess.run(
        [str(_LUACHECK), "--no-color", "-q", "celery_redislock/core/lua"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(_LUACHECK is None, reason="luacheck is not installed (make lint installs it)")
def test_no_assembled_script_reaches_a_global_redis_does_not_give(tmp_path: Path) -> None:
    """As Redis runs them: a helper used before the include that defines it, or never included,
    is a global here (and an error in Redis, on that path only)."""
    for name in NAMES:
        (tmp_path / f"{name}.lua").write_bytes(assembled(name))
    done = subprocess.run(
        [
            str(_LUACHECK),
            "--no-config",
            "--no-color",
            "-q",
            "--std",
            "lua51",
            "--read-globals",
            *_REDIS_GLOBALS,
            "--only",
            "111",
            "112",
            "113",
            "--",
            *sorted(str(p) for p in tmp_path.glob("*.lua")),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
