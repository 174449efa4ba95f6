"""Fleet-wide rate limits: at most ``limit`` starts per ``per`` seconds of Redis server time
across every process, per name, as a sliding window of reserved start slots (``lua/rate.lua``).
A caller reserves a slot, in request order, and learns when it may start: now, or later, so it
waits for its slot (a task is published again once, with that countdown) instead of retrying."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from redis.cluster import RedisCluster

from ..errors import LockConfigError
from ._validate import non_empty_string
from .durations import Duration, seconds_or_none
from .keys import DEFAULT_NAMESPACE, LockKeys, check_name, check_namespace
from .protocol import text
from .rate_options import MAX_DELAY, Rate, parse_rate
from .scripts import run
from .store import RedisClient, backend_errors

__all__ = [
    "MAX_DELAY",
    "MAX_LATE",
    "Rate",
    "RateLimit",
    "RateUsage",
    "Reservation",
    "parse_rate",
    "rate_key",
]

MAX_LATE = Duration(0.0, 86400.0)
"""The range of ``max_late``: 0 to a day."""


def rate_key(namespace: str, name: str) -> str:
    """The key of the rate limit ``name``: its window. It shares the hash tag of the lock of the
    same name (``namespace:{name}:...``), so one script may touch both on a Redis Cluster."""
    return f"{LockKeys.of(namespace, name).prefix}:rate"


def _ms(value: float | None) -> str:
    return "" if value is None else str(int(value * 1000))


@dataclass(frozen=True, slots=True)
class Reservation:
    """What :meth:`RateLimit.reserve` answered.

    ``granted``: the slot is the request's (``False``: refused by ``max_delay``, and nothing was
    reserved). ``delay``: seconds from now until the slot (0: start now); when refused, the delay
    it would have had. ``slot_ms``: the slot in Redis server time (ms since the epoch).
    """

    granted: bool
    delay: float
    slot_ms: int


@dataclass(frozen=True, slots=True)
class RateUsage:
    """A rate limit's state, as :meth:`RateLimit.usage` reads it.

    ``started``: slots in the last ``per`` seconds up to now (starts in the current window).
    ``ahead``: slots reserved after now. ``next_delay``: seconds until the slot a new request
    would get now (0: it would start at once); ``next_slot_ms`` that slot in server time.
    """

    started: int
    ahead: int
    next_delay: float
    next_slot_ms: int


class RateLimit:
    """At most ``rate`` starts across the fleet, for the name ``name``.

    ``rate`` is a :class:`Rate` or its text (``"100/m"``, ``"5/2s"``, see :func:`parse_rate`).
    Every user of one name should give the same rate: each call applies the rate it is given.
    ``client`` is a ``redis.Redis`` (also from Sentinel's ``master_for``) or a
    ``redis.cluster.RedisCluster``.

    >>> api = RateLimit(redis.Redis(), "partner-api", "100/m")     # doctest: +SKIP
    >>> booking = api.reserve(f"{task_id}:{attempt}")              # doctest: +SKIP
    >>> if booking.delay:                                          # doctest: +SKIP
    ...     task.apply_async(args, countdown=booking.delay)
    """

    def __init__(
        self,
        client: RedisClient,
        name: str,
        rate: Rate | str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        self._name = check_name(name)
        if not isinstance(client, redis.Redis | RedisCluster):
            raise LockConfigError(
                f"client must be a redis.Redis or redis.cluster.RedisCluster, got "
                f"{type(client).__name__}",
                name=self._name,
            )
        self._rate = parse_rate(rate, name=self._name)
        self.client = client
        self.namespace = check_namespace(namespace)
        self.key = rate_key(self.namespace, self._name)

    @property
    def name(self) -> str:
        """The rate limit's name (its hash tag in Redis)."""
        return self._name

    @property
    def rate(self) -> Rate:
        """The rate this limit applies."""
        return self._rate

    def __repr__(self) -> str:
        return f"RateLimit({self._name!r}, {str(self._rate)!r}, namespace={self.namespace!r})"

    def reserve(
        self, request_id: str, *, max_delay: float | None = None, max_late: float | None = None
    ) -> Reservation:
        """Reserves the next free slot for the request ``request_id`` (one round trip).

        The slot is the latest of now, the last slot handed out, and the ``limit``-th most
        recent slot plus ``per``; a later request never gets an earlier slot. ``max_delay``
        (seconds): if the slot would be further ahead, nothing is reserved and the answer is
        refused (``granted=False``) with the delay it would have had.

        The same ``request_id`` gets the same slot again, and takes no second one: a call run
        twice after a lost reply, or a task published again with its delay that asks once
        more as it starts (then with a delay of 0, or what is left). Use one id per start (a
        task's retry is a new start: ``f"{task_id}:{retries}"``). An id is remembered for
        2 minutes after its slot (and among the last 10,000 or ``limit`` reservations, which
        is more); one asked again later gets a new slot, a spare one, never one too many.
        ``max_late`` (seconds): if this request's slot passed more than that long ago, it is
        given up and a new slot reserved at the back, since a start that lags its slot crowds
        the slots after it (see the docs on lateness).

        Raises :class:`~celery_redislock.LockConfigError` for bad arguments and
        :class:`~celery_redislock.LockBackendError` if Redis fails; the call may then have
        reserved the slot, and calling again with the same id returns it.

        >>> RateLimit(client, "api", "2/s").reserve("job-1")   # doctest: +SKIP
        Reservation(granted=True, delay=0.0, slot_ms=1767225600000)
        """
        request_id = non_empty_string(request_id, "request_id", name=self._name)
        delay_s = seconds_or_none(max_delay, MAX_DELAY, "max_delay", name=self._name)
        late_s = seconds_or_none(max_late, MAX_LATE, "max_late", name=self._name)
        args = ("r", request_id, str(self._rate.limit), str(self._rate.per_ms))
        with backend_errors(self._name, "rate limit"):
            reply = run("rate", self.client, [self.key], (*args, _ms(delay_s), _ms(late_s)))
        granted, slot, delay = text(reply).split()
        return Reservation(granted=granted == "1", delay=int(delay) / 1000, slot_ms=int(slot))

    def usage(self) -> RateUsage:
        """How the window stands now (reads only, one round trip).

        >>> RateLimit(client, "api", "2/s").usage()   # doctest: +SKIP
        RateUsage(started=2, ahead=1, next_delay=0.73, next_slot_ms=1767225601730)
        """
        args = ("u", "", str(self._rate.limit), str(self._rate.per_ms), "", "")
        with backend_errors(self._name, "rate limit"):
            reply = run("rate", self.client, [self.key], args)
        started, ahead, slot, delay = (int(v) for v in text(reply).split())
        return RateUsage(started=started, ahead=ahead, next_delay=delay / 1000, next_slot_ms=slot)

    def reset(self) -> None:
        """Forgets every slot of this name, past and reserved (an operator's tool: callers that
        hold a reserved slot still start at it, and new ones may start at once beside them).

        >>> RateLimit(client, "api", "2/s").reset()   # doctest: +SKIP
        """
        with backend_errors(self._name, "rate limit"):
            self.client.delete(self.key)
