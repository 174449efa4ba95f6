"""``lock_workflow`` in process, no worker: bad declarations are refused as the workflow is
declared, naming the task and the option; a good one stamps every link."""

from __future__ import annotations

import re
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group

from celery_redislock import Lock, LockConfigError, TaskSkipped, install, lock_workflow
from celery_redislock.core.workflow_options import options_from_message
from celery_redislock.integrations.celery.kind import WORKFLOW_HEADER


@pytest.fixture(scope="module")
def app() -> Any:
    application = install(Celery("wfopts", broker="memory://", set_as_current=False))

    @application.task(name="etl.fetch", shared=False)
    def fetch(tenant: int, full: bool = False) -> int: ...

    @application.task(name="etl.transform", shared=False)
    def transform(rows: Any) -> Any: ...

    @application.task(name="etl.load", shared=False)
    def load(rows: Any) -> Any: ...

    @application.task(name="etl.locked", shared=False, lock="x:{rows}")
    def locked(rows: Any) -> Any: ...

    @application.task(name="etl.unique", shared=False, unique="until_started")
    def unique(rows: Any) -> Any: ...

    plain = Celery("plain", broker="memory://", set_as_current=False)

    @plain.task(name="etl.plain", shared=False)
    def plain_task(rows: Any) -> Any: ...

    application.plain_task = plain_task
    return application


def _etl(app: Any) -> Any:
    t = app.tasks
    return t["etl.fetch"].s(tenant=42) | t["etl.transform"].s() | t["etl.load"].s()


@pytest.mark.parametrize(
    ("lock", "message"),
    [
        ("etl:{tenant_id}", "task 'etl.fetch': lock option 'key': template names argument(s) "),
        ({"key": "etl:{tenant}", "on_conflict": "later"}, "lock option 'on_conflict': must be "),
        ({"key": "etl:{tenant}", "ttl": 0}, "task 'etl.fetch': lock option 'ttl': must be a "),
        ({"key": "etl:{tenant}", "max_gap": 0.5}, "workflow lock option 'max_gap': must be a "),
        ({"key": "etl:{tenant}", "on_conflcit": "skip"}, "unknown workflow lock option(s) "),
        ({"key": lambda tenant, full: f"etl:{tenant}"}, "workflow lock option 'key': must be a "),
        (["etl:{tenant}", "etl:all"], "'lock': a workflow takes one lock, not a list"),
        (
            {"key": "e:{tenant}", "on_conflict": "skip", "max_wait": 5},
            "to on_conflict='queue' only",
        ),
    ],
)
def test_a_bad_lock_is_refused_naming_the_first_task_and_the_option(
    app: Any, lock: Any, message: str
) -> None:
    with pytest.raises(LockConfigError) as refused:
        lock_workflow(_etl(app), lock=lock)
    assert message in str(refused.value)
    assert "etl.fetch" in str(refused.value)


def test_a_link_with_a_lock_of_its_own_is_refused_naming_it(app: Any) -> None:
    t = app.tasks
    for name, option in (("etl.locked", "lock"), ("etl.unique", "unique")):
        flow = t["etl.fetch"].s(tenant=1) | t[name].s()
        with pytest.raises(
            LockConfigError, match=re.escape(f"task '{name}': task option '{option}': a link")
        ):
            lock_workflow(flow, lock="etl:{tenant}")


def test_a_link_without_our_task_class_is_refused(app: Any) -> None:
    flow = app.tasks["etl.fetch"].s(tenant=1) | app.plain_task.s()
    with pytest.raises(LockConfigError, match=r"task 'etl\.plain': workflow lock: its task class"):
        lock_workflow(flow, lock="etl:{tenant}")


def test_groups_and_chords_in_the_chain_are_refused(app: Any) -> None:
    t = app.tasks
    fetch, load = t["etl.fetch"].s(tenant=1), t["etl.load"].s()
    for canvas in (
        chain(fetch, group(t["etl.transform"].s(), t["etl.transform"].s())),
        chain(fetch, chord([t["etl.transform"].s(), t["etl.transform"].s()], load)),
        chain(fetch, group(t["etl.transform"].s(), t["etl.transform"].s()), load),
    ):
        with pytest.raises(
            LockConfigError, match=r"'etl\.transform': workflow lock option 'lock': a"
        ):
            lock_workflow(canvas, lock="etl:{tenant}")


def test_every_link_is_stamped_with_its_place_and_the_lock(app: Any) -> None:
    t = app.tasks
    nested = t["etl.fetch"].s(tenant=1) | (t["etl.transform"].s() | t["etl.load"].s())
    flow = lock_workflow(nested, lock={"key": "etl:{tenant}", "on_conflict": "retry"})
    stamps = [link.options["headers"][WORKFLOW_HEADER] for link in flow.tasks]
    assert [s["link"] for s in stamps] == [0, 1, 2]
    assert len({s["lock"] for s in stamps}) == 1
    parsed = options_from_message("etl.fetch", None, stamps[0]["lock"])
    assert (parsed.lock.key, parsed.lock.on_conflict, parsed.max_gap) == (
        "etl:{tenant}",
        "retry",
        3600,
    )
    # The chain given is left as it was.
    assert all(WORKFLOW_HEADER not in (s.options.get("headers") or {}) for s in nested.tasks)
    single = lock_workflow(t["etl.fetch"].s(tenant=1), lock="etl:{tenant}")
    assert single.options["headers"][WORKFLOW_HEADER]["link"] == 0


def test_an_eager_workflow_takes_the_lock_at_its_first_link_only(celery_server: Any) -> None:
    eager = install(Celery("wfeager", broker="memory://", set_as_current=False))
    eager.conf.update(task_always_eager=True, redislock_url=celery_server.url)

    @eager.task(name="eager.first", shared=False)
    def first(tenant: int) -> int:
        return tenant

    @eager.task(name="eager.then", shared=False)
    def then(value: int) -> int:
        return value + 1

    flow = lock_workflow(first.s(tenant=7) | then.s() | then.s(), lock="eager:{tenant}")
    assert flow.apply_async().get() == 9
    held = Lock(redis.Redis.from_url(celery_server.url), "eager:7", ttl=5).acquire()
    try:
        with pytest.raises(TaskSkipped, match="lock 'eager:7' is held"):
            flow.apply_async()  # (eager: the chain raises what its first link raised)
    finally:
        held.release()
