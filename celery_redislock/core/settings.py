"""The package's settings: ONE schema and the frozen :class:`Settings` both integrations use.

Each field is written once: its default in :class:`Settings`; what it accepts, its environment
name (``REDISLOCK_TTL``) and Celery name (``redislock_ttl``) in :data:`FIELDS`. Every source
(Celery's ``app.conf``, the environment, keyword arguments) is checked by the same code, and a
bad value is refused as its source spells it.

>>> Settings.from_env({"REDISLOCK_TTL": "30"}) == Settings.from_mapping({"redislock_ttl": 30}.get)
True
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ..errors import LockConfigError
from ._validate import int_at_least, non_empty_string, one_of, true_or_false
from .beat_leader import MISSED_POLICIES
from .claims import DEFAULT_PUBLISH_WINDOW
from .clients import parse_sentinels
from .durations import ALLOWANCE, OTHER, TTL, Duration, seconds
from .handover import DEFAULT_HANDOVER_WINDOW
from .keys import DEFAULT_NAMESPACE, check_namespace
from .lease import RedisClient
from .lock import DEFAULT_FENCE_KEEP
from .options import CONFLICT_ACTIONS, ConflictAction
from .redlock_masters import parse_master_urls
from .replicas import check_policy
from .unique_options import ON_DUPLICATE, OnDuplicate

__all__ = [
    "BACKEND_POLICIES",
    "CELERY",
    "DISABLED_ENV",
    "ENV",
    "FIELDS",
    "KWARGS",
    "SWEEP_INTERVAL",
    "BackendPolicy",
    "Field",
    "Naming",
    "Settings",
    "disabled_by_env",
    "read_mapping",
]

BackendPolicy = Literal["fail", "retry", "run"]
BACKEND_POLICIES: tuple[BackendPolicy, ...] = get_args(BackendPolicy)
# Below 50 ms the sweeps cost more than the lapses they catch; past a minute a dead holder's
# line waits too long.
SWEEP_INTERVAL = Duration(0.05, 60.0)
ENV_PREFIX = "REDISLOCK_"
CONF_PREFIX = "redislock_"
# The kill switch, for an emergency without a code change (both integrations read it).
DISABLED_ENV = ENV_PREFIX + "DISABLED"


@dataclass(frozen=True, slots=True)
class Settings:
    """Every lock setting of a process or app; see the tables in docs/celery.md and docs/rq.md.
    A bad value raises :class:`~celery_redislock.LockConfigError` naming it.

    >>> from celery_redislock.integrations.rq import Settings
    >>> Settings(ttl=30, on_conflict="retry").ttl
    30.0
    """

    url: str | None = None
    """The lock Redis (Celery: else the broker's, if Redis; RQ: else the job's connection)."""
    namespace: str = DEFAULT_NAMESPACE
    ttl: float = 15.0
    on_conflict: ConflictAction = "skip"
    on_duplicate: OnDuplicate = "existing"
    on_backend_error: BackendPolicy = "fail"
    queue_allowance: float = 600.0
    """Seconds a unique task's queued claim lasts beyond its countdown/ETA."""
    unique_publish_window: float = DEFAULT_PUBLISH_WINDOW
    """Seconds a unique task's claim lasts until its publish went through (then: its lifetime)."""
    completion_ttl: float = 3600.0
    """Seconds a finished run is remembered, so a redelivery or requeued copy is dropped (a
    Redis broker redelivers after its visibility timeout, 1 h)."""
    fence_keep: float = DEFAULT_FENCE_KEEP
    """Seconds a lock's fence mark outlives its last use (server clock steps back safely)."""
    line_handover_window: float = DEFAULT_HANDOVER_WINDOW
    """Seconds a lock handed to a parked task waits for it to start and claim it."""
    line_sweep_interval: float = 1.0
    """Seconds between two sweeps of the task lines by a worker's main process."""
    max_conflict_retries: int = 100
    """Conflict retries (``on_conflict="retry"``) when the lock gives no ``max_retries``.
    RQ's setting (documented default 100); Celery has none and never reads it: a Celery task
    counts its conflict retries against its own ``max_retries``, without a cap of ours."""
    sentinels: tuple[tuple[str, int], ...] | None = None
    """Sentinel addresses: the lock client follows ``sentinel_master`` through failovers."""
    sentinel_master: str | None = None
    redlock_urls: tuple[str, ...] | None = None
    """RedLock masters: task locks are held on a majority of them (claims stay on the lock
    Redis)."""
    min_replicas: int = 0
    """Replicas that must acknowledge each acquire and renewal (``WAIT``); 0: none."""
    replica_timeout: float | None = None
    disabled: bool = False
    """The kill switch: no task takes a lock or claims a unique key; logged at ERROR."""
    client_factory: Callable[[], RedisClient] | None = None
    sentinel_options: tuple[tuple[str, Any], ...] = ()
    task_time_limit: float | None = None
    """Celery's own ``task_time_limit``: the default maximum hold of a lease."""
    beat_scheduler: object = "celery.beat:PersistentScheduler"
    """Celery's: the scheduler class a leader beat runs (a class or its dotted name)."""
    beat_name: str | None = None
    """Celery's: the fleet of beats that elect one leader (default: the app's main name)."""
    beat_ttl: float = 10.0
    """Celery's: the leader lease's ttl: a standby takes over within it after the leader died."""
    beat_missed: str = "send"
    """Celery's: a tick that fell due while no beat led is sent once (``"send"``) or skipped."""

    def __post_init__(self) -> None:
        given = {name: getattr(self, name) for name in FIELDS}
        for name, value in _checked(given, KWARGS).items():
            object.__setattr__(self, name, value)

    @classmethod
    def from_values(cls, values: Mapping[str, object], naming: Naming) -> Settings:
        """Settings from ``values`` by field name (defaults for the others), a bad one refused
        as ``naming`` spells it."""
        return cls(**_checked(values, naming))  # type: ignore[arg-type]

    @classmethod
    def from_mapping(cls, get: Callable[[str], object]) -> Settings:
        """Settings from ``get(celery_name)`` (``None``: not set) of each field that has a Celery
        name (:func:`read_mapping`), defaults for the others."""
        return cls.from_values(read_mapping(get), CELERY)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from ``REDISLOCK_URL``, ``REDISLOCK_NAMESPACE``, ``REDISLOCK_TTL``, ...
        (each field's name in upper case), defaults for what is not set.

        >>> from celery_redislock.integrations.rq import Settings
        >>> Settings.from_env({"REDISLOCK_TTL": "30"}).ttl
        30.0
        """
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for field in FIELDS.values():
            if field.env is not None and field.text is not None and field.env in env:
                values[field.name] = field.text(env[field.env], ENV(field.name))
        return cls.from_values(values, ENV)

    def client_key(self) -> tuple[object, ...]:
        """What makes this settings' Redis client: equal keys, the same client."""
        return (
            self.url,
            self.client_factory,
            self.sentinels,
            self.sentinel_master,
            self.sentinel_options,
            self.min_replicas,
            self.replica_timeout,
        )


@dataclass(frozen=True, slots=True)
class Naming:
    """How a source spells a field in an error: ``setting redislock_ttl``, ``setting ttl``,
    ``environment variable REDISLOCK_TTL``."""

    kind: str
    spell: Callable[[str], str]

    def __call__(self, name: str) -> str:
        return f"{self.kind} {self.spell(name)}"

    def both(self, one: str, other: str) -> str:
        return f"{self.kind}s {self.spell(one)} and {self.spell(other)}"


# -- the schema -----------------------------------------------------------------------------


def _seconds(duration: Duration) -> Callable[[object, str], object]:
    return lambda value, what: seconds(value, duration, what)


def _choice(allowed: tuple[str, ...]) -> Callable[[object, str], object]:
    return lambda value, what: one_of(value, allowed, what)


def _url(value: object, what: str) -> object:
    if value is not None and (not isinstance(value, str) or not value):
        raise LockConfigError(f"{what} must be a Redis URL string, got {value!r}")
    return value


def _factory(value: object, what: str) -> object:
    if value is not None and not callable(value):
        raise LockConfigError(
            f"{what} must be a callable returning a redis.Redis or RedisCluster, got "
            f"{type(value).__name__}"
        )
    return value


def _options(value: object, what: str) -> object:
    items: Any = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = tuple(sorted((key, option) for key, option in items))
    except (TypeError, ValueError):
        pairs = None
    if pairs is None or not all(isinstance(key, str) for key, _ in pairs):
        raise LockConfigError(
            f"{what} must be a dict of redis-py connection options, got {value!r}"
        )
    return pairs


def _as_is(value: object, what: str) -> object:
    return value


def _class_or_name(value: object, what: str) -> object:
    if isinstance(value, type):
        return value
    return non_empty_string(value, what)


def _name_or_none(value: object, what: str) -> object:
    return None if value is None else non_empty_string(value, what, without="{}")


def _parsed(convert: Callable[[str], object], words: str) -> Callable[[str, str], object]:
    def parse(raw: str, what: str) -> object:
        try:
            return convert(raw)
        except (ValueError, KeyError):
            raise LockConfigError(f"{what} must be {words}, got {raw!r}") from None

    return parse


_FLAGS = {
    **dict.fromkeys(("", "0", "false", "no"), False),
    **dict.fromkeys(("1", "true", "yes"), True),
}
_number_text = _parsed(float, "a number of seconds")
_int_text = _parsed(int, "an integer")
_flag_text = _parsed(lambda raw: _FLAGS[raw.strip().lower()], "1/true/yes or 0/false/no")


@dataclass(frozen=True, slots=True)
class Field:
    """One setting: how a value is checked, how its environment text is read (``None``: not
    read from the environment), and its names; the default is :class:`Settings`'."""

    name: str
    check: Callable[[object, str], object]
    text: Callable[[str, str], object] | None = _as_is  # (a string as it is)
    conf: str | None = ""
    """The Celery name (``""``: ``redislock_<name>``; ``None``: not a Celery setting)."""

    @property
    def env(self) -> str | None:
        """The environment name (``REDISLOCK_<NAME>``), if the environment gives it."""
        return None if self.text is None else ENV_PREFIX + self.name.upper()

    @property
    def celery(self) -> str | None:
        """The name in Celery's ``app.conf``, if Celery reads it."""
        return CONF_PREFIX + self.name if self.conf == "" else self.conf


FIELDS: dict[str, Field] = {
    f.name: f
    for f in (
        Field("url", _url),
        Field("namespace", lambda v, what: check_namespace(v, f"{what}: namespace")),
        Field("ttl", _seconds(TTL), _number_text),
        Field("on_conflict", _choice(CONFLICT_ACTIONS)),
        Field("on_duplicate", _choice(ON_DUPLICATE)),
        Field("on_backend_error", _choice(BACKEND_POLICIES)),
        Field("queue_allowance", _seconds(ALLOWANCE), _number_text),
        Field("unique_publish_window", _seconds(ALLOWANCE), _number_text),
        Field("completion_ttl", _seconds(ALLOWANCE), _number_text),
        Field("fence_keep", _seconds(OTHER), _number_text),
        Field("line_handover_window", _seconds(ALLOWANCE), _number_text),
        Field("line_sweep_interval", _seconds(SWEEP_INTERVAL), _number_text),
        # RQ's: Celery counts conflict retries against the task's own max_retries.
        Field("max_conflict_retries", lambda v, what: int_at_least(v, 1, what), _int_text, None),
        Field("sentinels", lambda v, what: None if v is None else tuple(parse_sentinels(v, what))),
        Field("sentinel_master", _as_is),  # checked with sentinels (_together)
        Field("redlock_urls", lambda v, what: None if v is None else parse_master_urls(v, what)),
        Field("min_replicas", _as_is, _int_text),  # checked with replica_timeout (_together)
        Field("replica_timeout", _as_is, _number_text),
        Field("disabled", true_or_false, _flag_text),
        # Celery's: a callable and a dict of options are no environment text; task_time_limit
        # is Celery's own setting (RQ jobs have their own timeout).
        Field("client_factory", _factory, None, conf="redislock_client"),
        Field("sentinel_options", _options, None),
        Field("task_time_limit", _as_is, None, conf="task_time_limit"),
        # Celery beat's (RQ's scheduler runs one per queue already).
        Field("beat_scheduler", _class_or_name, None),
        Field("beat_name", _name_or_none, None),
        Field("beat_ttl", _seconds(TTL), None),
        Field("beat_missed", _choice(MISSED_POLICIES), None),
    )
}

# How each source names a field in an error.
KWARGS = Naming("setting", lambda name: name)
CELERY = Naming("setting", lambda name: FIELDS[name].celery or name)
ENV = Naming("environment variable", lambda name: FIELDS[name].env or name)


def _checked(values: Mapping[str, object], naming: Naming) -> dict[str, object]:
    """``values`` checked, each named by ``naming``; the result as :class:`Settings` keeps it."""
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise LockConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    checked = {name: FIELDS[name].check(value, naming(name)) for name, value in values.items()}
    _together(checked, naming)
    return checked


def _together(values: dict[str, object], naming: Naming) -> None:
    """The checks of fields that only make sense together; fixes ``values`` in place."""
    sentinels, master = values.get("sentinels"), values.get("sentinel_master")
    if sentinels is None and master is not None:
        raise LockConfigError(
            f"{naming('sentinel_master')} needs {naming.spell('sentinels')} (the Sentinels' "
            "addresses)"
        )
    if sentinels is not None:
        if not isinstance(master, str) or not master:
            raise LockConfigError(
                f"{naming('sentinel_master')} must name the Sentinel service (e.g. 'mymaster') "
                f"when {naming.spell('sentinels')} is set, got {master!r}"
            )
        if values.get("url") is not None:
            raise LockConfigError(f"{naming.both('url', 'sentinels')}: give one of them, not both")
        if values.get("redlock_urls") is not None:
            raise LockConfigError(
                f"{naming.both('redlock_urls', 'sentinels')}: give one of them, not both "
                "(RedLock's masters are independent servers)"
            )
    count, timeout = values.get("min_replicas", 0), values.get("replica_timeout")
    try:
        policy = check_policy(count, timeout)
    except LockConfigError as exc:
        raise LockConfigError(
            f"{naming('min_replicas')}/{naming.spell('replica_timeout')}: {exc}"
        ) from exc
    if "replica_timeout" in values:
        values["replica_timeout"] = None if timeout is None else policy.timeout


def read_mapping(get: Callable[[str], object]) -> dict[str, object]:
    """The fields ``get`` (by Celery name) has a value for; ``None`` is not set."""
    return {
        field.name: value
        for field in FIELDS.values()
        if field.celery is not None and (value := get(field.celery)) is not None
    }


def disabled_by_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``REDISLOCK_DISABLED`` turns the kill switch on (``LockConfigError`` if it is
    not a flag)."""
    raw = (os.environ if environ is None else environ).get(DISABLED_ENV, "")
    return bool(_flag_text(raw, ENV("disabled")))
