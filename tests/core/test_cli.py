"""The ``redislock`` console script on a real Redis: what it prints, what it frees, its exit
codes (0 done, 1 nothing matched, 2 usage error, 3 Redis failing). Most calls run its click
command in this process (``run``: a Python start and the package's import per call made this
module the suite's third slowest); the installed script itself runs as a subprocess
(``script``) where the exit codes and output must hold across a process boundary."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from helpers import free_port

from celery_redislock import Lock, LockNotAcquired
from celery_redislock.cli.script import redislock
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.admin import clear_limits, resume_lock, set_limits
from celery_redislock.core.beat import BeatLeader
from celery_redislock.core.claims import ClaimKind, claim

SCRIPT = Path(sys.executable).parent / "redislock"


def script(
    *args: str, url: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a subprocess."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("REDISLOCK_")}
    if url is not None:
        environ["REDISLOCK_URL"] = url
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**environ, **(env or {})},
    )


def run(
    *args: str, url: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The console script's command in this process (click's runner), its environment as
    ``script`` gives it; an exception it would have ended with is raised here."""
    environ: dict[str, str | None] = {k: None for k in os.environ if k.startswith("REDISLOCK_")}
    if url is not None:
        environ["REDISLOCK_URL"] = url
    environ.update(env or {})
    result = CliRunner().invoke(redislock, list(args), env=environ, prog_name="redislock")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        ["redislock", *args], result.exit_code, result.stdout, result.stderr
    )


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(result.stdout)


def test_the_console_script_is_installed() -> None:
    assert SCRIPT.exists(), "pip install -e . registers the redislock console script"
    usage = script("frobnicate")  # a usage error from the real script: exit code 2
    assert usage.returncode == 2 and "No such command" in usage.stderr, usage.stderr


def test_list_and_show_a_holder(client: redis.Redis, redis_server: RedisServer) -> None:
    url = redis_server.url
    lease = Lock(client, "sync:42", ttl=30).acquire(info={"task_id": "t-1", "task": "proj.sync"})
    Lock(client, "other", ttl=30, mode="read").acquire()
    listed = run("list", "sync:*", url=url)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == [
        *("NAME", "MODE", "HOLDERS", "EXPIRES", "IN", "WAITERS", "CAP", "SET", "PAUSED", "FOR")
    ]
    assert row.split()[:3] == ["sync:42", "write", "1"] and row.split()[-3:] == ["0", "-", "-"]
    (entry,) = as_json(run("list", "sync:*", "--json", url=url))
    assert entry["name"] == "sync:42" and entry["holders"] == 1 and entry["waiters"] == 0
    assert 0 < entry["expires_in"] <= 30
    assert (entry["cap"], entry["paused_for"]) == (None, 0.0)
    assert [e["name"] for e in as_json(run("list", "--json", url=url))] == ["other", "sync:42"]
    # What is set at runtime shows in the list: a cap, a pause.
    set_limits(client, "sync:42", cap=3)
    Lock(client, "sync:42", ttl=30).pause(60)
    row = run("list", "sync:*", url=url).stdout.splitlines()[1].split()
    assert row[-2] == "3" and row[-1].endswith("s") and 55 < float(row[-1][:-1]) <= 60
    (entry,) = as_json(run("list", "sync:*", "--json", url=url))
    assert entry["cap"] == 3 and 55 < entry["paused_for"] <= 60
    clear_limits(client, "sync:42")
    resume_lock(client, "sync:42")

    shown = run("show", "sync:42", url=url)
    assert shown.returncode == 0, shown.stderr
    assert "task proj.sync[t-1]" in shown.stdout and f"fence {lease.fence}" in shown.stdout
    assert f"pid {os.getpid()}" in shown.stdout and f"token {lease.token}" in shown.stdout
    detail = as_json(run("show", "sync:42", "--json", url=url))
    (holder,) = detail["holders"]
    assert holder["task_id"] == "t-1" and holder["task"] == "proj.sync"
    assert holder["pid"] == os.getpid() and holder["fence"] == lease.fence
    assert holder["token"] == lease.token and 0 <= holder["held_for"] < 30
    assert detail["waiters"] == [] and detail["mode"] == "write"


def test_show_an_idle_lock_with_a_cap_set_at_runtime(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    url = redis_server.url
    set_limits(client, "api:capped", cap=3)
    shown = run("show", "api:capped", url=url)
    assert shown.returncode == 0, (shown.stdout, shown.stderr)
    first, *rest = shown.stdout.splitlines()
    assert first == "lock 'api:capped': not held, 0 holder(s), 0 waiter(s)"
    assert rest[-1].strip().endswith(", cap 3"), shown.stdout
    detail = run("show", "api:capped", "--json", url=url)
    assert detail.returncode == 0 and as_json(detail)["limits"]["cap"] == 3


def test_list_shows_a_paused_lock_nobody_holds(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    url = redis_server.url
    Lock(client, "sync:1", ttl=30).acquire(info={"task_id": "t-1"})
    Lock(client, "sync:2", ttl=30).pause(60)
    set_limits(client, "sync:3", rate="5/s")  # a rate limit alone is no lock: `rates` shows it
    listed = run("list", "sync:*", url=url)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == ["sync:1", "sync:2"]
    assert rows[1][1:5] == ["-", "0", "-", "0"] and rows[1][-2] == "-"
    assert rows[1][-1].endswith("s") and 50 < float(rows[1][-1][:-1]) <= 60
    entries = as_json(run("list", "sync:*", "--json", url=url))
    assert [e["name"] for e in entries] == ["sync:1", "sync:2"]
    assert (entries[1]["holders"], entries[1]["mode"]) == (0, None)
    assert 50 < entries[1]["paused_for"] <= 60
    # Paused alone, it is still found; resumed and idle, it is not.
    only = run("list", "sync:2", url=url)
    assert only.returncode == 0 and only.stdout.splitlines()[1].split()[0] == "sync:2"
    resume_lock(client, "sync:2")
    assert run("list", "sync:2", url=url).returncode == 1


def test_nothing_matched_is_exit_code_1(client: redis.Redis, redis_server: RedisServer) -> None:
    url = redis_server.url
    for args in (["list"], ["show", "nope"], ["unique"], ["release-claim", "nope"]):
        result = run(*args, url=url)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
    Lock(client, "job", ttl=30).acquire(info={"task_id": "t-1"})
    result = script("release", "job", "--task-id", "t-2", "--json", url=url)  # the real script
    assert result.returncode == 1 and as_json(result)["released"] == []
    assert Lock(client, "job", ttl=30).locked()


def test_release_frees_what_it_names_and_dry_run_frees_nothing(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    url = redis_server.url
    lock = Lock(client, "cap", ttl=30, limit=3)
    first = lock.acquire(info={"task_id": "t-1"})
    second = lock.acquire(info={"task_id": "t-2"})
    third = lock.acquire(info={"task_id": "t-3"})

    dry = run("release", "cap", "--task-id", "t-1", "--dry-run", url=url)
    assert dry.returncode == 0 and dry.stdout.startswith("would free lock 'cap'"), dry.stderr
    assert len(lock.holders()) == 3

    freed = run("release", "cap", "--task-id", "t-1", url=url)
    assert freed.returncode == 0, freed.stderr
    assert freed.stdout.startswith("freed lock 'cap': task ?[t-1]") and first.token in freed.stdout
    assert {h.token for h in lock.holders()} == {second.token, third.token}

    by_token = as_json(run("release", "cap", "--token", second.token, "--json", url=url))
    assert [h["token"] for h in by_token["released"]] == [second.token]
    assert by_token["dry_run"] is False
    assert [h.token for h in lock.holders()] == [third.token]

    everything = run("release", "cap", "--all", url=url)
    assert everything.returncode == 0 and third.token in everything.stdout
    assert lock.holders() == []


def test_unique_claims_listed_and_freed(client: redis.Redis, redis_server: RedisServer) -> None:
    url = redis_server.url
    for name, task_id in (("report:daily", "t-1"), ("report:weekly", "t-2")):
        claim(
            client,
            "redislock",
            name,
            task_id=task_id,
            lifetime=60,
            kind=ClaimKind.NEW,
            running_counts=False,
        )
    listed = run("unique", "report:*", url=url)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[:2] for line in listed.stdout.splitlines()[1:]] == [
        ["report:daily", "t-1"],
        ["report:weekly", "t-2"],
    ]
    entries = as_json(run("unique", "--json", url=url))
    assert [(e["name"], e["task_id"]) for e in entries] == [
        ("report:daily", "t-1"),
        ("report:weekly", "t-2"),
    ]
    wrong = run("release-claim", "report:daily", "--task-id", "t-2", url=url)
    assert wrong.returncode == 1 and client.exists("redislock:{report:daily}:queued")
    dry = run("release-claim", "report:daily", "--dry-run", url=url)
    assert dry.returncode == 0 and client.exists("redislock:{report:daily}:queued")
    freed = as_json(run("release-claim", "report:daily", "--json", url=url))
    assert [c["task_id"] for c in freed["released"]] == ["t-1"]
    assert not client.exists("redislock:{report:daily}:queued")
    assert client.exists("redislock:{report:weekly}:queued")


def test_settings_from_the_environment(client: redis.Redis, redis_server: RedisServer) -> None:
    Lock(client, "job", ttl=30, namespace="jobs").acquire()
    env = {"REDISLOCK_NAMESPACE": "jobs"}
    assert [e["name"] for e in as_json(run("list", "--json", url=redis_server.url, env=env))] == [
        "job"
    ]
    assert run("list", url=redis_server.url).returncode == 1  # the default namespace: none
    flags = run("--url", redis_server.url, "--namespace", "jobs", "list", "--json")
    assert flags.returncode == 0 and [e["name"] for e in as_json(flags)] == ["job"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["release", "job"], "exactly one of --task-id, --token or --all"),
        (["release", "job", "--all", "--token", "x"], "exactly one of"),
        (["--url", "http://example.com", "list"], "is not a Redis URL"),
        (["--url", "redis://localhost:notaport/0", "list"], "is not a Redis URL"),
        (["--namespace", "a{b", "list"], "namespace must be"),
        (["list", ""], "pattern must be"),
        (["frobnicate"], "No such command"),
    ],
)
def test_usage_errors_are_exit_code_2(args: list[str], message: str) -> None:
    result = run(*args, url=f"redis://127.0.0.1:{free_port()}/0")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr


def test_unreachable_redis_is_exit_code_3() -> None:
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"
    result = script("list", url=url)  # the real script: its exit code and stderr
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert result.stderr.startswith(f"Error: Redis at redis://:***@127.0.0.1:{url.split(':')[-1]}")
    assert "secret" not in result.stderr and "Connection refused" in result.stderr


# -- rate limits: rates, limit set/clear, pause, resume ----------------------------------------


@pytest.mark.slow
def test_rates_limit_set_and_clear(client: redis.Redis, redis_server: RedisServer) -> None:
    url = redis_server.url
    nothing = run("rates", url=url)
    assert nothing.returncode == 1 and "no rate limit" in nothing.stderr, nothing
    assert run("rates", "--json", url=url).returncode == 1
    assert as_json(run("rates", "--json", url=url)) == []

    done = run("limit", "set", "partner:api", "--rate", "50/m", "--burst", "5", url=url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "rate limit 'partner:api': rate 50/60s, burst 5, not paused"
    assert client.hgetall("redislock:{partner:api}:limits") == {
        b"rate": b"50 60000",
        b"burst": b"5",
    }
    only_burst = as_json(run("limit", "set", "partner:api", "--burst", "2", "--json", url=url))
    assert only_burst == {
        "name": "partner:api",
        "rate": "50/60s",
        "burst": 2,
        "cap": None,
        "paused_for": 0,
        "lock_paused_for": 0,
        "booked_for": 0,
    }

    listed = run("rates", url=url)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    columns = ["NAME", "RATE", "BURST", "CAP", "PAUSED FOR", "LOCK PAUSED FOR"]
    assert [cell.strip() for cell in header.split("  ") if cell.strip()] == columns
    assert row.split() == ["partner:api", "50/60s", "2", "code's", "-", "-"]
    assert as_json(run("rates", "partner:*", "--json", url=url)) == [only_burst]
    assert run("rates", "other:*", url=url).returncode == 1

    capped = run("limit", "set", "partner:api", "--cap", "3", url=url)
    assert capped.returncode == 0 and capped.stdout.strip().endswith(", cap 3"), capped
    refused = run("limit", "set", "partner:api", "--cap", "0", url=url)
    assert refused.returncode == 2 and "cap must be an integer from 1" in refused.stderr
    assert client.hget("redislock:{partner:api}:limits", "cap") == b"3"  # unchanged
    lock = Lock(client, "partner:api", ttl=30, limit=5)
    held = lock.acquire()
    shown = run("show", "partner:api", url=url)
    assert shown.stdout.splitlines()[-1].strip().endswith(", cap 3"), shown.stdout
    assert as_json(run("show", "partner:api", "--json", url=url))["limits"]["cap"] == 3
    held.release()

    cleared = run("limit", "clear", "partner:api", url=url)
    assert cleared.returncode == 0, cleared.stderr
    assert "the code's rate, the code's burst, not paused" in cleared.stdout
    assert not client.exists("redislock:{partner:api}:limits")
    assert as_json(run("limit", "clear", "partner:api", "--json", url=url))["rate"] is None
    assert run("rates", url=url).returncode == 1


def test_pause_and_resume(client: redis.Redis, redis_server: RedisServer) -> None:
    from celery_redislock.core.rate import RateLimit

    url = redis_server.url
    paused = run("pause", "api", "30", url=url)
    assert paused.returncode == 0, paused.stderr
    said, state = paused.stdout.splitlines()
    assert said == "paused rate limit and lock 'api'"
    assert state.startswith("rate limit 'api': the code's rate, the code's burst, paused for")
    assert "; lock paused for " in state
    limit = RateLimit(client, "api", "10/s")
    assert 25 < limit.usage().paused_for <= 30  # (the CLI process started and ended since)
    got = limit.reserve("r")
    assert 25 < got.delay <= 30  # no start before the pause ends
    # ... and the lock of the name: no new lease before the pause ends.
    lock = Lock(client, "api", ttl=30)
    with pytest.raises(LockNotAcquired):
        lock.acquire(blocking=False)
    (entry,) = as_json(run("rates", "--json", url=url))
    assert entry["name"] == "api" and 20 < entry["paused_for"] <= 30  # (a few CLI runs later)
    assert 20 < entry["lock_paused_for"] <= 30
    assert entry["rate"] is None and entry["burst"] is None
    row = run("rates", url=url).stdout.splitlines()[1].split()
    assert row[:3] == ["api", "code's", "code's"]
    shown = run("show", "api", url=url)  # nobody holds it, but it is paused: said so
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("lock 'api': not held, 0 holder(s), 0 waiter(s), paused for ")
    assert 20 < as_json(run("show", "api", "--json", url=url))["paused_for"] <= 30

    resumed = run("resume", "api", url=url)
    assert resumed.stdout.splitlines()[0] == "resumed rate limit and lock 'api'"
    after = as_json(run("resume", "api", "--json", url=url))
    # The slot reserved during the pause (at its end) stays booked: a resume lets no start
    # crowd the starts already promised. (Booked until the bucket is full again: one spacing of
    # 10/s, 0.1 s, past that slot; a CLI as quick as the one in this process shows over 30.)
    assert 20 < after.pop("booked_for") <= 30.1
    assert after == {
        "name": "api",
        "rate": None,
        "burst": None,
        "cap": None,
        "paused_for": 0,
        "lock_paused_for": 0,
    }
    lock.acquire(blocking=False).release()
    assert limit.usage().paused_for == 0.0
    assert run("rates", url=url).returncode == 1
    assert run("resume", "api", url=url).returncode == 0  # nothing to end: done


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["limit", "set", "api", "--rate", "fast"], "rate must be '<limit>/<period>'"),
        (["limit", "set", "api", "--burst", "0"], "burst must be an integer from 1"),
        (["limit", "set", "api", "--burst", "many"], "'many' is not a valid integer"),
        (["limit", "set", "api", "--rate", "0/s"], "the limit must be an integer from 1"),
        (["limit", "set", "api", "--rate", "5/s", "--burst", "-1"], "burst must be"),
        (["limit", "set", "api"], "needs a rate, a burst or a cap"),
        (["limit", "set", "", "--rate", "1/s"], "name must be"),
        (["limit", "clear"], "Missing argument 'NAME'"),
        (["limit", "frobnicate"], "No such command"),
        (["pause", "api", "0"], "pause must be a number of seconds"),
        (["pause", "api", "-5"], "No such option"),
        (["pause", "api", "soon"], "'soon' is not a valid float"),
        (["pause", "api"], "Missing argument 'SECONDS'"),
        (["resume", "}x"], "must not start with '}'"),
        (["rates", ""], "pattern must be"),
    ],
)
def test_bad_rate_commands_are_exit_code_2_and_write_nothing(
    client: redis.Redis, redis_server: RedisServer, args: list[str], message: str
) -> None:
    result = run(*args, url=redis_server.url)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr, result.stderr
    assert client.keys("*") == []


@pytest.mark.parametrize(
    "args",
    [
        ["rates"],
        ["limit", "set", "api", "--rate", "1/s"],
        ["limit", "clear", "api"],
        ["pause", "api", "10"],
        ["resume", "api"],
    ],
)
def test_rate_commands_with_redis_unreachable_are_exit_code_3(args: list[str]) -> None:
    port = free_port()
    result = run(*args, url=f"redis://127.0.0.1:{port}/0")
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert result.stderr.startswith(f"Error: Redis at redis://127.0.0.1:{port}")
    assert "Connection refused" in result.stderr


def test_beat_shows_each_fleets_leader_its_host_and_since_when(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    url = redis_server.url
    assert run("beat", url=url).returncode == 1  # no beat leads
    leader = BeatLeader(client, "proj", ttl=30)
    assert leader.lead(0)
    try:
        listed = run("beat", url=url)
        assert listed.returncode == 0, listed.stderr
        header, row = listed.stdout.splitlines()
        assert header.split()[:2] == ["BEAT", "LEADER"]
        assert row.split()[:4] == ["proj", socket.gethostname(), str(os.getpid()), row.split()[3]]
        (entry,) = as_json(run("beat", "pr*", "--json", url=url))
        assert entry["name"] == "proj" and entry["pid"] == os.getpid()
        assert leader.since is not None
        assert entry["since"] == leader.since.isoformat(timespec="seconds")
        assert 0 < entry["expires_in"] <= 30
        # The leader lock is a lock like any other: `show` names it as a beat leader.
        shown = run("show", "beat:proj", url=url).stdout
        assert f"beat leader since {entry['since']}" in shown
    finally:
        leader.step_down()
    assert run("beat", url=url).returncode == 1
