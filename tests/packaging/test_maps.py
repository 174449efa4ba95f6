"""Maps that cannot drift: the map of the package in docs/design.md names every module of the
package and every Lua script, the map of the tests in CONTRIBUTING.md names every test folder,
and neither names one that is gone. The paths the docs give into the checkout exist,
every test file sits in a folder of the map, and no test imports from ``conftest``.

A map is a table: its first column names what a row is about, in backticks (a module as
``core.lock``, ``celery_redislock.core.lock`` or ``core/lock.py``, a package by its own name; a
test folder as ``tests/core/``). A new module, script or test folder fails here until its line
is written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "celery_redislock"
TESTS = ROOT / "tests"
LUA = PACKAGE / "core" / "lua"

# Pages whose paths into the checkout must exist (CHANGELOG.md is history: it keeps old paths).
PAGES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "Makefile",
    ROOT / "pyproject.toml",
    ROOT / "docker-compose.yml",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted(ROOT.glob("*/README.md")),
]


def section(page: Path, heading: str) -> str:
    """The text under the ``## heading`` of ``page``, up to the next heading of that level."""
    text = page.read_text()
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"{page.name} has no section '## {heading}'"
    return match.group(1)


def rows(text: str) -> list[tuple[str, str]]:
    """The rows of the tables in ``text`` as (first cell, the rest), header and rule rows left
    out."""
    found = []
    for line in text.splitlines():
        if line.startswith("|"):
            first, rest = line.split("|", 2)[1:]
            if first.strip() and not set(first) <= set("-: ") and first.strip() != "module":
                found.append((first.strip(), rest))
    return found


def ticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def package_modules() -> set[str]:
    """Every module of the package by its dotted name (a package by its own name)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def as_module(name: str) -> str:
    """A module's dotted name from how a map may write it: ``core.lock``,
    ``celery_redislock.core.lock``, ``core/lock.py``, or a package as ``core/run/``."""
    name = name.strip("/").removesuffix(".py").replace("/", ".")
    return name if name.split(".")[0] == PACKAGE.name else f"{PACKAGE.name}.{name}"


def is_module_token(token: str) -> bool:
    """Whether a backticked token of a first column names a module (not a script, a glob)."""
    return re.fullmatch(r"[\w./]+", token) is not None and not token.endswith(".lua")


def named_modules() -> set[str]:
    """The modules the first column of the design map names."""
    cells = [first for first, _ in rows(section(ROOT / "docs" / "design.md", "The package"))]
    return {as_module(t) for cell in cells for t in ticked(cell) if is_module_token(t)}


def mapped_modules() -> set[str]:
    """The modules the design map names: in the first column, and in a row about one package,
    its own modules named in the row (``Its modules: `job`, `queue` ...``)."""
    mapped = named_modules()
    modules = package_modules()
    for first, rest in rows(section(ROOT / "docs" / "design.md", "The package")):
        names = [as_module(t) for t in ticked(first) if is_module_token(t)]
        if len(names) == 1 and (PACKAGE.parent / names[0].replace(".", "/")).is_dir():
            mapped |= {f"{names[0]}.{t}" for t in ticked(rest)} & modules
    return mapped


def test_every_module_of_the_package_is_in_the_design_map() -> None:
    missing = sorted(package_modules() - mapped_modules())
    assert not missing, (
        f"docs/design.md's map of the package ('## The package') lacks {missing}: "
        "add a row (first column: the module in backticks; then what it holds)"
    )


def test_the_design_map_names_no_module_that_is_gone() -> None:
    gone = sorted(named_modules() - package_modules())
    assert not gone, f"docs/design.md's map names modules that do not exist: {gone}"


def test_every_lua_script_is_in_the_design_map() -> None:
    named = {t for t in ticked(section(ROOT / "docs" / "design.md", "The package"))}
    scripts = {p.name for p in LUA.glob("*.lua")}
    assert scripts, f"no Lua scripts in {LUA}"
    assert not sorted(scripts - named), f"docs/design.md's map lacks {sorted(scripts - named)}"
    gone = sorted(n for n in named if n.endswith(".lua") and "*" not in n and n not in scripts)
    assert not gone, f"docs/design.md's map names scripts that do not exist: {gone}"


def folders_of_tests() -> set[str]:
    return {
        f"tests/{p.name}/"
        for p in TESTS.iterdir()
        if p.is_dir() and not p.name.startswith((".", "__"))
    }


def mapped_test_folders() -> set[str]:
    cells = [
        first for first, _ in rows(section(ROOT / "CONTRIBUTING.md", "How the tests are laid out"))
    ]
    return {t for cell in cells for t in ticked(cell) if re.fullmatch(r"tests/\w+/", t)}


def test_every_test_folder_is_in_the_contributing_map() -> None:
    missing = sorted(folders_of_tests() - mapped_test_folders())
    assert not missing, (
        f"CONTRIBUTING.md's map of the tests ('## How the tests are laid out') lacks {missing}: "
        "add a row (the folder, what it holds, which make target runs it)"
    )


def test_the_contributing_map_names_no_folder_that_is_gone() -> None:
    gone = sorted(mapped_test_folders() - folders_of_tests())
    assert not gone, f"CONTRIBUTING.md's map of the tests names folders that do not exist: {gone}"


def test_every_test_file_is_in_a_folder() -> None:
    flat = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not flat, f"test files directly in tests/ (move each to the folder of its part): {flat}"


def test_no_test_imports_from_conftest() -> None:
    """Each folder may have a conftest.py: the module named ``conftest`` at import time is the
    one pytest loaded last, so shared helpers live in tests/helpers.py."""
    pattern = re.compile(r"^\s*(from conftest import|import conftest)", re.M)
    found = sorted(
        str(p.relative_to(ROOT)) for p in TESTS.rglob("*.py") if pattern.search(p.read_text())
    )
    assert not found, f"these import from conftest (import from helpers instead): {found}"


def test_the_paths_the_docs_give_into_the_checkout_exist() -> None:
    """A path a page gives into the package, the tests, the benchmarks, the demos or the
    examples (``tests/core/test_lock.py``, ``benchmarks/soak/``) is where it says; patterns
    (``tests/rq/test_rq_*.py``) are left out."""
    path = re.compile(
        r"(?<![\w/.-])((?:tests|benchmarks|celery_redislock|demos|examples)/[\w./-]*[\w/])"
        r"(?![\w/*-]|\.\w)"
    )
    wrong = [
        f"{page.relative_to(ROOT)}: {found}"
        for page in PAGES
        for found in sorted(set(path.findall(page.read_text())))
        if not (ROOT / found).exists()
    ]
    assert not wrong, f"paths that do not exist: {wrong}"
