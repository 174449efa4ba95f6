"""The public API is what users import: each public module's ``__all__`` is documented in
docs/api.md, each of its names has a docstring, and README.md and docs/*.md import from public
modules only (no deep ``core.*`` imports).

No Redis needed: this reads modules and pages.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import celery_redislock
import celery_redislock.integrations.celery as celery_integration

ROOT = Path(__file__).parents[2]
API_PAGE = ROOT / "docs" / "api.md"
PAGES = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts),
]

# The modules users import from; every other module is internal. Keep docs/api.md's table of
# them in step.
PUBLIC = (
    "celery_redislock",
    "celery_redislock.errors",
    "celery_redislock.integrations.celery",
    "celery_redislock.integrations.rq",
    "celery_redislock.core.admin",
    "celery_redislock.asyncio",
    "celery_redislock.web",
    "celery_redislock.contrib.testing",
    "celery_redislock.contrib.pytest",
    "celery_redislock.contrib.redis_server",
    "celery_redislock.contrib.prometheus",
)

# Names the package exported at its top level before its API was narrowed: they still resolve
# there (code written against earlier releases keeps working), but are documented where they live.
MOVED = {
    "LockRequest": "celery_redislock.integrations.celery",
    "client_for": "celery_redislock.integrations.celery",
    "lock_acquired": "celery_redislock.integrations.celery",
    "lock_backend_error": "celery_redislock.integrations.celery",
    "lock_conflict": "celery_redislock.integrations.celery",
    "lock_lost": "celery_redislock.integrations.celery",
    "lock_released": "celery_redislock.integrations.celery",
    "iter_locks": "celery_redislock.core.admin",
    "LockOptions": "celery_redislock.core.options",
    "UniqueOptions": "celery_redislock.core.unique_options",
}

DIRECTIVE = re.compile(r"^\.\. (?P<kind>[\w:]+):: (?P<target>\S+)\s*$")


class ApiPage:
    """What docs/api.md's ``eval-rst`` directives document."""

    def __init__(self, text: str) -> None:
        self.names: set[str] = set()  # dotted names of auto*/py:* directives
        self.whole: set[str] = set()  # automodule with its __all__ members
        self.data_bodies: dict[str, str] = {}  # py:data name -> its description
        current = ""
        lines = text.splitlines()
        for i, line in enumerate(lines):
            found = DIRECTIVE.match(line)
            if not found:
                continue
            kind, target = found["kind"], found["target"]
            options, body = self._block(lines, i + 1)
            if kind == "py:currentmodule":
                current = target
            elif kind == "automodule":
                current = target
                if ":no-members:" not in options:
                    self.whole.add(target)
            elif kind.startswith("auto"):
                self.names.add(target)
            elif kind.startswith("py:"):
                name = f"{current}.{target}" if current else target
                self.names.add(name)
                if kind == "py:data":
                    self.data_bodies[name] = body

    @staticmethod
    def _block(lines: list[str], start: int) -> tuple[list[str], str]:
        """The option lines and the description text of the directive before ``start``."""
        options: list[str] = []
        body: list[str] = []
        for line in lines[start:]:
            if line.strip() and not line.startswith(" "):
                break
            text = line.strip()
            if text.startswith(":") and not body:
                options.append(text)
            elif text:
                body.append(text)
        return options, " ".join(body)

    def documents(self, module: str, name: str) -> bool:
        return f"{module}.{name}" in self.names or module in self.whole


@pytest.fixture(scope="module")
def api() -> ApiPage:
    return ApiPage(API_PAGE.read_text())


def public_names() -> list[tuple[str, str]]:
    return [
        (module, name)
        for module in PUBLIC
        for name in importlib.import_module(module).__all__  # every public module has one
    ]


def _code_like(obj: object) -> bool:
    return inspect.isclass(obj) or inspect.isroutine(obj)


def _own_docstring(obj: object) -> str:
    if inspect.isclass(obj):
        return str(vars(obj).get("__doc__") or "")  # not a base class's
    return inspect.getdoc(obj) or ""


def _attribute_docstring(module: ModuleType, name: str) -> str:
    """The string literal right after ``name = ...`` in the module's source, as autodoc reads."""
    if module.__file__ is None:
        return ""
    body = ast.parse(Path(module.__file__).read_text()).body
    for statement, after in itertools.pairwise(body):
        targets = (
            statement.targets
            if isinstance(statement, ast.Assign)
            else [statement.target]
            if isinstance(statement, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            return after.value.value
    return ""


@pytest.mark.parametrize(
    ("module", "name"), public_names(), ids=[f"{m}.{n}" for m, n in public_names()]
)
def test_each_public_name_is_documented(api: ApiPage, module: str, name: str) -> None:
    obj = getattr(importlib.import_module(module), name)
    # What the top level re-exports is documented once, there or in its home module (the
    # Celery entry points at the top level, the exceptions in celery_redislock.errors).
    where = [module] + [
        other
        for other in PUBLIC
        if "celery_redislock" in (module, other)
        and other != module
        and name in importlib.import_module(other).__all__
        and getattr(importlib.import_module(other), name) is obj
    ]
    assert any(api.documents(other, name) for other in where), (
        f"{module}.{name} is in __all__ but docs/api.md has no directive documenting it"
    )
    if _code_like(obj):
        assert _own_docstring(obj).strip(), f"{module}.{name} has no docstring"
    else:  # data: a py:data directive with a description, or autodoc's attribute docstring
        described = [api.data_bodies.get(f"{other}.{name}", "") for other in where] + [
            _attribute_docstring(importlib.import_module(other), name)
            for other in where
            if other in api.whole
        ]
        assert any(d.strip() for d in described), (
            f"{module}.{name} (data) has no description in docs/api.md"
        )


def test_api_page_lists_only_public_modules(api: ApiPage) -> None:
    # Directives name public paths only, so that moving a module inside the package does not
    # break the reference (nor teach a deep import).
    for name in api.names | api.whole:
        assert name in PUBLIC or name.rsplit(".", 1)[0] in PUBLIC, name
    text = API_PAGE.read_text()
    for module in PUBLIC:
        assert f"`{module}`" in text, f"docs/api.md's table of public modules misses {module}"


IMPORT_LINE = re.compile(
    r"^\s*(?:>>>\s*|\.\.\.\s*)?(?:from\s+(?P<module>celery_redislock[\w.]*)\s+import\s+"
    r"(?P<names>\([^)]*\)|[\w ,]+)|import\s+(?P<plain>celery_redislock[\w.]*))",
    re.M,
)


def _imports(text: str) -> list[tuple[str, list[str]]]:
    found = []
    for match in IMPORT_LINE.finditer(text):
        if match["plain"]:
            found.append((match["plain"], []))
            continue
        listed = match["names"].strip("()").replace("\n", " ")
        names = [n.split(" as ")[0].strip() for n in listed.split(",")]
        found.append((match["module"], [n for n in names if n]))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_import_from_public_modules_only(page: Path) -> None:
    text = page.read_text()
    for module, names in _imports(text):
        if module in PUBLIC:
            continue
        # `from celery_redislock.core import admin`: a public module, imported by its parent
        assert names and all(f"{module}.{n}" in PUBLIC for n in names), (
            f"{page.relative_to(ROOT)} imports from {module}, not a public module "
            f"({', '.join(PUBLIC)})"
        )


def test_the_import_pattern_finds_the_pages_imports() -> None:
    # The test above means something: it sees the forms the pages use.
    assert _imports("from celery_redislock import Lock, RedLock\n") == [
        ("celery_redislock", ["Lock", "RedLock"])
    ]
    assert _imports(">>> from celery_redislock.core import admin\n") == [
        ("celery_redislock.core", ["admin"])
    ]
    assert _imports("import celery_redislock\n") == [("celery_redislock", [])]
    assert _imports("from celery_redislock import (\n    Lock,\n    Lease as L,\n)\n") == [
        ("celery_redislock", ["Lock", "Lease"])
    ]
    seen = [module for page in PAGES for module, _ in _imports(page.read_text())]
    assert "celery_redislock.integrations.rq" in seen
    assert "celery_redislock" in seen


def test_the_top_level_exports_the_core_and_celerys_entry_points() -> None:
    exported = set(celery_redislock.__all__)
    for name in ("Lock", "Lease", "Heartbeat", "RedLock", "RateLimit", "LockNotAcquired"):
        assert name in exported
    for name in ("LockedTask", "install", "lock_for", "lock_workflow", "SKIPPED"):
        assert name in exported
        assert name in celery_integration.__all__
        assert getattr(celery_redislock, name) is getattr(celery_integration, name)
    # Celery's signals share their names with RQ's: the top level does not pick one
    assert not exported & {"lock_conflict", "lock_lost", "lock_acquired", "lock_released"}
    assert not exported & set(MOVED)
    namespace: dict[str, object] = {}
    exec("from celery_redislock import *", namespace)
    assert set(namespace) - {"__builtins__"} == exported


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_name_that_left_the_top_level_still_resolves_there(name: str) -> None:
    home = importlib.import_module(MOVED[name])
    assert getattr(celery_redislock, name) is getattr(home, name)
    assert name in dir(celery_redislock)


def test_an_unknown_top_level_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nonesuch'"):
        celery_redislock.Nonesuch  # noqa: B018


def test_importing_the_package_imports_no_framework() -> None:
    # An RQ or core-only user never loads Celery (the wheel's venv test checks it without
    # Celery installed: tests/test_packaging.py).
    code = (
        "import sys, celery_redislock\n"
        "celery_redislock.Lock, celery_redislock.RedLock, celery_redislock.RateLimit\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'celery', 'kombu', 'billiard', "
        "'rq'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out
