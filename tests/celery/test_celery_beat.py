"""One beat for the fleet: ``LeaderScheduler`` over Celery's ``PersistentScheduler``, real
``celery beat`` processes (``tests/beatapp``'s sibling ``beatleader``) on a Redis of their own,
killed, stopped and paused for real; the messages they sent counted in the broker's list (no
worker reads it). Each message names its tick (``redislock_beat`` header): the tests check
each entry's chain of ticks (``tests/beatcheck.py``): none sent twice, none lost."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from beatcheck import TESTS, Beat, chains, leader_pid, sent, skips
from celery import Celery
from helpers import STARTED_WORKERS, wait_for

from celery_redislock import LeaderScheduler, LockConfigError
from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.beat_leader import leader_of
from celery_redislock.core.layout import set_layout

TTL = 1.0


@pytest.fixture
def beat_redis() -> Iterator[redis.Redis]:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        yield client
        client.close()


@pytest.fixture
def beats(
    beat_redis: redis.Redis, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Beat]]:
    """Starts beats (``beats("b1", env={...})``); every one is stopped at the end, and a failed
    test's report carries each one's log."""
    started: list[Beat] = []
    request.node.stash[STARTED_WORKERS] = started
    url = f"redis://127.0.0.1:{beat_redis.connection_pool.connection_kwargs['port']}/0"

    def start(
        name: str,
        env: dict[str, str] | None = None,
        *,
        worker: bool = False,
        app: str = "beatleader",
    ) -> Beat:
        beat = Beat(url, tmp_path, name, {"BEAT_TTL": str(TTL), **(env or {})}, app)
        started.append(beat)
        return beat.start(worker=worker)

    yield start
    for beat in started:
        beat.stop()


def _leader(client: redis.Redis, fleet: list[Beat]) -> Beat:
    wait_for(lambda: leader_pid(client) is not None, "a beat leads", 60)
    pid = leader_pid(client)
    return next(b for b in fleet if pid in b.pids())


def _count(client: redis.Redis, entry: str) -> int:
    return sum(1 for m in sent(client) if m.entry == entry)


def _claimed_unsent(client: redis.Redis) -> set[tuple[int, int]]:
    """Read just after a leader was killed: the ticks it claimed and never sent (it died between
    the mark and the publish, a window of a few ms: lost, at most once as documented), as the
    links of the chain they break: (the last run sent, the run the mark names)."""
    found = set()
    for entry, chain in chains(sent(client), {}).items():
        last = chain.messages[-1].run
        mark = client.get(f"redislock:{{beat:beatleader}}:tick:{entry}:{last}")
        if mark is not None:
            found.add((last, int(mark.removeprefix(b"skip:"))))
    return found


def _whole(client: redis.Redis, lost: set[tuple[int, int]] | None = None) -> None:
    """Every entry's chain: no tick twice, none lost (but for ``lost``: see above)."""
    for chain in chains(sent(client), skips(client)).values():
        assert chain.doubled == [], f"{chain.entry}: ticks sent twice: {chain.doubled}"
        assert set(chain.broken) <= (lost or set()), f"{chain.entry}: ticks lost: {chain.broken}"


# -- declarations, in process ------------------------------------------------------------------


def _app(**conf: object) -> Celery:
    app = Celery("beatconf", broker="memory://", set_as_current=False)
    app.conf.redislock_url = "redis://127.0.0.1:1/0"  # never reached: nothing ticks
    app.conf.update(conf)
    return app


def _schedule(**options: object) -> dict[str, object]:
    return {"report": {"task": "t", "schedule": 60.0, "options": options}}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"redislock": {"missed": "later"}}, r"beat entry 'report': option redislock\.missed"),
        ({"redislock": {"mised": "skip"}}, r"beat entry 'report': unknown option redislock\.mised"),
        ({"redislock": "skip"}, r"beat entry 'report': option 'redislock' must be a dict"),
    ],
)
def test_a_bad_entry_option_is_refused_naming_the_entry_and_the_option(
    options: dict[str, object], message: str, tmp_path: Path
) -> None:
    app = _app(beat_schedule=_schedule(**options))
    with pytest.raises(LockConfigError, match=message):
        LeaderScheduler(app=app, schedule_filename=str(tmp_path / "s"), lazy=True)


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"redislock_beat_missed": "maybe"}, r"setting redislock_beat_missed must be one of"),
        ({"redislock_beat_ttl": 0}, r"setting redislock_beat_ttl must be a number of seconds"),
        ({"redislock_beat_scheduler": "nowhere:Nothing"}, r"redislock_beat_scheduler: cannot"),
        ({"redislock_beat_scheduler": "builtins:dict"}, r"must name a celery\.beat\.Scheduler"),
        ({"redislock_beat_scheduler": LeaderScheduler}, r"not LeaderScheduler itself"),
    ],
)
def test_bad_beat_settings_are_refused_naming_the_setting(
    conf: dict[str, object], message: str, tmp_path: Path
) -> None:
    with pytest.raises(LockConfigError, match=message):
        LeaderScheduler(app=_app(**conf), schedule_filename=str(tmp_path / "s"), lazy=True)


def test_the_scheduler_runs_the_inner_class_named(tmp_path: Path) -> None:
    app = _app(redislock_beat_scheduler="celery.beat:Scheduler", beat_schedule=_schedule())
    scheduler = LeaderScheduler(app=app, lazy=True)
    from celery.beat import PersistentScheduler, Scheduler

    assert isinstance(scheduler, LeaderScheduler) and type(scheduler).__mro__[2] is Scheduler
    assert not isinstance(scheduler, PersistentScheduler)
    assert "leader lease -> beat:beatconf" in scheduler.info


# -- real beats --------------------------------------------------------------------------------


@pytest.mark.parametrize("worker", [False, True], ids=["beat", "worker --beat"])
def test_a_bad_entry_option_stops_beat_and_worker_beat_before_they_start(
    beats: Callable[..., Beat], worker: bool
) -> None:
    beat = beats("bad", {"BEAT_SKIP": "1s", "BEAT_MISSED": "later"}, worker=worker)
    assert beat.proc is not None and beat.proc.wait(60) == 1
    message = "beat entry '1s': option redislock.missed: must be one of 'send', 'skip'"
    assert message in beat.log()
    if worker:  # (the worker itself, not only its beat process)
        assert f"the worker refuses to start: {message}" in beat.log()


@pytest.mark.slow  # about 4 s on 2 quiet cores
@pytest.mark.parametrize("layout", ["shared", "lean"])
def test_two_beats_one_leader_each_tick_sent_once(
    beats: Callable[..., Beat], beat_redis: redis.Redis, layout: str
) -> None:
    """In either key layout of the namespace (the leader lease is a plain mutex: in the lean
    layout it lives in the lock's meta hash alone)."""
    set_layout(beat_redis, "redislock", layout)
    # A lease of 10 s: the standby never leads while the leader lives, however busy the
    # machine (with 1 s, renewals delayed under 2 CPU burners let the lease lapse, and the
    # standby took over, as it must).
    env = {"BEAT_TTL": "10"}
    fleet = [beats("b1", env), beats("b2", env)]
    leader = _leader(beat_redis, fleet)
    wait_for(lambda: _count(beat_redis, "1s") >= 2, "2 ticks of the 1 s entry", 60)
    _whole(beat_redis)
    standby = next(b for b in fleet if b is not leader)
    assert "this beat leads now" in leader.log()
    assert "this beat leads now" not in standby.log()
    assert "Sending due task" not in standby.log()
    info = leader_of(beat_redis, "beatleader")
    assert info is not None and info.since is not None and info.host


@pytest.mark.slow
@pytest.mark.faults
def test_a_sigkilled_leader_is_replaced_and_its_missed_tick_sent_once(
    beats: Callable[..., Beat], beat_redis: redis.Redis
) -> None:
    # A ttl of 3 s: renewed each second, the lease outlives the leader by 2 s at least, so the
    # 1 s entry surely falls due while no beat leads.
    env = {"BEAT_TTL": "3"}
    fleet = [beats("b1", env), beats("b2", env)]
    leader = _leader(beat_redis, fleet)
    wait_for(lambda: _count(beat_redis, "1s") >= 3, "3 ticks of the 1 s entry", 60)
    leader.kill()
    lost = _claimed_unsent(beat_redis)
    before = len(sent(beat_redis))
    standby = next(b for b in fleet if b is not leader)
    wait_for(lambda: len(sent(beat_redis)) >= before + 3, "the new leader sent 3 ticks", 60)
    _whole(beat_redis, lost)
    assert "entry '1s' fell due while no beat led: sending it once" in standby.log()
    ones = [m for m in sent(beat_redis) if m.entry == "1s"]
    # The longest gap between two ticks: the ttl and a tick's wait (a liveness bound only: the
    # machine is busy).
    takeover = max(ones[i + 1].run - ones[i].run for i in range(len(ones) - 1)) / 1e6
    assert takeover < 3 + 1 + 10


@pytest.mark.slow
@pytest.mark.faults
def test_missed_ticks_skipped_when_the_entry_says_so(
    beats: Callable[..., Beat], beat_redis: redis.Redis
) -> None:
    env = {"BEAT_ENTRIES": "1s=1", "BEAT_SKIP": "1s", "BEAT_TTL": "3"}  # (ttl: as above)
    fleet = [beats("b1", env), beats("b2", env)]
    leader = _leader(beat_redis, fleet)
    wait_for(lambda: _count(beat_redis, "1s") >= 3, "3 ticks", 60)
    leader.kill()
    # The leader may have died between claiming its next tick and sending it: that tick is
    # then lost (at most once), not the new leader's to skip.
    lost = _claimed_unsent(beat_redis)
    standby = next(b for b in fleet if b is not leader)
    wait_for(lambda: "this beat leads now" in standby.log(), "the standby took over", 60)
    before = _count(beat_redis, "1s")
    wait_for(lambda: _count(beat_redis, "1s") >= before + 2, "2 ticks after the takeover", 60)
    _whole(beat_redis, lost)
    found = chains(sent(beat_redis), skips(beat_redis))["1s"]
    if lost:
        assert "another beat sent that tick" in standby.log()
    else:
        assert "entry '1s' fell due while no beat led: skipped (missed='skip')" in standby.log()
        assert len(found.skipped) == 1  # the chain went through the one skipped tick


@pytest.mark.slow
@pytest.mark.faults
def test_a_paused_leader_sends_nothing_once_its_lease_may_have_lapsed(
    beats: Callable[..., Beat], beat_redis: redis.Redis
) -> None:
    """SIGSTOP the leader past its ttl: the standby takes over; SIGCONT: the old leader finds
    its lease lost before its next send, and sends nothing more."""
    fleet = [beats("b1"), beats("b2")]
    leader = _leader(beat_redis, fleet)
    wait_for(lambda: _count(beat_redis, "1s") >= 2, "2 ticks", 60)
    leader.signal(signal.SIGSTOP)
    standby = next(b for b in fleet if b is not leader)
    wait_for(lambda: "this beat leads now" in standby.log(), "the standby took over", 60)
    before = _count(beat_redis, "1s")
    wait_for(lambda: _count(beat_redis, "1s") >= before + 2, "the new leader sends", 60)
    leader.signal(signal.SIGCONT)
    wait_for(lambda: "lost the leader lease" in leader.log(), "the old leader saw its loss", 60)
    now = _count(beat_redis, "1s")
    wait_for(lambda: _count(beat_redis, "1s") >= now + 3, "3 more ticks", 60)

    # Nothing sent once it found its loss. (A send it had decided, its tick marked, before the
    # SIGSTOP may end after the SIGCONT: that tick is its own, sent once, as _whole checks.) A
    # tick the stop cut short, after the leader's own check, may go on after the SIGCONT as far
    # as Celery's "Sending due task" line: each such tick must be refused there, not sent.
    def after_loss() -> tuple[int, int]:
        text = leader.log().split("lost the leader lease", 1)[1]
        return text.count("Sending due task"), len(re.findall(r"entry '[^']*' not sent", text))

    wait_for(lambda: len(set(after_loss())) == 1, "each tick begun after the loss refused", 30)
    _whole(beat_redis)


@pytest.mark.slow
def test_a_beat_stopped_gives_the_lead_back_at_once(
    beats: Callable[..., Beat], beat_redis: redis.Redis
) -> None:
    # A 6 s lease: the stop must give it back, not its lapse (a 1 s lease lapsed under LOAD=2,
    # before the stop, at a load average of 12).
    env = {"BEAT_TTL": "6"}
    fleet = [beats("b1", env), beats("b2", env)]
    leader = _leader(beat_redis, fleet)
    wait_for(lambda: _count(beat_redis, "1s") >= 2, "2 ticks", 60)
    leader.stop()
    assert "this beat stepped down" in leader.log()
    standby = next(b for b in fleet if b is not leader)
    wait_for(lambda: "this beat leads now" in standby.log(), "the standby took over", 60)
    before = _count(beat_redis, "1s")
    wait_for(lambda: _count(beat_redis, "1s") >= before + 2, "the new leader sends", 60)
    _whole(beat_redis)


@pytest.mark.slow
@pytest.mark.faults
def test_worker_beat_on_two_workers_sends_each_tick_once(
    beats: Callable[..., Beat], beat_redis: redis.Redis
) -> None:
    fleet = [beats("w1", worker=True), beats("w2", worker=True)]
    leader = _leader(beat_redis, fleet)
    beat_pid = leader_pid(beat_redis)
    assert beat_pid is not None and beat_pid != leader.pid  # (beat runs in a child process)
    wait_for(lambda: _count(beat_redis, "1s") >= 3, "3 ticks", 60)
    # SIGKILL to the worker's own pid only (as the OOM killer does): its beat process must not
    # lead on as an orphan.
    assert leader.proc is not None
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait(10)
    wait_for(lambda: "the worker of this beat is gone" in leader.log(), "the orphan stops", 60)
    # (The orphan gives the lease back as it stops: it claims nothing more.)
    wait_for(lambda: not Path(f"/proc/{beat_pid}").exists(), "the orphan beat exited", 60)
    standby = next(b for b in fleet if b is not leader)
    wait_for(lambda: "this beat leads now" in standby.log(), "the other worker's beat leads", 60)
    before = _count(beat_redis, "1s")
    wait_for(lambda: _count(beat_redis, "1s") >= before + 2, "the new leader sends", 60)
    _whole(beat_redis)


@pytest.mark.slow
@pytest.mark.faults
def test_database_scheduler_leader_sigkilled_each_tick_once(
    beats: Callable[..., Beat], beat_redis: redis.Redis, tmp_path: Path
) -> None:
    """django-celery-beat's DatabaseScheduler (its table in SQLite, shared) under the leader:
    its entries read again from the table carry the last run the table holds (written every
    3 minutes): such a tick is not sent twice, and the chain goes on."""
    pytest.importorskip("django_celery_beat")
    env = {"BEAT_TTL": "3", "BEAT_DB": str(tmp_path / "beat.sqlite3")}
    migrate = "import beatdjango; from django.core.management import call_command; "
    migrate += "call_command('migrate', verbosity=0)"
    subprocess.run(
        [sys.executable, "-c", migrate],
        check=True,
        timeout=120,
        env={**os.environ, "BEAT_REDIS_URL": "redis://unused", **env, "PYTHONPATH": str(TESTS)},
    )
    fleet = [beats(f"d{i}", env, app="beatdjango") for i in (1, 2)]
    leader = _leader(beat_redis, fleet)
    wait_for(lambda: _count(beat_redis, "1s") >= 3, "3 ticks", 60)
    leader.kill()
    lost = _claimed_unsent(beat_redis)
    standby = next(b for b in fleet if b is not leader)
    wait_for(lambda: "this beat leads now" in standby.log(), "the standby took over", 60)
    before = _count(beat_redis, "1s")
    wait_for(lambda: _count(beat_redis, "1s") >= before + 3, "the new leader sends", 60)
    _whole(beat_redis, lost)
    assert "DatabaseScheduler" in standby.log()
