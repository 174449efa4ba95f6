"""The built wheel, installed the way users install it: into fresh virtual environments.

One wheel is built for the module, from a copy of the source tree without build leftovers (a
stale ``build/`` directory would otherwise leak old modules into the wheel). Then:

- its contents and metadata (package data, PEP 639 licence, dependencies, nothing extra);
- ``pip install <wheel>`` alone: the core imports and locks with redis-py only, and the Celery
  names say which extra to install;
- ``pip install "<wheel>[web]"``: ``redislock web`` serves the page;
- ``pip install "<wheel>[celery]"``: a real worker from that environment runs a locked task
  published through a Redis broker (kombu's Redis transport needs ``packaging``, which only
  ``celery[redis]`` brings);
- the ``docs`` extra brings every module the docs' autodoc imports (``make docs`` installs it
  alone on a fresh clone).

Each fresh environment downloads from the package index (pip's cache helps on reruns).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest
import redis
from helpers import free_port, wait_for
from packaging.requirements import Requirement

from celery_redislock import Lock
from celery_redislock._version import __version__
from celery_redislock.contrib.redis_server import RedisServer

ROOT = Path(__file__).parents[2]
EXCLUDED_TOP_LEVEL = ("demos/", "tests/", "benchmarks/", "examples/")
# Never copied for the build: caches, environments and the outputs of earlier builds.
LEFTOVERS = ("build", "dist", "*.egg-info", "__pycache__", ".*", "htmlcov", "_build")
PIP_TIMEOUT = 300


def run(
    command: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Runs ``command``; a non-zero exit fails the test with the command's whole output."""
    try:
        done = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"{command} did not finish in {timeout} s\n--- stdout\n{exc.stdout!r}\n"
            f"--- stderr\n{exc.stderr!r}"
        ) from exc
    assert done.returncode == 0, (
        f"{command} exited {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    )
    return done


def isolated_env(venv: Path, **extra: str) -> dict[str, str]:
    """This process's environment without anything that points Python at the source tree, the
    development venv or a coverage run; ``venv``'s bin first on PATH."""
    dropped = ("PYTHON", "VIRTUAL_ENV", "COV_", "COVERAGE_", "LOCKAPP_", "REDISLOCK_", "CELERY")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(venv)
    env["PYTHONNOUSERSITE"] = "1"
    return {**env, **extra}


def fresh_venv(path: Path, requirement: str) -> Path:
    """A new virtual environment at ``path`` with ``pip install <requirement>`` done."""
    run([sys.executable, "-m", "venv", str(path)], cwd=path.parent, timeout=120)
    python = path / "bin" / "python"
    run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", requirement],
        cwd=path.parent,
        env=isolated_env(path),
        timeout=PIP_TIMEOUT,
    )
    return path


def run_snippet(venv: Path, code: str, *, cwd: Path, env: dict[str, str]) -> dict[str, object]:
    """Runs ``code`` with ``venv``'s Python in ``cwd``; returns the JSON its last line prints."""
    script = cwd / "snippet.py"
    script.write_text(textwrap.dedent(code))
    done = run([str(venv / "bin" / "python"), str(script)], cwd=cwd, env=env, timeout=120)
    lines = done.stdout.strip().splitlines()
    assert lines, f"the snippet printed nothing\n--- stderr\n{done.stderr}"
    result: dict[str, object] = json.loads(lines[-1])
    return result


def url_of_db(url: str, db: int) -> str:
    return f"{url.rsplit('/', 1)[0]}/{db}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once for this module by ``python -m build --wheel`` (isolated build:
    the backend comes from the package index)."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*LEFTOVERS))
    out = base / "dist"
    run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(source)],
        cwd=base,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
        timeout=PIP_TIMEOUT,
    )
    (built,) = out.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


@pytest.mark.slow  # about 5 s on 2 quiet cores
def test_the_wheel_ships_the_package_and_nothing_else(wheel: Path) -> None:
    assert wheel.name == f"celery_redislock-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = f"celery_redislock-{__version__}.dist-info"
        metadata = Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode())

    assert "celery_redislock/core/lua/acquire.lua" in names
    assert "celery_redislock/py.typed" in names
    lua = ROOT / "celery_redislock" / "core" / "lua"
    lua_in_tree = {p.relative_to(ROOT).as_posix() for p in lua.glob("*.lua")}
    assert lua_in_tree <= set(names), sorted(lua_in_tree - set(names))
    assert f"{dist_info}/licenses/LICENSE" in names, sorted(n for n in names if "dist-info" in n)

    outside = [n for n in names if not n.startswith(("celery_redislock/", f"{dist_info}/"))]
    assert not outside, outside
    assert not [n for n in names if n.startswith(EXCLUDED_TOP_LEVEL)]
    # Every module shipped is one of the source tree's: nothing stale, nothing generated.
    shipped = {n for n in names if n.startswith("celery_redislock/")}
    not_in_tree = sorted(n for n in shipped if not (ROOT / n).is_file())
    assert not not_in_tree, not_in_tree
    in_tree = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "celery_redislock").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert in_tree <= shipped, sorted(in_tree - shipped)

    assert metadata["Name"] == "celery-redislock"
    assert metadata["Version"] == __version__
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    requires = metadata.get_all("Requires-Dist") or []
    assert "redis>=5.0" in requires, requires
    unconditional = [r for r in requires if ";" not in r]
    assert unconditional == ["redis>=5.0"], requires
    celery_extra = [r for r in requires if r.startswith("celery[redis]")]
    assert celery_extra, requires
    assert all('extra == "celery"' in r for r in celery_extra), celery_extra
    for name in ("kombu", "billiard"):
        found = [r for r in requires if r.startswith(name)]
        assert found, (name, requires)
        assert all('extra == "celery"' in r for r in found), found
    assert "celery" in (metadata.get_all("Provides-Extra") or [])


CORE_SNIPPET = """
    import importlib.util
    import json
    import os
    import sys

    import redis

    import celery_redislock
    from celery_redislock import Lock

    imported = sorted(m for m in ("celery", "kombu", "billiard") if m in sys.modules)
    installed = sorted(m for m in ("celery", "kombu", "billiard") if importlib.util.find_spec(m))
    try:
        from celery_redislock import install  # noqa: F401
    except ImportError as exc:
        message = str(exc)
    else:
        message = None

    lock = Lock(redis.Redis.from_url(os.environ["PKG_REDIS_URL"]), "pkg", ttl=5)
    lease = lock.acquire(timeout=5)
    held = [h.token for h in lock.holders()] == [lease.token]
    lease.release()

    # The asyncio API needs nothing more than redis-py either.
    import asyncio

    import redis.asyncio

    from celery_redislock.asyncio import AsyncLock


    async def main():
        aclient = redis.asyncio.Redis.from_url(os.environ["PKG_REDIS_URL"])
        async with AsyncLock(aclient, "pkg", ttl=5).hold(timeout=5) as lease:
            seen = [h.token for h in lock.holders()] == [lease.token]
        await aclient.aclose()
        return seen


    async_held = asyncio.run(main())
    print(json.dumps({
        "module": celery_redislock.__file__,
        "version": celery_redislock.__version__,
        "imported": imported,
        "installed": installed,
        "message": message,
        "held": held,
        "async_held": async_held,
        "free_after": not lock.locked(),
    }))
"""


@pytest.mark.slow  # a fresh venv: 11-23 s
def test_the_core_imports_with_redis_only(wheel: Path, redis_url: str, tmp_path: Path) -> None:
    venv = fresh_venv(tmp_path / "venv", str(wheel))
    work = tmp_path / "work"
    work.mkdir()
    out = run_snippet(venv, CORE_SNIPPET, cwd=work, env=isolated_env(venv, PKG_REDIS_URL=redis_url))

    assert str(out["module"]).startswith(str(venv)), out  # the wheel's copy, not the tree's
    assert out["version"] == __version__
    assert out["installed"] == [], out  # the test means something: no Celery in this venv
    assert out["imported"] == [], out
    assert out["message"] is not None, "install imported without Celery"
    assert 'pip install "celery-redislock[celery]"' in str(out["message"]), out["message"]
    assert out["held"] is True, out
    assert out["async_held"] is True, out
    assert out["free_after"] is True, out


@pytest.mark.slow
def test_the_web_view_serves_from_a_clean_install_with_the_web_extra(
    wheel: Path, redis_url: str, tmp_path: Path
) -> None:
    """``pip install "<wheel>[web]"``, then ``redislock web``: the page shows a lock held."""
    venv = fresh_venv(tmp_path / "venv", f"{wheel}[web]")
    url = url_of_db(redis_url, 4)
    client = redis.Redis.from_url(url)
    lease = Lock(client, "pkg:web", ttl=30).acquire(info={"task_id": "t-pkg"})
    port = free_port()
    server = subprocess.Popen(
        [str(venv / "bin" / "redislock"), "--url", url, "web", "--port", str(port)],
        cwd=tmp_path,
        env=isolated_env(venv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        page = ""

        def served() -> bool:
            nonlocal page
            assert server.poll() is None, server.stdout.read().decode()  # type: ignore[union-attr]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as answer:
                    page = answer.read().decode()
            except OSError:
                return False
            return True

        wait_for(served, "redislock web to answer", timeout=30)
        assert "pkg:web" in page and "t-pkg" in page and "read-only" in page
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(10)
        lease.release()
        client.close()


APP_MODULE = """
    import os

    from celery import Celery

    from celery_redislock import install, lock_for

    URL = os.environ["PKG_REDIS_URL"]
    BASE = URL.rsplit("/", 1)[0]
    app = install(Celery("pkgapp", broker=f"{BASE}/0", backend=f"{BASE}/1"))
    app.conf.redislock_url = f"{BASE}/2"
    app.conf.broker_connection_retry_on_startup = True


    @app.task(bind=True, lock="pkg:{n}")
    def double(self, n):
        holders = lock_for(self, (n,)).holders()
        return {"doubled": n * 2, "holders": len(holders)}
"""

PRODUCER_SNIPPET = """
    import json
    import time

    import celery_redislock
    from celery_redislock import lock_for
    from pkgapp import double

    result = double.delay(21).get(timeout=60)
    lock = lock_for(double, (21,))
    deadline = time.monotonic() + 10
    while lock.locked() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({
        "module": celery_redislock.__file__,
        "result": result,
        "free_after": not lock.locked(),
    }))
"""


@contextlib.contextmanager
def worker(venv: Path, cwd: Path, env: dict[str, str]) -> Iterator[Path]:
    """A prefork worker (concurrency 1) run by ``venv``'s ``celery``; yields its log file once
    it is ready; stopped with SIGTERM, then SIGKILL to its process group after 10 s."""
    log_path = cwd / "worker.log"
    command = [
        str(venv / "bin" / "celery"), "-A", "pkgapp", "worker", "-P", "prefork", "-c", "1",
        "-n", "pkg@%h", "--without-heartbeat", "--without-gossip", "--without-mingle",
        "-l", "info",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 60
        while " ready." not in log_path.read_text(errors="replace"):
            assert proc.poll() is None, f"the worker exited:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"the worker is not ready:\n{log_path.read_text()}"
            time.sleep(0.1)
        yield log_path
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the pool's children too
        proc.wait(10)


@pytest.mark.slow
def test_a_locked_task_runs_from_a_clean_install_with_the_celery_extra(
    wheel: Path, redis_url: str, tmp_path: Path
) -> None:
    venv = fresh_venv(tmp_path / "venv", f"{wheel}[celery]")
    work = tmp_path / "work"
    work.mkdir()
    (work / "pkgapp.py").write_text(textwrap.dedent(APP_MODULE))
    env = isolated_env(venv, PKG_REDIS_URL=redis_url, PYTHONPATH=str(work))

    with worker(venv, work, env) as log_path:
        try:
            out = run_snippet(venv, PRODUCER_SNIPPET, cwd=work, env=env)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- worker log\n{log_path.read_text()}") from exc

    assert str(out["module"]).startswith(str(venv)), out
    assert out["result"] == {"doubled": 42, "holders": 1}, out
    assert out["free_after"] is True, out


RQ_MODULE = """
    from celery_redislock.integrations.rq import locked


    @locked(lock="pkg:{n}", unique="until_finished")
    def double(n):
        return n * 2
"""

RQ_SNIPPET = """
    import importlib.util
    import json
    import os
    import subprocess
    import sys

    import redis
    from celery_redislock.integrations.rq import UniqueQueue
    from rqpkg import double

    conn = redis.Redis.from_url(os.environ["PKG_REDIS_URL"])
    queue = UniqueQueue("pkg", connection=conn)
    first, second = queue.enqueue(double, 21), queue.enqueue(double, 21)
    rq = os.path.join(os.path.dirname(sys.executable), "rq")
    subprocess.run(
        [rq, "worker", "--burst", "--url", os.environ["PKG_REDIS_URL"], "-w",
         "celery_redislock.integrations.rq.LockWorker", "pkg"],
        check=True, capture_output=True, timeout=60,
    )
    first.refresh()
    print(json.dumps({
        "same_job": first.id == second.id,
        "status": str(getattr(first.get_status(), "value", first.get_status())),
        "result": first.return_value(),
        "celery": importlib.util.find_spec("celery") is not None,
    }))
"""


@pytest.mark.slow
def test_a_locked_rq_job_runs_from_a_clean_install_with_the_rq_extra(
    wheel: Path, redis_url: str, tmp_path: Path
) -> None:
    venv = fresh_venv(tmp_path / "venv", f"{wheel}[rq]")
    work = tmp_path / "work"
    work.mkdir()
    (work / "rqpkg.py").write_text(textwrap.dedent(RQ_MODULE))
    env = isolated_env(venv, PKG_REDIS_URL=url_of_db(redis_url, 3), PYTHONPATH=str(work))
    out = run_snippet(venv, RQ_SNIPPET, cwd=work, env=env)
    assert out == {"same_job": True, "status": "finished", "result": 42, "celery": False}, out


def _dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(dist: str, extras: set[str]) -> set[str]:
    """The installed distributions ``dist[extras]`` brings, itself included (as pip resolves)."""
    found: set[str] = set()
    todo = [(dist, frozenset(extras))]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, wanted = todo.pop()
        if (_dist(name), wanted) in done:
            continue
        done.add((_dist(name), wanted))
        found.add(_dist(name))
        for line in metadata.requires(name) or []:
            req = Requirement(line)
            if req.marker is None or any(
                req.marker.evaluate({"extra": extra}) for extra in wanted | {""}
            ):
                todo.append((req.name, frozenset(req.extras)))
    return found


# Imported by a dependency only when it is installed (the test extra brings it): no docs build
# needs it. kombu.utils.json imports Django's Promise in a try (django-celery-beat brings Django,
# for tests/celery/test_celery_beat.py).
_IMPORTED_IF_INSTALLED = {"django"}


def test_the_docs_extra_brings_every_module_autodoc_imports() -> None:
    """``make docs`` on a fresh clone installs the ``docs`` extra alone: each module the pages'
    autodoc directives import must import with what that extra brings (and the standard
    library), not with what the ``dev`` extra happens to add."""
    targets: set[str] = set()
    for page in (ROOT / "docs").glob("*.md"):
        for kind, target in re.findall(
            r"^\.\. auto(module|class|function|exception|data)::\s+(\S+)", page.read_text(), re.M
        ):
            targets.add(target if kind == "module" else target.rpartition(".")[0])
    assert "celery_redislock.contrib.pytest" in targets, targets
    code = (
        "import importlib, sys\n"
        f"for m in {sorted(targets)!r}: importlib.import_module(m)\n"
        "print('\\n'.join(sorted({n.partition('.')[0] for n in sys.modules})))\n"
    )
    imported = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    owners = metadata.packages_distributions()
    brought = _closure("celery-redislock", {"docs"})
    missing = {
        f"{top} ({', '.join(owners[top])})"
        for top in imported
        if top not in sys.stdlib_module_names
        and top not in _IMPORTED_IF_INSTALLED
        and top in owners
        and not any(_dist(d) in brought for d in owners[top])
    }
    assert not missing, f"autodoc imports these, which the docs extra does not bring: {missing}"
