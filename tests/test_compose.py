"""docker-compose.yml: valid Compose, and running what ``python examples/singleton_report.py``
runs, without a Docker engine.

The file is checked against the Compose Specification's own JSON schema, as vendored (with its
checksum) by check-jsonschema (``check-jsonschema --builtin-schema vendor.compose-spec``). The
commands of the example's processes come from the example itself, in a child process: importing
its Celery app here would make it this test process's current app.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from check_jsonschema.builtin_schemas import get_builtin_schema
from jsonschema.protocols import Validator

ROOT = Path(__file__).parent.parent
EXAMPLE = "singleton_report"


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
    services = compose["services"]
    assert list(commands) == ["worker1", "worker2", "beat", "producer"]
    for name, command in commands.items():
        assert services[name]["command"] == command, name
        assert services[name]["image"] == "python:3.11-slim"
        assert services[name]["working_dir"] == "/src/examples"
        assert ".:/src" in services[name]["volumes"]
        assert services[name]["environment"]["REDIS_URL"] == "redis://redis:6379/0"
    assert commands["producer"] == ["python", f"{EXAMPLE}.py", "produce"]
    assert commands["beat"][:4] == ["celery", "-A", EXAMPLE, "beat"]


def test_each_start_waits_for_what_it_needs(
    compose: dict[str, Any], commands: dict[str, list[str]]
) -> None:
    services = compose["services"]
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "pip install --quiet /src" in services["install"]["command"][-1]
    workers = [name for name in commands if name.startswith("worker")]
    for name in workers:
        node = commands[name][commands[name].index("-n") + 1]  # "w1@%h"
        check = services[name]["healthcheck"]["test"]
        assert check[0] == "CMD-SHELL"
        # The worker's own node name: %h is the container's hostname.
        assert f"celery -A {EXAMPLE} inspect ping" in check[1]
        assert check[1].endswith(f" -d {node.replace('%h', '$$HOSTNAME')}")
    for name in commands:
        needs = services[name]["depends_on"]
        assert needs["redis"] == {"condition": "service_healthy"}
        assert needs["install"] == {"condition": "service_completed_successfully"}
    for name in ("beat", "producer"):
        needs = services[name]["depends_on"]
        assert all(needs[w] == {"condition": "service_healthy"} for w in workers)
    assert services["producer"]["depends_on"]["beat"] == {"condition": "service_started"}
