"""Settings read from ``app.conf`` (all named ``redislock_*``) and the Redis client they give.

A little over 300 lines: reading, checking and noticing a change of every setting belong
together (the fingerprint must cover exactly what is read)."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import redis
from celery import Celery
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from ...core._validate import one_of
from ...core.claims import DEFAULT_PUBLISH_WINDOW
from ...core.clients import parse_sentinels, sentinel_client
from ...core.durations import ALLOWANCE, OTHER, TTL, Duration, seconds
from ...core.handover import DEFAULT_HANDOVER_WINDOW
from ...core.keys import DEFAULT_NAMESPACE, check_namespace
from ...core.lease import RedisClient
from ...core.lock import DEFAULT_FENCE_KEEP
from ...core.options import CONFLICT_ACTIONS, ConflictAction
from ...core.redlock_masters import parse_master_urls
from ...core.replicas import check_policy, require_replicas
from ...core.unique_options import ON_DUPLICATE, OnDuplicate
from ...errors import LockConfigError
from ._compat import SettingLookups, setting_lookups

__all__ = ["BackendPolicy", "Settings", "check_app", "client_for", "settings_for"]

BackendPolicy = Literal["fail", "retry", "run"]
BACKEND_POLICIES: tuple[BackendPolicy, ...] = ("fail", "retry", "run")

DEFAULT_TTL = 15.0
DEFAULT_QUEUE_ALLOWANCE = 600.0
# How long a finished acks_late delivery is remembered: a redelivery of it within this time is
# dropped instead of run again (a Redis broker redelivers after its visibility timeout, 1 h).
DEFAULT_COMPLETION_TTL = 3600.0
SOCKET_TIMEOUT = 5.0
DEFAULT_SWEEP_INTERVAL = 1.0
# Below 50 ms the sweeps cost more than the lapses they catch; past a minute a dead holder's
# line waits too long.
SWEEP_INTERVAL = Duration(0.05, 60.0)
T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Settings:
    """The app-wide lock settings; see the settings table in docs/celery.md."""

    url: str | None
    client_factory: Callable[[], RedisClient] | None
    namespace: str
    ttl: float
    on_conflict: ConflictAction
    on_backend_error: BackendPolicy
    on_duplicate: OnDuplicate
    queue_allowance: float
    """Seconds a unique task's queued claim lasts beyond its countdown/ETA."""
    task_time_limit: float | None
    """Celery's own ``task_time_limit``: the default maximum hold of a lease."""
    unique_publish_window: float = DEFAULT_PUBLISH_WINDOW
    """Seconds a unique task's claim lasts until its publish went through (then: its lifetime)."""
    completion_ttl: float = DEFAULT_COMPLETION_TTL
    """Seconds a finished ``acks_late`` delivery is remembered, so a redelivery is dropped."""
    fence_keep: float = DEFAULT_FENCE_KEEP
    """Seconds a lock's fence mark outlives its last use (server clock steps back safely)."""
    disabled: bool = False
    """The kill switch (``redislock_disabled`` or ``REDISLOCK_DISABLED=1``): no task takes a
    lock or claims a unique key."""
    sentinels: tuple[tuple[str, int], ...] | None = None
    """Sentinel addresses: the lock client follows ``sentinel_master`` through failovers."""
    sentinel_master: str | None = None
    sentinel_options: tuple[tuple[str, Any], ...] = ()
    min_replicas: int = 0
    """Replicas that must acknowledge each acquire and renewal (``WAIT``); 0: none."""
    replica_timeout: float | None = None
    redlock_urls: tuple[str, ...] | None = None
    """RedLock masters (``redislock_redlock_urls``): task locks are held on a majority of them."""
    line_handover_window: float = DEFAULT_HANDOVER_WINDOW
    """Seconds a lock handed to a parked task waits for its message to be delivered."""
    line_sweep_interval: float = DEFAULT_SWEEP_INTERVAL
    """Seconds between two sweeps of the task lines by a worker's main process."""


def _setting(app: Celery, name: str, default: Any) -> Any:
    value = app.conf.get(name)
    return default if value is None else value


def _seconds(app: Celery, name: str, default: float, duration: Duration) -> float:
    return seconds(_setting(app, name, default), duration, f"setting {name}")


def _choice(app: Celery, name: str, default: str, allowed: tuple[T, ...]) -> T:
    value = _setting(app, name, default)
    return one_of(
        value, allowed, f"setting {name}", listed=f"one of {', '.join(map(str, allowed))}"
    )


def _namespace(app: Celery) -> str:
    try:
        return check_namespace(_setting(app, "redislock_namespace", DEFAULT_NAMESPACE))
    except LockConfigError as exc:
        raise LockConfigError(f"setting redislock_namespace: {exc}") from exc


# The kill switch from the environment, for an emergency without a code change.
DISABLED_ENV = "REDISLOCK_DISABLED"
_ENV_FLAGS = {
    **dict.fromkeys(("", "0", "false", "no"), False),
    **dict.fromkeys(("1", "true", "yes"), True),
}


def _disabled(app: Celery) -> bool:
    value = _setting(app, "redislock_disabled", False)
    if not isinstance(value, bool):
        raise LockConfigError(f"setting redislock_disabled must be True or False, got {value!r}")
    raw = os.environ.get(DISABLED_ENV, "")
    env = _ENV_FLAGS.get(raw.strip().lower())
    if env is None:
        raise LockConfigError(
            f"environment variable {DISABLED_ENV} must be 1/true/yes or 0/false/no, got {raw!r}"
        )
    return value or env


def _read(app: Celery) -> Settings:
    url = _setting(app, "redislock_url", None)
    factory = _setting(app, "redislock_client", None)
    if factory is not None and not callable(factory):
        raise LockConfigError(
            "setting redislock_client must be a callable returning a redis.Redis or "
            f"RedisCluster, got {type(factory).__name__}"
        )
    sentinels, master, options = _sentinel_settings(app)
    if url is None and factory is None and sentinels is None:
        broker = app.conf.broker_url or ""
        if isinstance(broker, str) and broker.split("://", 1)[0] in ("redis", "rediss"):
            url = broker.split(";", 1)[0]  # the first of a failover list
    if url is not None and not isinstance(url, str):
        raise LockConfigError(f"setting redislock_url must be a string, got {url!r}")
    ttl = _seconds(app, "redislock_ttl", DEFAULT_TTL, TTL)
    allowance = _seconds(app, "redislock_queue_allowance", DEFAULT_QUEUE_ALLOWANCE, ALLOWANCE)
    on_conflict = _choice(app, "redislock_on_conflict", "skip", CONFLICT_ACTIONS)
    policy = _choice(app, "redislock_on_backend_error", "fail", BACKEND_POLICIES)
    on_duplicate = _choice(app, "redislock_on_duplicate", "existing", ON_DUPLICATE)
    return Settings(
        url=url,
        client_factory=factory,
        namespace=_namespace(app),
        ttl=ttl,
        on_conflict=on_conflict,
        on_backend_error=policy,
        on_duplicate=on_duplicate,
        queue_allowance=allowance,
        unique_publish_window=_seconds(
            app, "redislock_unique_publish_window", DEFAULT_PUBLISH_WINDOW, ALLOWANCE
        ),
        task_time_limit=app.conf.task_time_limit,
        completion_ttl=_seconds(app, "redislock_completion_ttl", DEFAULT_COMPLETION_TTL, ALLOWANCE),
        fence_keep=_seconds(app, "redislock_fence_keep", DEFAULT_FENCE_KEEP, OTHER),
        disabled=_disabled(app),
        sentinels=sentinels,
        sentinel_master=master,
        sentinel_options=options,
        redlock_urls=_redlock_urls(app, sentinels),
        line_handover_window=_seconds(
            app, "redislock_line_handover_window", DEFAULT_HANDOVER_WINDOW, ALLOWANCE
        ),
        line_sweep_interval=_seconds(
            app, "redislock_line_sweep_interval", DEFAULT_SWEEP_INTERVAL, SWEEP_INTERVAL
        ),
        **_replica_settings(app),
    )


def _sentinel_settings(
    app: Celery,
) -> tuple[tuple[tuple[str, int], ...] | None, str | None, tuple[tuple[str, Any], ...]]:
    raw = _setting(app, "redislock_sentinels", None)
    master = _setting(app, "redislock_sentinel_master", None)
    options = _setting(app, "redislock_sentinel_options", {})
    if raw is None:
        if master is not None:
            raise LockConfigError(
                "setting redislock_sentinel_master needs redislock_sentinels (the Sentinels' "
                "addresses)"
            )
        return None, None, ()
    sentinels = tuple(parse_sentinels(raw, "setting redislock_sentinels"))
    if not isinstance(master, str) or not master:
        raise LockConfigError(
            "setting redislock_sentinel_master must name the Sentinel service (e.g. "
            f"'mymaster') when redislock_sentinels is set, got {master!r}"
        )
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise LockConfigError(
            "setting redislock_sentinel_options must be a dict of redis-py connection options, "
            f"got {options!r}"
        )
    return sentinels, master, tuple(sorted(options.items()))


def _redlock_urls(app: Celery, sentinels: object) -> tuple[str, ...] | None:
    raw = _setting(app, "redislock_redlock_urls", None)
    if raw is None:
        return None
    if sentinels is not None:
        raise LockConfigError(
            "settings redislock_redlock_urls and redislock_sentinels: give one of them, not both "
            "(RedLock's masters are independent servers)"
        )
    return parse_master_urls(raw, "setting redislock_redlock_urls")


def _replica_settings(app: Celery) -> dict[str, Any]:
    count = _setting(app, "redislock_min_replicas", 0)
    timeout = _setting(app, "redislock_replica_timeout", None)
    try:
        policy = check_policy(count, timeout)
    except LockConfigError as exc:
        raise LockConfigError(
            f"setting redislock_min_replicas/redislock_replica_timeout: {exc}"
        ) from exc
    return {"min_replicas": policy.count, "replica_timeout": policy.timeout}


# One client per app and Redis address: a changed setting gets a new client.
_clients: weakref.WeakKeyDictionary[Celery, tuple[object, RedisClient]] = (
    weakref.WeakKeyDictionary()
)
_clients_lock = threading.Lock()


# In a worker, configuration is final once it has started: settings are then read once per
# app (reading app.conf costs more than the rest of taking a lock, Redis aside).
_frozen = False
_settings: weakref.WeakKeyDictionary[Celery, Settings] = weakref.WeakKeyDictionary()


def freeze() -> None:
    """From now on, read each app's settings once (called as a worker starts)."""
    global _frozen
    _frozen = True


# Outside a worker, settings may change at any time (tests, scripts): they are read again
# whenever a value behind them changed. Reading them all through app.conf to see that would
# cost every publish of a unique task and every locked run some 50-100 us (Celery's lookup
# raises a KeyError for each name and map it misses). So Celery's lookup is asked once which
# keys it reads for each setting (the app's namespace prefix applied, as in a Django project's
# CELERY_REDISLOCK_TTL, and old names), and the fingerprint looks those up in app.conf's maps.
_READ_KEYS = (
    "redislock_url",
    "redislock_client",
    "redislock_namespace",
    "redislock_ttl",
    "redislock_queue_allowance",
    "redislock_unique_publish_window",
    "redislock_completion_ttl",
    "redislock_fence_keep",
    "redislock_on_conflict",
    "redislock_on_duplicate",
    "redislock_on_backend_error",
    "redislock_disabled",
    "redislock_sentinels",
    "redislock_sentinel_master",
    "redislock_sentinel_options",
    "redislock_min_replicas",
    "redislock_replica_timeout",
    "redislock_redlock_urls",
    "redislock_line_handover_window",
    "redislock_line_sweep_interval",
    "broker_url",
    "broker_host",  # (app.conf.broker_url falls back to it)
    "task_time_limit",
)
# app.conf.broker_url reads this first (Celery's Settings.broker_url).
_BROKER_URL_ENV = "CELERY_BROKER_URL"
_MISSING = object()
_seen: weakref.WeakKeyDictionary[Celery, tuple[tuple[object, ...], Settings]] = (
    weakref.WeakKeyDictionary()
)
# app -> ((id of its app.conf, its prefix), what Celery reads for each setting, all those keys)
_lookups: weakref.WeakKeyDictionary[
    Celery, tuple[tuple[int, object], SettingLookups, tuple[str, ...]]
] = weakref.WeakKeyDictionary()


def _lookups_of(app: Celery) -> tuple[SettingLookups, tuple[str, ...]] | None:
    """What Celery reads for each setting, and all those keys once each (cached per app)."""
    conf = app.conf
    identity = (id(conf), getattr(conf, "prefix", None))
    cached = _lookups.get(app)
    if cached is not None and cached[0] == identity:
        return cached[1], cached[2]
    found = setting_lookups(conf, _READ_KEYS)
    if found is None:
        return None
    keys = tuple(dict.fromkeys(key for keys in found.values() for key in keys))
    _lookups[app] = (identity, found, keys)
    return found, keys


def _fingerprint(app: Celery) -> tuple[object, ...] | None:
    conf = app.conf
    maps = getattr(conf, "maps", None)
    lookups = _lookups_of(app) if isinstance(maps, list) else None
    if maps is None or lookups is None:
        return None  # read every time: slower, never stale
    raw: list[object] = [
        id(conf),
        len(maps),
        os.environ.get(_BROKER_URL_ENV),
        os.environ.get(DISABLED_ENV),
    ]
    for key in lookups[1]:
        # Which map holds a key matters too: an earlier map's entry takes precedence.
        # The type too: True == 1, but only 1 is a ttl.
        for index, mapping in enumerate(maps):
            if key in mapping:
                value = mapping[key]
                raw += (index, type(value), value)
                break
        else:
            raw.append(_MISSING)
    return tuple(raw)


def set_setting(app: Celery, name: str, value: object) -> None:
    """Sets our setting ``name`` (``"redislock_url"``, ...) in ``app.conf`` under the key
    Celery reads first for it (under a namespace, the prefixed one), so that it takes
    precedence over the setting however else it is given."""
    asked = _lookups_of(app)
    app.conf[asked[0][name][0] if asked else name] = value


def settings_for(app: Celery) -> Settings:
    """The app's lock settings, checked (a bad value raises :class:`LockConfigError`)."""
    if _frozen:
        settings = _settings.get(app)
        if settings is None:
            settings = _settings[app] = _read(app)
        return settings
    fingerprint = _fingerprint(app)
    seen = _seen.get(app)
    if fingerprint is not None and seen is not None and seen[0] == fingerprint:
        return seen[1]
    settings = _read(app)
    if fingerprint is not None:
        _seen[app] = (fingerprint, settings)
    return settings


def client_for(app: Celery, settings: Settings | None = None) -> RedisClient:
    """The Redis client the app's locks use (one per app; redis-py reconnects after fork).
    Making it does not connect. A URL redis-py cannot parse, or a ``redislock_client`` that
    does not make a client, raises :class:`LockConfigError` naming the setting.

    >>> client_for(app).ping()   # doctest: +SKIP
    True
    """
    settings = settings or _read(app)
    identity = (
        settings.url,
        id(settings.client_factory),
        settings.sentinels,
        settings.sentinel_master,
        settings.sentinel_options,
        settings.min_replicas,
        settings.replica_timeout,
    )
    with _clients_lock:
        cached = _clients.get(app)
        if cached is not None and cached[0] == identity:
            return cached[1]
        if settings.client_factory is not None:
            client = settings.client_factory()
            if not isinstance(client, redis.Redis | RedisCluster):
                raise LockConfigError(
                    "setting redislock_client must return a redis.Redis or RedisCluster, got "
                    f"{type(client).__name__}"
                )
        elif settings.sentinels is not None:
            client = sentinel_client(
                settings.sentinels,
                settings.sentinel_master,
                options=dict(settings.sentinel_options),
                what="setting redislock_sentinels",
            )
        elif settings.url is not None:
            client = _from_url(app, settings.url)
        else:
            raise LockConfigError(
                "no Redis for locks: set app.conf.redislock_url (or redislock_client); "
                f"the broker ({app.conf.broker_url!r}) is not a Redis URL"
            )
        if settings.min_replicas:
            require_replicas(client, settings.min_replicas, timeout=settings.replica_timeout)
        _clients[app] = (identity, client)
        return client


def _from_url(app: Celery, url: str) -> redis.Redis:
    try:
        # Bounded socket waits: a hung Redis must surface as an error (and a lost lease),
        # not block a task or the heartbeat forever. Options in the URL take precedence.
        return redis.Redis.from_url(
            url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
        )
    except ValueError as exc:
        source = (
            "setting redislock_url"
            if _setting(app, "redislock_url", None) is not None
            else "setting broker_url (used for locks: redislock_url is not set)"
        )
        raise LockConfigError(f"{source} {url!r} is not a Redis URL redis-py takes: {exc}") from exc


# Every setting this package reads: another name with the prefix is most likely a typo.
KNOWN_SETTINGS = frozenset(name for name in _READ_KEYS if name.startswith("redislock_"))


def check_app(app: Celery, *, needs_redis: bool) -> list[str]:
    """Checks every ``redislock_*`` setting of ``app`` and makes its Redis client (without
    connecting), as a worker starts; raises :class:`LockConfigError` naming the setting.
    ``needs_redis``: the app has locked tasks, so having no Redis for locks is an error too.
    Returns warnings to log (names with the prefix that no setting has)."""
    settings = _read(app)
    warnings = []
    if settings.disabled:
        # Loud: a switch left on in production lets every duplicate run.
        log.error(
            "celery_redislock is DISABLED (setting redislock_disabled or %s): no task takes a "
            "lock or claims a unique key, duplicates run",
            DISABLED_ENV,
        )
    if (
        needs_redis
        or settings.url is not None
        or settings.client_factory is not None
        or settings.sentinels is not None
    ):
        try:
            client_for(app, settings)
        except LockConfigError:
            raise
        except (redis.RedisError, RedisClusterException, OSError) as exc:
            # A factory that connects (RedisCluster does) with Redis down: not a mistake in
            # the configuration, and on_backend_error says what tasks do meanwhile.
            warnings.append(f"setting redislock_client: could not make a client now: {exc!r}")
        except Exception as exc:
            raise LockConfigError(f"setting redislock_client: calling it raised {exc!r}") from exc
    warnings.extend(_unknown_settings(app))
    return warnings


def _unknown_settings(app: Celery) -> list[str]:
    """A warning for each key of ``app.conf`` that looks like one of ours, spelled as given
    (``redislock_*``, or ``CELERY_REDISLOCK_*`` under a namespace), that Celery does not read
    for any of our settings: most likely a typo, and ignored."""
    conf = app.conf
    asked = _lookups_of(app)
    lookups = asked[0] if asked else {name: (name,) for name in _READ_KEYS}
    prefix = str(getattr(conf, "prefix", None) or "")
    read = {key for name in KNOWN_SETTINGS for key in lookups[name]}
    warnings = []
    for key in sorted(k for k in conf if isinstance(k, str)):
        prefixed = bool(prefix) and key.lower().startswith(prefix.lower())
        bare = key[len(prefix) :] if prefixed else key
        if not bare.lower().startswith("redislock_") or key in read:
            continue
        # Name ours as the key would be spelled: with the prefix Celery reads, if it has one.
        names = sorted(lookups[name][0] if prefixed else name for name in KNOWN_SETTINGS)
        warnings.append(
            f"setting {key} is not one of celery_redislock's ({', '.join(names)}); it is ignored"
        )
    return warnings
