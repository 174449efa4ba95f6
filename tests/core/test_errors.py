"""The exception tree survives the trip through Celery's result backend: a task's caller gets
the class the docs promise (``LockNotAcquired``, ``DuplicateTask``, ...), not a base class."""

from __future__ import annotations

import pickle

import pytest
from celery import Celery
from celery.utils.serialization import get_pickleable_exception

from celery_redislock import (
    DuplicateTask,
    JobFinished,
    LockBackendError,
    LockConfigError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    LockUpgradeError,
    RedisLockError,
    TaskSkipped,
)

ERRORS = [
    LockNotAcquired("held by t1", name="sync:42", timeout=5.0, owner_expires_in=None),
    LockNotOwned("not held", name="sync:42", token="abc"),
    LockLost("lost", name="sync:42", token="abc"),
    JobFinished("finished", name="sync:42", job="t1.0.0"),
    DuplicateTask("queued", name="r:1", task_id="t1", expires_in=3.5, state="queued"),
    LockBackendError("Redis failed", name="sync:42"),
    LockConfigError("bad ttl", name="sync:42"),
    LockUpgradeError("read to write", name="sync:42"),
    TaskSkipped("skipped", name="sync:42", holders=["t1"], outcome="skipped"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_each_error_pickles_with_its_class_and_attributes(error: RedisLockError) -> None:
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert again.args == error.args and vars(again) == vars(error)
    # What Celery's worker does before storing a task's exception: keep it, if it pickles.
    assert type(get_pickleable_exception(error)) is type(error)


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_each_error_comes_back_from_a_json_result_backend(error: RedisLockError) -> None:
    backend = Celery("errors", backend="cache+memory://", set_as_current=False).backend
    assert backend.serializer == "json"
    again = backend.exception_to_python(backend.prepare_exception(error))
    # JSON keeps the class and the message; the attributes are not part of the message.
    assert type(again) is type(error)
    assert str(again) == str(error)


def test_task_skipped_keeps_its_lock_and_holders_through_a_json_result_backend() -> None:
    """A skipped Celery run's error comes back with what it names (Celery stores ``args``)."""
    backend = Celery("errors", backend="cache+memory://", set_as_current=False).backend
    error = TaskSkipped("skipped", name="sync:42", holders=["t1"], outcome="skipped")
    again = backend.exception_to_python(backend.prepare_exception(error))
    assert (again.name, again.holders, again.outcome) == ("sync:42", ["t1"], "skipped")
    assert str(again) == "skipped"
