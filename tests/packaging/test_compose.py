"""docker-compose.yml: valid Compose, and its services run for real, without a Docker engine.

The file is checked against the Compose Specification's own JSON schema, as vendored (with its
checksum) by check-jsonschema (``check-jsonschema --builtin-schema vendor.compose-spec``).

Then its services run here, each command as the file writes it, started in ``depends_on`` order
(health checks run as written, with their interval, timeout and retries), with what a container
would see stood in by this machine (:class:`Stage`):

- the image ``python:3.11-slim``: a fresh virtualenv of this interpreter per container (python
  and pip, nothing else installed), standing for the image's ``/usr/local``;
- the bind mount ``.``: a copy of the files git knows of in this checkout (what a clean clone of
  this working tree holds: no ``.venv``, no build leftovers), shared by every container;
- a named volume: an empty directory, shared by the containers that mount it;
- the ``redis`` service: a redis-server of the test's, which host ``redis`` in URLs names;
- ``HOSTNAME``: this host's name; pip's configuration (index, cache): this machine's.

Container paths in commands and in the environment are mapped (``/src`` to the copy, ``/venv``
to the volume's directory, ``/usr/local`` to the image's virtualenv); PATH is the container's, so
a program the services run is found only where the container would find it.

The commands of the example's processes come from the example itself, in a child process:
importing its Celery app here would make it this test process's current app.
"""

from __future__ import annotations

import contextlib
import copy
import graphlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from check_jsonschema.builtin_schemas import get_builtin_schema
from jsonschema.protocols import Validator

from celery_redislock.contrib.redis_server import RedisServer

ROOT = Path(__file__).parents[2]
EXAMPLE = "singleton_report"
PYTHON_IMAGE = "python:3.11-slim"
REDIS_IMAGE = "redis:7"
# python:3.11-slim's PATH (its Dockerfile's ENV PATH), for a service that sets none.
IMAGE_PATH = "/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STOP_GRACE_S = 10.0  # compose's: SIGTERM to the container's main process, then SIGKILL
UP_TIMEOUT_S = 150.0  # the producer watches for 8 s once the workers answer
DEMO_TIMEOUT_S = 200.0  # the whole demo, about 25 s on an idle 2-core machine


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


@pytest.fixture(scope="module")
def validator() -> Validator:
    schema = get_builtin_schema("vendor.compose-spec")
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator: Validator = cls(schema)
    return validator


@pytest.fixture(scope="module")
def commands() -> dict[str, list[str]]:
    """The example's processes by service name, as its runner starts them."""
    code = (
        f"import json, _runner, {EXAMPLE} as e; "
        "print(json.dumps(_runner.services(e.NAME, e.WORKERS, e.BEAT)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT / "examples",
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    found: dict[str, list[str]] = json.loads(out)
    return found


def test_valid_compose_file(compose: dict[str, Any], validator: Validator) -> None:
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(compose)
    ]
    assert errors == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("services", "producer", "depends_on", "worker1", "condition"), "service_ready"),
        (("services", "worker1", "healthcheck", "interval"), 3),
        (("services", "beat", "comand"), ["celery"]),
    ],
)
def test_validator_rejects_a_broken_file(
    compose: dict[str, Any], validator: Validator, path: tuple[str, ...], value: object
) -> None:
    broken = copy.deepcopy(compose)
    target = broken
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    assert not validator.is_valid(broken)


def test_services_run_the_examples_commands(
    compose: dict[str, Any], commands: dict[str, list[str]]
) -> None:
    """What the comments and docs promise: ``python examples/singleton_report.py`` runs these
    very commands."""
    services = compose["services"]
    assert list(commands) == ["worker1", "worker2", "beat", "producer"]
    for name, command in commands.items():
        assert services[name]["command"] == command, name


def test_each_start_waits_for_what_it_needs(
    compose: dict[str, Any], commands: dict[str, list[str]]
) -> None:
    """The order compose starts them in: a run below could pass by luck of timing without it."""
    services = compose["services"]
    workers = [name for name in commands if name.startswith("worker")]
    for name in workers:
        node = commands[name][commands[name].index("-n") + 1]  # "w1@%h"
        check = services[name]["healthcheck"]["test"]
        # The worker's own node name: %h is the container's hostname.
        assert check[-1].endswith(f" -d {node.replace('%h', '$$HOSTNAME')}")
    for name in commands:
        needs = services[name]["depends_on"]
        assert needs["redis"] == {"condition": "service_healthy"}
        assert needs["install"] == {"condition": "service_completed_successfully"}
    for name in ("beat", "producer"):
        needs = services[name]["depends_on"]
        assert all(needs[w] == {"condition": "service_healthy"} for w in workers)
    assert services["producer"]["depends_on"]["beat"] == {"condition": "service_started"}


def _seconds(duration: str | int | float) -> float:
    """A Compose duration ("3s", "1m30s", "500ms") in seconds."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)", str(duration))
    assert parts and "".join(n + u for n, u in parts) == str(duration), duration
    return sum(float(n) * units[u] for n, u in parts)


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no output)"


class Container:
    """One service's container, stood in for on this machine: its image's /usr/local is a fresh
    virtualenv, its mounts are directories of the stage, its environment is the container's."""

    def __init__(self, stage: Stage, name: str, spec: dict[str, Any]) -> None:
        self.stage, self.name, self.spec = stage, name, spec
        assert spec.get("image") == PYTHON_IMAGE, f"{name}: no stand-in for {spec.get('image')}"
        self.local = stage.root / "images" / name
        self.mounts: dict[str, Path] = {"/usr/local": self.local}
        for volume in spec.get("volumes", []):
            source, target = volume.split(":")[:2]
            self.mounts[target] = stage.checkout if source == "." else stage.volume(source)
        self.log = stage.root / "logs" / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.healthy = False

    def create(self) -> None:
        """The image: this interpreter's python and pip, nothing installed."""
        subprocess.run(
            [sys.executable, "-m", "venv", str(self.local)],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def map(self, text: str) -> str:
        """``text`` with Compose's ``$$`` as ``$``, container paths as this machine's and host
        ``redis`` as the test's redis-server."""
        assert "$" not in text.replace("$$", ""), f"{self.name}: a Compose variable: {text!r}"
        text = text.replace("$$", "$")
        text = text.replace("//redis:6379/", f"//127.0.0.1:{self.stage.redis.port}/")
        for target in sorted(self.mounts, key=len, reverse=True):
            pattern = rf"(?<![\w./-]){re.escape(target)}(?![\w.-])"
            text = re.sub(pattern, lambda _, path=self.mounts[target]: str(path), text)
        return text

    @property
    def env(self) -> dict[str, str]:
        """What the container's processes see: the image's PATH unless the service sets one,
        the service's environment, HOSTNAME; and this machine's HOME and pip settings."""
        env = {"PATH": IMAGE_PATH, "LANG": "C.UTF-8", "HOSTNAME": socket.gethostname()}
        env.update({k: str(v) for k, v in self.spec.get("environment", {}).items()})
        env = {k: self.map(v) for k, v in env.items()}
        env["HOME"] = os.environ.get("HOME", str(self.stage.root))
        env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
        return env

    @property
    def cwd(self) -> Path:
        working_dir = self.spec.get("working_dir")
        if working_dir is None:
            empty = self.stage.root / "roots" / self.name
            empty.mkdir(parents=True, exist_ok=True)
            return empty
        return Path(self.map(working_dir))

    def argv(self, command: list[str] | str) -> list[str]:
        """The command as the container runs it: its program looked up on the container's
        PATH, where a missing program fails the run, naming it."""
        words = shlex.split(command) if isinstance(command, str) else list(command)
        words = [self.map(str(w)) for w in words]
        program = shutil.which(words[0], path=self.env["PATH"])
        assert program is not None, (
            f"{self.name}: {words[0]!r} is not on the container's PATH ({self.env['PATH']})"
        )
        return [program, *words[1:]]

    def start(self) -> None:
        argv = self.argv(self.spec["command"])
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a group of its own: the container's processes
            )

    def wait(self, timeout: float) -> int:
        assert self.process is not None, f"{self.name} was not started"
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still running after {timeout} s:\n{_tail(self.log)}"
            ) from None

    def wait_healthy(self) -> None:
        """Runs the health check as Docker does: every ``interval``, each given ``timeout``,
        unhealthy after ``retries`` failures in a row; fails at once if the service exited."""
        if self.healthy:
            return
        check = self.spec["healthcheck"]
        test = check["test"]
        argv = (
            self.argv(test[1:])
            if test[0] == "CMD"
            else ["/bin/sh", "-c", self.map(test[1] if test[0] == "CMD-SHELL" else test)]
        )
        interval = _seconds(check.get("interval", "30s"))
        timeout = _seconds(check.get("timeout", "30s"))
        last = ""
        for _ in range(int(check.get("retries", 3))):
            time.sleep(interval)
            assert self.process is not None and self.process.poll() is None, (
                f"{self.name} exited ({self.process and self.process.returncode}) before it "
                f"was healthy:\n{_tail(self.log)}"
            )
            try:
                done = subprocess.run(
                    argv, cwd=self.cwd, env=self.env, capture_output=True, text=True,
                    timeout=timeout,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                last = f"the check took over {timeout} s"
                continue
            if done.returncode == 0:
                self.healthy = True
                return
            last = done.stdout + done.stderr
        raise AssertionError(
            f"{self.name} never healthy; its last check said:\n{last}\nits log:\n{_tail(self.log)}"
        )

    def stop(self) -> None:
        """As compose stops a container: SIGTERM to its main process, SIGKILL to all of it after
        the grace period."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(STOP_GRACE_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # its pool children, or whatever is left
        process.wait()


class Stage:
    """The machine a compose file's containers run on, here: a checkout copy, volumes, a
    redis-server for the ``redis`` service, and containers started in ``depends_on`` order."""

    def __init__(self, compose: dict[str, Any], root: Path, redis: RedisServer) -> None:
        self.compose, self.root, self.redis = compose, root, redis
        self.checkout = root / "src"
        self._copy_checkout()
        self.containers: dict[str, Container] = {}

    def _copy_checkout(self) -> None:
        """The files a clean clone of this working tree holds (git's tracked and not ignored
        ones, as they are now): no virtualenv, no build or egg-info left in it."""
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        for name in filter(None, listed.decode().split("\0")):
            source = ROOT / name
            if source.is_file():  # (deleted, not yet staged: not there)
                (self.checkout / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, self.checkout / name)

    def volume(self, name: str) -> Path:
        assert name in self.compose.get("volumes", {}), f"volume {name} is not declared"
        path = self.root / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _order(self, names: list[str]) -> list[str]:
        """``names`` and what they depend on, each after its dependencies."""
        services = self.compose["services"]
        sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
        todo = list(names)
        while todo:
            name = todo.pop()
            needs = list(services[name].get("depends_on", {}))
            sorter.add(name, *needs)
            todo += needs
        return list(sorter.static_order())

    def _prepare(self, order: list[str]) -> None:
        services = self.compose["services"]
        for name in order:
            if services[name]["image"] == REDIS_IMAGE:
                continue  # the test's redis-server, started and answering
            self.containers[name] = Container(self, name, services[name])
        with ThreadPoolExecutor(len(self.containers)) as pool:
            list(pool.map(Container.create, self.containers.values()))

    def _start_after_dependencies(self, name: str) -> None:
        for needed, how in self.compose["services"][name].get("depends_on", {}).items():
            if needed not in self.containers:  # redis
                continue
            dependency = self.containers[needed]
            condition = how["condition"]
            if condition == "service_healthy":
                dependency.wait_healthy()
            elif condition == "service_completed_successfully":
                status = dependency.wait(UP_TIMEOUT_S)
                assert status == 0, f"{needed} exited {status}:\n{_tail(dependency.log)}"
            else:
                assert condition == "service_started", condition
        self.containers[name].start()

    def up(self, exit_code_from: str) -> tuple[int, str]:
        """``docker compose up --exit-code-from <service>``: every service without a profile,
        until that one exits; its status and output."""
        services = self.compose["services"]
        order = self._order([n for n, s in services.items() if not s.get("profiles")])
        self._prepare(order)
        for name in order:
            if name in self.containers:
                self._start_after_dependencies(name)
        main = self.containers[exit_code_from]
        return main.wait(UP_TIMEOUT_S), _tail(main.log, 20000)

    def run(self, service: str) -> tuple[int, str]:
        """``docker compose run --rm <service>``: its dependencies started, then the service
        until it exits; its status and output."""
        order = self._order([service])
        self._prepare(order)
        for name in order:
            if name in self.containers:
                self._start_after_dependencies(name)
        main = self.containers[service]
        return main.wait(DEMO_TIMEOUT_S), _tail(main.log, 20000)

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{_tail(c.log)}" for n, c in self.containers.items())

    def close(self) -> None:
        for container in reversed(self.containers.values()):
            container.stop()


@pytest.fixture
def stage(compose: dict[str, Any], tmp_path: Path) -> Iterator[Stage]:
    with RedisServer() as server:
        started = Stage(compose, tmp_path, server)
        try:
            yield started
        finally:
            started.close()


@pytest.mark.slow
def test_up_runs_the_example_to_its_verdict(stage: Stage) -> None:
    """``docker compose up --exit-code-from producer``: the install service builds the package
    into the volume, both workers answer their health checks, beat fires the report and the
    producer exits 0 (no report queued or run twice at once)."""
    status, out = stage.up("producer")
    assert status == 0 and "invariant: held" in out, f"producer exited {status}:\n{stage.logs()}"


@pytest.mark.slow
def test_the_demo_service_runs_what_make_demo_runs(stage: Stage) -> None:
    """``docker compose run --rm demo`` runs ``python -m demos.celery``, as ``make demo`` does,
    with the `demo` extra installed: every use case holds and the timeline is drawn."""
    makefile = (ROOT / "Makefile").read_text()
    made = re.search(r"^demo:.*\n\t\$\(BIN\)/(python -m \S+)", makefile, re.MULTILINE)
    assert made is not None
    command = stage.compose["services"]["demo"]["command"]
    assert command[-1].endswith(f"&& {made[1]}"), command
    status, out = stage.run("demo")
    assert status == 0 and "all use cases held" in out, f"demo exited {status}:\n{stage.logs()}"
    assert (stage.checkout / "demo-timeline.png").is_file(), out
