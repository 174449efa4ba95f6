"""Declaring a locked RQ job: the ``locked`` decorator, checked when the function is defined."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, TypeVar

from ...core.lease import RedisClient
from ...core.line import Handover
from ...core.lock import Lock
from ...core.options import LockOption, call_signature, parse_lock_option
from ...core.rate_options import RateOptionDict, parse_rate_option
from ...core.run import TaskSpec, locks_of_call, make_lock
from ...core.unique_options import (
    Lifecycle,
    UniqueOptionDict,
    parse_unique_option,
)
from ...errors import LockConfigError
from .line import PutBack
from .running import run
from .settings import Settings, client_for, default_settings

__all__ = ["JobSpec", "lock_for", "locked", "locks_for_job", "spec_of"]

P = ParamSpec("P")
R = TypeVar("R")
SPEC_ATTR = "redislock"


@dataclass(frozen=True, slots=True)
class JobSpec(TaskSpec):
    """What ``@locked`` declared on a job function: its options (``name`` is the function's
    import path, as RQ records it), and the settings it was given."""

    own_settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        return self.own_settings or default_settings()

    def lock_name(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        assert self.lock is not None
        return self.name_of(self.lock, args, kwargs)

    def unique_name(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        assert self.unique is not None
        return self.name_of(self.unique.keying, args, kwargs)

    def make_lock(
        self,
        client: RedisClient,
        name: str,
        settings: Settings | None = None,
        handover: Handover | None = None,
    ) -> Lock:
        """The lock ``name``; ``settings``: the ones the caller read already (read once per
        job); ``handover``: puts back the parked jobs its release hands the lock to
        (:class:`.line.PutBack`; without one, their short hand-overs lapse at once and a
        sweeper does)."""
        assert self.lock is not None
        return make_lock(settings or self.settings, client, self.lock, name, handover)


def locked(
    lock: LockOption = None,
    unique: Lifecycle | UniqueOptionDict | Literal[False] | None = None,
    *,
    rate: str | RateOptionDict | None = None,
    settings: Settings | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Declares a job function's lock, uniqueness and/or rate limit, with the same ``lock=``,
    ``unique=`` and ``rate=`` options as a Celery task (see docs/rq.md). Bad options raise
    :class:`LockConfigError` here, naming the function and the option.

    The lease is taken in the process that runs the job (RQ's work horse), kept by the
    heartbeat, and given back as the call ends, however it ends. Enqueue-time uniqueness
    needs :class:`UniqueQueue` on the producer side.

    >>> from celery_redislock.integrations.rq import locked
    >>> @locked(lock="sync:{customer_id}", unique="until_finished")
    ... def sync_customer(customer_id: int) -> None: ...
    """

    def decorate(fun: Callable[P, R]) -> Callable[P, R]:
        if not callable(fun) or not hasattr(fun, "__qualname__"):
            raise LockConfigError(f"@locked decorates a function, got {fun!r}")
        name = f"{fun.__module__}.{fun.__qualname__}"
        if "<locals>" in fun.__qualname__ or "<lambda>" in fun.__qualname__:
            raise LockConfigError(
                f"job {name!r}: RQ runs a job by its import path, so a locked job must be a "
                "module-level function"
            )
        if hasattr(fun, SPEC_ATTR):
            raise LockConfigError(f"job {name!r}: @locked is applied twice")
        if settings is not None and not isinstance(settings, Settings):
            raise LockConfigError(
                f"job {name!r}: settings must be a celery_redislock.integrations.rq.Settings, "
                f"got {type(settings).__name__}"
            )
        signature = call_signature(fun, bound=False)
        lock_opts = parse_lock_option(name, signature, lock)
        unique_opts, lock_opts = parse_unique_option(name, signature, unique, lock_opts)
        rate_opts = parse_rate_option(name, signature, rate)
        if lock_opts is None and unique_opts is None and rate_opts is None:
            raise LockConfigError(f"job {name!r}: @locked needs lock=, unique= or rate=")
        spec = JobSpec(name, lock_opts, unique_opts, rate_opts, signature, settings)

        @functools.wraps(fun)
        def run_locked(*args: P.args, **kwargs: P.kwargs) -> R:
            result: R = run(spec, spec.settings, fun, args, kwargs)
            return result

        setattr(run_locked, SPEC_ATTR, spec)
        return run_locked

    return decorate


def spec_of(fun: object) -> JobSpec | None:
    """The spec ``@locked`` put on ``fun`` (``None`` for any other callable)."""
    spec = getattr(fun, SPEC_ATTR, None)
    return spec if isinstance(spec, JobSpec) else None


def lock_for(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Lock:
    """The lock a call of the locked job ``fun`` with these arguments takes, e.g. to look at
    its holders. The lock Redis is ``REDISLOCK_URL``'s (this one needs a URL set).

    >>> lock_for(sync_customer, 42).holders()   # doctest: +SKIP
    """
    spec = spec_of(fun)
    if spec is None or spec.lock is None:
        raise LockConfigError(f"{getattr(fun, '__qualname__', fun)!r} has no lock= option")
    return spec.make_lock(client_for(spec.settings, None), spec.lock_name(args, kwargs))


def locks_for_job(job: Any) -> list[Lock]:
    """The locks an RQ job's call takes (none if its function declares no lock): its lock, then
    a ``lock=`` list's further ones; the lock Redis is the settings' URL, else the job's
    connection."""
    spec = spec_of(job.func)
    if spec is None or spec.lock is None:
        return []
    settings = spec.settings
    client = client_for(settings, job.connection)
    put_back = PutBack(job.connection, job.serializer, client, settings.line_handover_window)
    return locks_of_call(spec, settings, client, job.args or (), job.kwargs or {}, put_back)
