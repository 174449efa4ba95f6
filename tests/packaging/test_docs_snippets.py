"""Every Python example of README.md and docs/ runs, against a real Redis.

Each ```python (or ```py) block runs as a script in a fresh process, each ```pycon block as a
doctest (its printed values checked), in a directory of its own. Marks on the lines just before
a block's fence, as HTML comments (GitHub and the built docs do not show them), say how:

- ``<!-- fragment: why -->``: not run (a fragment on purpose; keep them few);
- ``<!-- continues -->``: run after the page's previous Python block, as one script;
- ``<!-- given: NAME -->``: run after ``PRELUDES[NAME]`` (a block showing the tasks of an app
  set up elsewhere: the quick start's);
- ``<!-- worker: MODULE -->``: run while a real ``celery -A MODULE worker`` (prefork, two
  processes) runs, started in the block's directory.

A block whose first line is ``# name.py`` is also a file of its page: it is written as that file
beside every block of the page, so that a later block (and a worker) imports it. A block that
defines ``test_*`` functions runs under pytest with the package's plugin. Every ``redis://`` URL
is pointed at the test's server (its database kept; each other host named, such as RedLock's
masters, gets a server of its own), so no example reaches a Redis that happens to run on the
machine; ``Redis()`` with no URL is refused for the same reason.

The Celery examples start workers, so like the other worker tests these run on one Redis version
(``celery_server``), emptied before each block.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from helpers import load_factor
from workers import Worker

from celery_redislock.contrib.redis_server import RedisServer

ROOT = Path(__file__).parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts),
]
LANGUAGES = {"python", "py", "pycon"}  # pycon: a doctest

# What a ``given`` mark puts before its block (its URLs pointed at the test's server too).
PRELUDES = {
    # The app of the quick start (docs/quickstart.md, README.md), with no tasks.
    "app": """\
from celery import Celery
import celery_redislock

app = Celery("proj", broker="redis://localhost:6379/0", backend="redis://localhost:6379/0")
celery_redislock.install(app)
app.conf.redislock_url = "redis://localhost:6379/1"
""",
    # A client and the lock core, for a block showing one option of a Lock.
    "client": """\
import redis
from celery_redislock import Lock

client = redis.Redis.from_url("redis://localhost:6379/0")
""",
}

FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)")
MARK = re.compile(r"^\s*<!--\s*(?P<kind>[\w-]+)\s*(?::\s*(?P<value>.*?))?\s*-->\s*$")
MARKS = {"fragment", "continues", "given", "worker"}
MODULE_FILE = re.compile(r"\A# (?P<path>[\w/]+\.py)(?::|\s|$)", re.M)
URL = re.compile(
    r"rediss?://(?:[^@/\s\"',]*@)?(?P<host>[\w.-]+)(?::(?P<port>\d+))?(?:/(?P<db>\d+))?"
)
BARE_CLIENT = re.compile(r"\bRedis\(\s*\)")


@dataclasses.dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int  # of its opening fence, from 1
    language: str
    code: str
    marks: tuple[tuple[str, str], ...]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    def mark(self, kind: str) -> str | None:
        return next((value for k, value in self.marks if k == kind), None)


def blocks_of(page: Path, root: Path = ROOT) -> list[Block]:
    """The Python blocks of ``page``, each with the marks on the lines just before its fence."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = i + 1
        while end < len(lines) and not re.match(
            rf"^\s*{fence[0]}{{{len(fence)},}}\s*$", lines[end]
        ):
            end += 1
        language = opening["info"].lower()  # ```{doctest} blocks are Sphinx's (make docs)
        if language in LANGUAGES:
            marks: list[tuple[str, str]] = []
            before = i - 1
            while before >= 0 and (mark := MARK.match(lines[before])):
                if mark["kind"] not in MARKS:
                    raise ValueError(f"{page}:{before + 1}: unknown mark {mark['kind']!r}")
                if not mark["value"] and mark["kind"] != "continues":
                    raise ValueError(f"{page}:{before + 1}: {mark['kind']} needs a value")
                marks.insert(0, (mark["kind"], mark["value"] or ""))
                before -= 1
            body = [line.removeprefix(indent) for line in lines[i + 1 : end]]
            found.append(
                Block(
                    page=str(page.relative_to(root)),
                    line=i + 1,
                    language=language,
                    code="\n".join(body) + "\n",
                    marks=tuple(marks),
                )
            )
        i = end + 1
    return found


BLOCKS = [block for page in PAGES for block in blocks_of(page)]


def script_of(block: Block, blocks: list[Block] = BLOCKS) -> str:
    """The block's code, after the code it continues (``blocks``: those of every page)."""
    if (prelude := block.mark("given")) is not None:
        assert prelude in PRELUDES, (
            f"{block.id}: no prelude {prelude!r} (PRELUDES: {list(PRELUDES)})"
        )
        return PRELUDES[prelude] + "\n" + block.code
    if block.mark("continues") is not None:
        before = [b for b in blocks if b.page == block.page and b.line < block.line]
        assert before, f"{block.id} continues, but is its page's first Python block"
        scripts = {before[-1].language, block.language} <= {"python", "py"}
        assert scripts, f"{block.id}: only a script continues a script"
        return script_of(before[-1], blocks) + "\n" + block.code
    return block.code


def hosts_in(*texts: str) -> list[str]:
    """The ``host:port`` of every Redis URL in ``texts``, in order, once each."""
    found = [f"{url['host']}:{url['port'] or 6379}" for text in texts for url in URL.finditer(text)]
    return list(dict.fromkeys(found))


def pointed_at(code: str, ports: dict[str, int]) -> str:
    """``code`` with every Redis URL on the test's server of its ``host:port`` (``ports``), the
    database of the URL kept."""

    def local(url: re.Match[str]) -> str:
        port = ports[f"{url['host']}:{url['port'] or 6379}"]
        return f"redis://127.0.0.1:{port}/{url['db'] or 0}"

    code = URL.sub(local, code)
    # A metrics server the example starts: on a free port, not on the example's.
    return re.sub(r"start_http_server\(\d+\)", "start_http_server(0)", code)


def test_every_python_block_is_found() -> None:
    """The parser misses no block: as many as a plain count of the opening fences."""
    for page in PAGES:
        text = page.read_text()
        fences = re.findall(r"^\s*```(?:python|py|pycon)\s*$", text, re.M)
        assert len(blocks_of(page)) == len(fences), page
    assert any(b.page == "README.md" for b in BLOCKS)


def test_marks_are_read(tmp_path: Path) -> None:
    """The marks on the lines before a fence, and only those, apply to its block; a block that
    continues another runs after it (and after what that one continues)."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- fragment: one option -->\n\n```python\nshown()\n```\n"
        "```python\na = 1\n```\n"
        "<!-- continues -->\n```py\nb = a\n```\n"
        "- a list item:\n\n  <!-- continues -->\n  ```python\n  c = b\n  ```\n"
        "<!-- given: app -->\n<!-- worker: proj -->\n```pycon\n>>> app.main\n'proj'\n```\n"
        "```sh\nnot = python\n```\n"
    )
    blocks = blocks_of(page, root=tmp_path)
    assert [(b.line, b.language, b.marks) for b in blocks] == [
        (3, "python", ()),  # a blank line between: the mark is not the block's
        (6, "python", ()),
        (10, "py", (("continues", ""),)),
        (16, "python", (("continues", ""),)),
        (21, "pycon", (("given", "app"), ("worker", "proj"))),
    ]
    assert blocks[3].code == "c = b\n"  # the list item's indent removed
    # py continues python: one script, a then b then c.
    assert script_of(blocks[3], blocks) == "a = 1\n\nb = a\n\nc = b\n"
    assert script_of(blocks[4], blocks) == PRELUDES["app"] + "\n>>> app.main\n'proj'\n"
    page.write_text("<!-- fragmant: a typo -->\n```python\nx\n```\n")
    with pytest.raises(ValueError, match="unknown mark 'fragmant'"):
        blocks_of(page, root=tmp_path)


@pytest.fixture
def snippet_redis(celery_server: RedisServer) -> Iterator[RedisServer]:
    client = redis.Redis.from_url(celery_server.url)
    client.flushall()
    yield celery_server
    client.flushall()
    client.close()


def _params() -> Iterator[object]:
    for block in BLOCKS:
        marks: list[pytest.MarkDecorator] = []
        if (why := block.mark("fragment")) is not None:
            marks.append(pytest.mark.skip(reason=f"a fragment: {why}"))
        if block.mark("worker") is not None:
            marks.append(pytest.mark.slow)
        yield pytest.param(block, id=block.id, marks=marks)


@pytest.mark.parametrize("block", list(_params()))
def test_block_runs(
    block: Block, snippet_redis: RedisServer, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    code = script_of(block)
    assert not BARE_CLIENT.search(code), f"{block.id}: name the Redis URL (Redis.from_url(...))"
    with contextlib.ExitStack() as stack:
        files = {
            tmp_path / named["path"]: other.code
            for other in BLOCKS
            if other.page == block.page and (named := MODULE_FILE.match(other.code))
        }  # the page's files (``# proj.py``), beside the block
        # The first Redis named is the test's server; each other one (RedLock's masters) a server
        # of its own, started for the block.
        binary = snippet_redis.binary
        ports = {
            host: (snippet_redis if i == 0 else stack.enter_context(RedisServer(binary))).port
            for i, host in enumerate(hosts_in(code, *files.values()))
        }
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(pointed_at(text, ports))
        url = f"redis://127.0.0.1:{snippet_redis.port}/0"
        env = {**os.environ, "REDIS_URL": url, "PYTHONPATH": str(tmp_path)}
        if (module := block.mark("worker")) is not None:
            start: Callable[..., Worker] = request.getfixturevalue("workers")
            start(app=module, concurrency=2, env={"PYTHONPATH": str(tmp_path)})
        if block.language == "pycon":
            (tmp_path / "snippet.txt").write_text(pointed_at(code, ports))
            command = [sys.executable, "-m", "doctest", "snippet.txt"]
        elif re.search(r"^def test_", code, re.M):
            (tmp_path / "test_snippet.py").write_text(pointed_at(code, ports))
            plugins = ["-p", "celery_redislock.contrib.pytest", "-p", "no:cacheprovider"]
            command = [sys.executable, "-m", "pytest", *plugins, "-q", "test_snippet.py"]
        else:
            (tmp_path / "snippet.py").write_text(pointed_at(code, ports))
            command = [sys.executable, "snippet.py"]
        # 120 s on an idle machine, stretched by the load up to pytest's own limit of 300 s for
        # a test (the task line's tenants block parks 103 calls: 1.5 s alone, with 2 CPU
        # burners 2.3 s, and over 120 s once in a loaded suite).
        timeout = 120 * min(load_factor(), 2.4)
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, (
            f"{block.id} exited {done.returncode}:\n{done.stdout}{done.stderr}\n--- the code run:\n"
            + pointed_at(code, ports)
        )
