"""The pytest plugin ``celery_redislock.contrib.pytest``, run as its users run it: test files
written into a scratch project and run by a separate pytest (``pytester``), plus
``release_all`` directly."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import redis

from celery_redislock import Lock
from celery_redislock.contrib.redis_server import RedisServer, _free_port
from celery_redislock.contrib.testing import describe_holder, release_all

pytest_plugins = ["pytester"]

PLUGIN = 'pytest_plugins = ["celery_redislock.contrib.pytest"]\n'

# A user's project: a Celery app with locked tasks, on the in-memory broker.
PROJ = """
import threading

from celery import Celery

app = Celery(
    "proj",
    broker="memory://",
    backend="cache+memory://",
    task_cls="celery_redislock:LockedTask",
)
app.conf.broker_transport_options = {"polling_interval": 0.02}

started = threading.Event()
go = threading.Event()


@app.task(lock="sync:{customer_id}")
def sync_customer(customer_id, full=False):
    started.set()
    go.wait(10)
    return customer_id


@app.task(lock=True)
def report(day):
    return day
"""

WAIT_FOR = """
import time


def wait_for(condition, what, timeout=10):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """A separate pytest process: the scratch project's Celery app and plugin state stay out
    of this one."""
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=120)


def project(pytester: pytest.Pytester, conftest: str = PLUGIN) -> None:
    pytester.makeconftest(conftest)
    pytester.makepyfile(proj=PROJ, waiting=WAIT_FOR)


# -- release_all, in this process ----------------------------------------------------------------


def test_release_all_frees_every_lock_of_the_namespace_only(client: redis.Redis) -> None:
    a = Lock(client, "sync:1", ttl=30)
    b = Lock(client, "sync:2", ttl=30, mode="read", limit=3)
    other = Lock(client, "sync:1", ttl=30, namespace="other")
    held = [a.acquire(), b.acquire(), b.acquire(), other.acquire()]
    client.set("redislock-not-a-lock", "1")
    client.set("plain", "1")

    assert release_all(client) == ["sync:1", "sync:2"]

    assert not a.locked() and not b.locked()
    assert other.locked()
    assert client.keys("redislock:*") == []
    assert client.get("redislock-not-a-lock") == b"1" and client.get("plain") == b"1"
    again = a.acquire(blocking=False)  # free again: a new lease
    assert [h.token for h in a.holders()] == [again.token] and again.token != held[0].token
    assert [h.token for h in other.holders()] == [held[3].token]  # the other namespace's lease
    assert release_all(client, "other") == ["sync:1"]
    assert release_all(client, "other") == []
    assert not other.locked()


def test_release_all_takes_the_namespace_literally(client: redis.Redis) -> None:
    """A namespace with glob characters matches itself only, not what the glob would."""
    star = Lock(client, "x", ttl=30, namespace="a*")
    near = Lock(client, "x", ttl=30, namespace="ab")
    star.acquire()
    near.acquire()
    assert release_all(client, "a*") == ["x"]
    assert not star.locked()
    assert near.locked()


def test_release_all_deletes_in_batches(client: redis.Redis) -> None:
    locks = [Lock(client, f"n{i}", ttl=30) for i in range(520)]
    for lock in locks:
        lock.acquire()
    assert len(release_all(client)) == 520
    assert client.dbsize() == 0


def test_describe_holder_names_the_task(client: redis.Redis) -> None:
    lock = Lock(client, "sync:1", ttl=30)
    lock.acquire(owner="t-1", info={"task_id": "t-1", "task": "proj.sync"})
    lock.acquire(owner="t-1", info={"task_id": "t-1", "task": "proj.sync"})
    line = describe_holder(lock.holders()[0])
    assert line.startswith("task t-1 (proj.sync): write lease, entered 2 times, pid ")
    assert 29 < float(line.rsplit(", expires in ", 1)[1].removesuffix("s")) <= 30  # ttl=30
    bare = Lock(client, "bare", ttl=30)
    lease = bare.acquire()
    assert describe_holder(bare.holders()[0]).startswith(f"lease {lease.token}: write lease")


# -- the Redis fixtures --------------------------------------------------------------------------


def test_session_server_is_started_once_and_stopped(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    pytester.makeconftest(PLUGIN)
    pytester.makepyfile(
        """
        from pathlib import Path

        import redis


        def test_one(redislock_server, redislock_url, redislock_client):
            assert redislock_server.server is not None
            assert redislock_url == redislock_server.url == redislock_server.server.url
            assert redislock_client.ping()
            pid = redislock_client.info("server")["process_id"]
            Path("seen.txt").write_text(f"{redislock_url} {pid}")
            redislock_client.set("kept", "1")


        def test_two(redislock_server, redislock_client):
            url, pid = Path("seen.txt").read_text().split()
            assert redislock_server.url == url  # one server for the session
            assert redislock_client.get("kept") == b"1"  # nothing flushed between tests
            with redislock_server.client() as client:
                assert client.ping()
        """
    )
    result = run(pytester)
    result.assert_outcomes(passed=2)
    _, pid = (pytester.path / "seen.txt").read_text().split()
    assert not Path(f"/proc/{pid}").exists()  # stopped and reaped with the session


def test_redis_url_is_used_and_not_flushed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer
) -> None:
    own = redis.Redis.from_url(redis_server.url)
    own.flushall()
    own.set("someone-else", "1")
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    pytester.makeconftest(PLUGIN)
    pytester.makepyfile(
        """
        import os


        def test_env(redislock_server, redislock_client, redislock):
            assert redislock_server.server is None
            assert redislock_server.url == redislock.url == os.environ["REDIS_URL"]
            assert redislock_client.get("someone-else") == b"1"
            assert redislock.release_all() == []
            assert redislock_client.get("someone-else") == b"1"
        """
    )
    run(pytester).assert_outcomes(passed=1)
    assert own.get("someone-else") == b"1"
    own.close()


def test_unreachable_redis_url_errors_with_the_url(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"redis://127.0.0.1:{_free_port()}/0"
    monkeypatch.setenv("REDIS_URL", url)
    pytester.makeconftest(PLUGIN)
    pytester.makepyfile("def test_x(redislock_client): pass\n")
    result = run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*redislock_server: REDIS_URL={url} does not answer*"])


def test_no_redis_server_errors_with_what_to_install(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    pytester.makeconftest(
        PLUGIN
        + textwrap.dedent(
            """
            import celery_redislock.contrib.redis_server

            celery_redislock.contrib.redis_server.embedded_binary = lambda: None  # not installed
            """
        )
    )
    pytester.makepyfile("def test_x(redislock_url): pass\n")
    result = run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*redislock_server: no redis-server found*REDIS_URL*"])


@pytest.mark.slow  # about 7 s on 2 quiet cores
def test_clean_releases_locks_between_tests(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    pytester.makeconftest(PLUGIN)
    pytester.makepyfile(
        """
        from celery_redislock import Lock


        def test_leaves_a_lock(redislock_client):
            Lock(redislock_client, "left", ttl=60).acquire()


        def test_finds_none(redislock):
            assert redislock.locks() == []
        """
    )
    # Off by default: the lock taken by the first test is still there in the second.
    run(pytester).assert_outcomes(passed=1, failed=1)
    # The ini option applies redislock_clean to every test.
    pytester.makeini("[pytest]\nredislock_clean = true\n")
    run(pytester).assert_outcomes(passed=2)


def test_clean_fixture_and_namespace_option(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    pytester.makeconftest(PLUGIN)
    pytester.makeini("[pytest]\nredislock_namespace = myapp\n")
    pytester.makepyfile(
        """
        from celery_redislock import Lock


        def test_leaves_locks(redislock_client, redislock_namespace):
            assert redislock_namespace == "myapp"
            Lock(redislock_client, "mine", ttl=60, namespace="myapp").acquire()
            Lock(redislock_client, "theirs", ttl=60).acquire()  # namespace redislock


        def test_clean(redislock_clean, redislock, redislock_client):
            assert redislock.locks() == []
            assert Lock(redislock_client, "theirs", ttl=60).locked()
        """
    )
    run(pytester).assert_outcomes(passed=2)


# -- with Celery ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_assertions_on_a_locked_app(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    project(pytester)
    pytester.makepyfile(
        test_app="""
        import pytest

        from celery_redislock import TaskSkipped, lock_for
        from celery_redislock.contrib.testing import assert_lock_key, assert_unlocked, hold_lock
        from proj import app, go, report, started, sync_customer
        from waiting import wait_for


        @pytest.fixture(autouse=True)
        def locks_on_test_redis(redislock_app_config, redislock_url):
            assert redislock_app_config(app) is app
            assert app.conf.redislock_url == redislock_url


        def test_lock_key(redislock):
            assert redislock.configure(app) is app
            assert_lock_key(sync_customer, "sync:42", 42)
            lock = assert_lock_key(sync_customer, "sync:42", customer_id=42, full=True)
            assert lock.namespace == "redislock"
            name = lock_for(report, ("mon",)).name
            assert name.startswith("proj.report:")
            assert_lock_key(report, name, day="mon")


        def test_eager_run_meets_a_held_lock(redislock):
            with redislock.hold(sync_customer, 7) as lease:
                skipped = sync_customer.apply(args=(7,))
                assert skipped.state == "FAILURE" and isinstance(skipped.result, TaskSkipped)
                holders = redislock.assert_locked(sync_customer, 7)
                assert [h.token for h in holders] == [lease.token]
                assert holders[0].info["task_id"] == "pytest"
                assert redislock.locks() == ["sync:7"]
            redislock.assert_unlocked(sync_customer, 7)
            lease = hold_lock(report, "tue")
            redislock.assert_locked(lease.lock)
            lease.release()
            assert_unlocked(lease.lock)


        def test_worker_skips_a_second_run(redislock, redislock_worker):
            started.clear()
            go.clear()
            redislock_worker(app, pool="threads", concurrency=2)
            first = sync_customer.delay(42)
            try:
                assert started.wait(10)
                holders = redislock.assert_locked(sync_customer, 42)
                assert [h.info["task_id"] for h in holders] == [first.id]
                second = sync_customer.delay(42)
                with pytest.raises(TaskSkipped) as skipped:
                    second.get(timeout=10)
                assert (skipped.value.name, skipped.value.holders) == ("sync:42", [first.id])
            finally:
                go.set()
            assert first.get(timeout=10) == 42
            lock = lock_for(sync_customer, (42,))
            wait_for(lambda: not lock.locked(), "the first run released its lock")
            redislock.assert_unlocked(sync_customer, 42)
        """
    )
    result = run(pytester, "-v")
    result.assert_outcomes(passed=3)


@pytest.mark.slow
def test_failure_messages_name_the_lock_and_its_holders(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    project(pytester)
    pytester.makepyfile(
        test_fail="""
        from pathlib import Path

        import pytest

        from celery_redislock import Lock
        from celery_redislock.contrib.testing import assert_lock_key, assert_locked, assert_unlocked
        from proj import app, go, report, started, sync_customer


        @pytest.fixture(autouse=True)
        def locks_on_test_redis(redislock_app_config):
            redislock_app_config(app)


        def test_wrong_key():
            assert_lock_key(sync_customer, "sync:43", 42, full=True)


        def test_not_locked():
            assert_locked(sync_customer, 42)


        def test_held_by_the_test(redislock):
            with redislock.hold(report, "mon"):
                assert_unlocked(report, "mon")


        def test_held_twice(redislock):
            with redislock.hold(sync_customer, 1):
                redislock.hold(sync_customer, 1)


        def test_held_by_a_task(redislock, redislock_worker):
            redislock_worker(app)
            run = sync_customer.delay(5)
            Path("task_id.txt").write_text(run.id)
            try:
                assert started.wait(10)
                redislock.assert_unlocked(sync_customer, 5)
            finally:
                go.set()


        def test_lock_given_with_arguments(redislock_client):
            assert_locked(Lock(redislock_client, "x", ttl=1), 1)


        def test_lock_not_locked(redislock_client):
            assert_locked(Lock(redislock_client, "free", ttl=1))
        """
    )
    result = run(pytester)
    result.assert_outcomes(failed=7)
    task_id = (pytester.path / "task_id.txt").read_text()
    result.stdout.fnmatch_lines(
        [
            "E *AssertionError: proj.sync_customer(42, full=True) takes lock 'sync:42', "
            "expected 'sync:43'",
            "E *AssertionError: lock 'sync:42' of proj.sync_customer(42) is not held "
            "(no live lease in namespace 'redislock' on 127.0.0.1:*/0)",
            "E *AssertionError: lock 'proj.report:*' of proj.report('mon') is held by 1 holder "
            "(namespace 'redislock' on 127.0.0.1:*/0):",
            "E *- the test itself (hold_lock): write lease, pid * on *, expires in 1?.?s",
            "E *AssertionError: cannot hold lock 'sync:1' of proj.sync_customer(1): it is held "
            "by 1 holder (namespace 'redislock' on 127.0.0.1:*/0):",
            "E *- the test itself (hold_lock): write lease, *",
            "E *AssertionError: lock 'sync:5' of proj.sync_customer(5) is held by 1 holder *",
            f"E *- task {task_id} (proj.sync_customer): write lease, pid *, expires in *s",
            "E *TypeError: call arguments given with a Lock*",
            "E *AssertionError: lock 'free' is not held (no live lease in namespace 'redislock' "
            "on 127.0.0.1:*/0)",
        ]
    )
    # The helpers' own frames are hidden: each failure points at the user's line.
    result.stdout.no_fnmatch_line("*celery_redislock/testing.py:*")


@pytest.mark.slow
def test_with_celerys_own_fixtures(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``celery.contrib.pytest``'s ``celery_app`` and in-process ``celery_worker``, configured
    through ``celery_config``/``celery_parameters`` as the module docstring shows."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    pytester.makeconftest(
        """
        import pytest

        pytest_plugins = ["celery_redislock.contrib.pytest", "celery.contrib.pytest"]


        @pytest.fixture(scope="session")
        def celery_config(redislock_celery_config):
            return {
                **redislock_celery_config,
                "broker_transport_options": {"polling_interval": 0.02},
            }


        @pytest.fixture(scope="session")
        def celery_parameters():
            return {"task_cls": "celery_redislock:LockedTask"}
        """
    )
    pytester.makepyfile(waiting=WAIT_FOR)
    pytester.makepyfile(
        """
        import pytest

        from celery_redislock import TaskSkipped


        def test_skip_on_celery_app(celery_app, celery_worker, redislock, redislock_url):
            assert celery_app.conf.redislock_url == redislock_url

            @celery_app.task(lock="job:{n}")
            def job(n):
                return n

            celery_worker.reload()
            redislock.assert_lock_key(job, "job:1", 1)
            with redislock.hold(job, 1):
                with pytest.raises(TaskSkipped):
                    job.delay(1).get(timeout=10)
            assert job.delay(1).get(timeout=10) == 1
        """
    )
    run(pytester).assert_outcomes(passed=1)


@pytest.mark.slow  # about 4 s on 2 quiet cores
def test_plugin_loads_without_celery_fixtures(pytester: pytest.Pytester) -> None:
    """Only our fixtures are added: Celery's come from their own plugins."""
    pytester.makeconftest(PLUGIN)
    result = run(pytester, "--fixtures")
    assert result.ret == 0
    for name in (
        "redislock_server",
        "redislock_url",
        "redislock_client",
        "redislock_namespace",
        "redislock_clean",
        "redislock_app_config",
        "redislock_celery_config",
        "redislock_worker",
        "redislock ",
    ):
        result.stdout.fnmatch_lines([f"{name}*"])
    result.stdout.no_fnmatch_line("celery_app*")
