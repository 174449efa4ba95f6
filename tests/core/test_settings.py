"""One settings schema (celery_redislock/core/settings.py) with two sources: equal inputs give
equal Settings whichever source they come through, every field has its names, each source names
a bad value as it spells it, and the docs' settings tables list every field."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from celery import Celery

from celery_redislock.core.settings import FIELDS, Settings
from celery_redislock.errors import LockConfigError
from celery_redislock.integrations.celery.settings import client_for as celery_client
from celery_redislock.integrations.celery.settings import settings_for
from celery_redislock.integrations.rq import Settings as RQSettings
from celery_redislock.integrations.rq.settings import client_for as rq_client

DOCS = Path(__file__).resolve().parents[2] / "docs"

# Fields one source does not read, and why: a test fails when a new field lacks a name.
# No text form, or Celery's alone (beat).
NOT_FROM_ENV = {"client_factory", "sentinel_options", "task_time_limit"}
NOT_FROM_ENV |= {"beat_scheduler", "beat_name", "beat_ttl", "beat_missed"}
NOT_FROM_CELERY = {"max_conflict_retries"}  # a Celery task's own max_retries counts them

# One value per field, as a Python value (app.conf, keyword arguments) and as environment text.
COMMON = {
    "namespace": ("ns", "ns"),
    "ttl": (30, "30"),
    "on_conflict": ("retry", "retry"),
    "on_duplicate": ("raise", "raise"),
    "on_backend_error": ("run", "run"),
    "queue_allowance": (60, "60"),
    "unique_publish_window": (10.5, "10.5"),
    "completion_ttl": (100, "100"),
    "fence_keep": (1000, "1000"),
    "line_handover_window": (20, "20"),
    "line_sweep_interval": (0.5, "0.5"),
    "min_replicas": (1, "1"),
    "replica_timeout": (0.25, "0.25"),
    "disabled": (True, "yes"),
}
CASES = {
    "url": {
        **COMMON,
        "url": ("redis://127.0.0.1:1/2", "redis://127.0.0.1:1/2"),
        "redlock_urls": (
            ["redis://a:1", "redis://b:1", "redis://c:1"],
            "redis://a:1,redis://b:1,redis://c:1",
        ),
    },
    "sentinels": {
        **COMMON,
        "sentinels": (["h1:26379", ("h2", 26380)], "h1:26379,h2:26380"),
        "sentinel_master": ("locks", "locks"),
    },
}


def test_every_field_is_in_the_schema_with_its_names() -> None:
    assert list(FIELDS) == [f.name for f in dataclasses.fields(Settings)]
    for name, field in FIELDS.items():
        assert (field.env is None) == (name in NOT_FROM_ENV), name
        assert (field.celery is None) == (name in NOT_FROM_CELERY), name
        if field.env is not None:
            assert field.env == "REDISLOCK_" + name.upper()
        assert field.celery in (None, "redislock_" + name, "redislock_client", "task_time_limit")
    assert RQSettings is Settings  # (RQ's Settings is the core class)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_two_sources_give_equal_settings_for_equal_inputs(case: str) -> None:
    values = CASES[case]
    kwargs = {name: value for name, (value, _) in values.items()}
    env = {FIELDS[name].env: text for name, (_, text) in values.items()}
    conf = {FIELDS[name].celery: value for name, (value, _) in values.items()}
    from_env = Settings.from_env(env)  # type: ignore[arg-type]
    assert from_env == Settings.from_mapping(conf.get) == Settings(**kwargs)  # type: ignore[arg-type]
    assert (from_env.ttl, from_env.disabled, from_env.min_replicas) == (30.0, True, 1)
    # Through a Celery app (not its broker's Redis: the settings name the lock Redis).
    app = Celery("schema", broker="memory://", set_as_current=False)
    app.conf.update(conf)
    assert settings_for(app) == from_env
    # Checking again what was checked keeps it.
    assert Settings(**{name: getattr(from_env, name) for name in FIELDS}) == from_env


def test_each_source_names_a_bad_value_as_it_spells_it() -> None:
    with pytest.raises(LockConfigError, match=r"^setting ttl must be a number of seconds from"):
        Settings(ttl=0)
    with pytest.raises(LockConfigError, match=r"^setting redislock_ttl must be a number of"):
        Settings.from_mapping({"redislock_ttl": 0}.get)
    with pytest.raises(LockConfigError, match=r"^environment variable REDISLOCK_TTL must be a"):
        Settings.from_env({"REDISLOCK_TTL": "0"})
    with pytest.raises(LockConfigError, match=r"^environment variable REDISLOCK_DISABLED must"):
        Settings.from_env({"REDISLOCK_DISABLED": "maybe"})
    with pytest.raises(LockConfigError, match="REDISLOCK_MIN_REPLICAS must be an integer"):
        Settings.from_env({"REDISLOCK_MIN_REPLICAS": "one"})
    with pytest.raises(LockConfigError, match=r"^settings redislock_url and redislock_sentinels"):
        Settings.from_mapping(
            {
                "redislock_url": "redis://x",
                "redislock_sentinels": "h:1",
                "redislock_sentinel_master": "m",
            }.get
        )


def test_both_integrations_share_one_client_per_settings() -> None:
    url = "redis://127.0.0.1:1/7"
    app = Celery("schema-client", broker="memory://", set_as_current=False)
    app.conf.redislock_url = url
    client = celery_client(app)
    assert rq_client(Settings(url=url), None) is client is celery_client(app)
    assert rq_client(Settings(url=url, namespace="other"), None) is client  # not a client's
    assert rq_client(Settings(url=url[:-1] + "8"), None) is not client


def _table(doc: str, section: str) -> str:
    text = (DOCS / doc).read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in body.splitlines() if line.startswith("|"))


def test_the_docs_settings_tables_list_every_field() -> None:
    celery = _table("celery.md", "Settings")
    listed = set(re.findall(r"`(redislock_\w+)`", celery))
    ours = {f.celery for f in FIELDS.values() if f.celery and f.celery.startswith("redislock_")}
    assert ours - listed == set(), "missing from docs/celery.md's settings table"
    assert listed - ours == set(), "in docs/celery.md's settings table, but not a setting"
    rq = _table("rq.md", "Settings")
    rows = set(re.findall(r"^\| `(REDISLOCK_\w+)` \| `(\w+)` \|", rq, re.MULTILINE))
    expected = {(f.env, f.name) for f in FIELDS.values() if f.env is not None}
    assert expected - rows == set(), "missing from docs/rq.md's settings table"
    assert rows - expected == set(), "in docs/rq.md's settings table, but not a setting"
