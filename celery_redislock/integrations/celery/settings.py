"""Celery's source of the lock settings: ``app.conf`` (``redislock_*``, the app's namespace prefix
applied) read into the core :class:`~celery_redislock.core.settings.Settings`, the Redis client
they give, and the checks a worker runs as it starts."""

from __future__ import annotations

import logging
import os
import threading
import weakref

import redis
from celery import Celery
from redis.exceptions import RedisClusterException

from ...core.client_cache import CLIENTS
from ...core.handover import Handover
from ...core.lease import RedisClient
from ...core.run.spec import Spec
from ...core.settings import (
    BACKEND_POLICIES,
    CELERY,
    DISABLED_ENV,
    FIELDS,
    BackendPolicy,
    Settings,
    disabled_by_env,
    read_mapping,
)
from ...core.sweeper import LineSweeper
from ...errors import LockConfigError
from ._compat import SettingLookups, setting_lookups

__all__ = [
    "BACKEND_POLICIES",
    "DISABLED_ENV",
    "KNOWN_SETTINGS",
    "AppState",
    "BackendPolicy",
    "Settings",
    "app_state",
    "check_app",
    "client_for",
    "freeze",
    "set_setting",
    "settings_for",
]

log = logging.getLogger(__name__)

# Every key read: our settings' Celery names, and the broker's for the lock Redis it may be.
_READ_KEYS = (
    *(f.celery for f in FIELDS.values() if f.celery is not None),
    "broker_url",
    "broker_host",  # (app.conf.broker_url falls back to it)
)
# Every setting this package reads: another name with the prefix is most likely a typo.
KNOWN_SETTINGS = frozenset(name for name in _READ_KEYS if name.startswith("redislock_"))
_MISSING = object()


def _read(app: Celery) -> Settings:
    conf = app.conf
    values = read_mapping(conf.get)
    if "sentinels" in values:
        values.pop("url", None)  # the Sentinels win over redislock_url (docs/topologies.md)
    elif "url" not in values and "client_factory" not in values:
        broker = conf.broker_url or ""
        if isinstance(broker, str) and broker.split("://", 1)[0] in ("redis", "rediss"):
            values["url"] = broker.split(";", 1)[0]  # the first of a failover list
    if values.get("disabled", False) is False and disabled_by_env():
        values["disabled"] = True  # (a bad redislock_disabled is still refused)
    return Settings.from_values(values, CELERY)


class AppState:
    """What the integration keeps for one app, in this process: its settings as last read and
    what they were read from, which keys Celery reads for each; the function that publishes its
    parked tasks again; the unique task specs read from Redis; its worker's line sweeper."""

    __slots__ = ("guard", "handover", "lookups", "seen", "settings", "specs", "sweeper")

    def __init__(self) -> None:
        self.settings: Settings | None = None  # (in a worker: read once)
        # (the fingerprint, the settings read with it), set as one: threads may race.
        self.seen: tuple[tuple[object, ...], Settings] | None = None
        # ((id of its app.conf, its prefix), what Celery reads for each setting, all those keys)
        self.lookups: tuple[tuple[int, object], SettingLookups, tuple[str, ...]] | None = None
        self.handover: Handover | None = None
        # Task name -> (read at, its spec or None): specs a producer read from Redis.
        self.specs: dict[str, tuple[float, Spec | None]] = {}
        self.guard = threading.Lock()  # (for specs)
        self.sweeper: LineSweeper | None = None  # (in a worker's main process)


class _Apps:
    """Each app's :class:`AppState`; and whether configuration is final: in a worker it is once
    it has started, and settings are then read once per app (reading app.conf costs more than
    the rest of taking a lock, Redis aside)."""

    def __init__(self) -> None:
        self.frozen = False
        self.states: weakref.WeakKeyDictionary[Celery, AppState] = weakref.WeakKeyDictionary()
        self.lock = threading.Lock()


_APPS = _Apps()


def app_state(app: Celery) -> AppState:
    """What the integration keeps for ``app`` in this process (made on first use)."""
    state = _APPS.states.get(app)
    if state is None:
        with _APPS.lock:
            state = _APPS.states.setdefault(app, AppState())
    return state


def freeze() -> None:
    """From now on, read each app's settings once (called as a worker starts)."""
    _APPS.frozen = True


# Outside a worker, settings are read again whenever a value behind them changed. Seeing that
# through app.conf would cost each publish and run 50-100 us (a KeyError per name and map
# missed): Celery's lookup is asked once which keys it reads (prefix, old names), and the
# fingerprint looks those up in app.conf's maps.


def _lookups_of(app: Celery) -> tuple[SettingLookups, tuple[str, ...]] | None:
    """What Celery reads for each setting, and all those keys once each (kept per app)."""
    conf = app.conf
    identity = (id(conf), getattr(conf, "prefix", None))
    state = app_state(app)
    cached = state.lookups
    if cached is not None and cached[0] == identity:
        return cached[1], cached[2]
    found = setting_lookups(conf, _READ_KEYS)
    if found is None:
        return None
    keys = tuple(dict.fromkeys(key for keys in found.values() for key in keys))
    state.lookups = (identity, found, keys)
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
        os.environ.get("CELERY_BROKER_URL"),  # (app.conf.broker_url reads it first)
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
    state = app_state(app)
    if _APPS.frozen:
        if state.settings is None:
            state.settings = _read(app)
        return state.settings
    fingerprint = _fingerprint(app)
    seen = state.seen
    if fingerprint is not None and seen is not None and seen[0] == fingerprint:
        return seen[1]
    settings = _read(app)
    if fingerprint is not None:
        state.seen = (fingerprint, settings)
    return settings


def client_for(app: Celery, settings: Settings | None = None) -> RedisClient:
    """The Redis client the app's locks use (one per process and settings; redis-py reconnects
    after fork). Making it does not connect. A URL redis-py cannot parse, or a
    ``redislock_client`` that does not make a client, raises :class:`LockConfigError` naming
    the setting.

    >>> client_for(app).ping()   # doctest: +SKIP
    True
    """
    settings = settings or _read(app)

    def what(name: str) -> str:
        if name == "url" and app.conf.get("redislock_url") is None:
            return "setting broker_url (used for locks: redislock_url is not set)"
        return CELERY(name)

    client = CLIENTS.get(settings, what)
    if client is None:
        raise LockConfigError(
            "no Redis for locks: set app.conf.redislock_url (or redislock_client); "
            f"the broker ({app.conf.broker_url!r}) is not a Redis URL"
        )
    return client


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
