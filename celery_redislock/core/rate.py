"""Fleet-wide rate limits: at most ``limit`` units (starts, or what calls cost) per ``per``
seconds of Redis server time across every process, per name, with a burst: a bucket of
``burst`` units refilled at the rate (a generic cell rate algorithm, ``lua/rate.lua``), O(1) per
call. A caller reserves a slot, in request order, and learns when it may start: now, or later,
so it waits for its slot (a task is published again once, with that countdown) instead of
retrying. Limits set at runtime in Redis (:mod:`.limits`) take the place of the caller's, and a
name may be paused (after an upstream 429)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.crc import key_slot

from ..errors import LockConfigError
from ._validate import finite_real, non_empty_string, refuse
from .durations import MAX_PAUSE, Duration, seconds_or_none
from .keys import DEFAULT_NAMESPACE, LockKeys, check_name, check_namespace
from .protocol import text
from .rate_options import MAX_DELAY, Rate, check_burst, check_cost, parse_rate
from .scripts import run
from .store import RedisClient, backend_errors

__all__ = [
    "MAX_DELAY",
    "MAX_LATE",
    "MAX_PAUSE",
    "Rate",
    "RateLimit",
    "RateLimitBase",
    "RateUsage",
    "Reservation",
    "parse_rate",
    "rate_key",
    "reservation_call",
    "reservation_of",
    "reserve_all",
]

MAX_LATE = Duration(0.0, 86400.0)
"""The range of ``max_late``: 0 to a day."""


def rate_key(namespace: str, name: str) -> str:
    """The key of the rate limit ``name``: its bucket. It shares the hash tag of the lock of the
    same name (``namespace:{name}:...``), so one script may touch both on a Redis Cluster."""
    return LockKeys.of(namespace, name).bucket


def _ms(value: float | None) -> str:
    return "" if value is None else str(int(value * 1000))


def _units(value: float) -> str:
    return repr(float(value))


@dataclass(frozen=True, slots=True)
class _Answer:
    granted: bool
    slot_ms: int
    delay: float
    rate: Rate
    burst: int
    paused_ms: int
    tat_ms: int
    now_ms: int
    by: int
    started: bool

    @classmethod
    def read(cls, reply: object) -> _Answer:
        granted, slot, delay, limit, per, burst, paused, tat, now, by, started = text(reply).split()
        return cls(
            granted == "1",
            int(slot),
            int(delay) / 1000,
            Rate(int(limit), int(per) / 1000),
            int(float(burst)),
            int(paused),
            int(tat),
            int(now),
            int(by) - 1,
            started == "1",
        )


@dataclass(frozen=True, slots=True)
class Reservation:
    """What :meth:`RateLimit.reserve` answered.

    ``granted``: the slot is the request's (``False``: refused by ``max_delay``, and nothing was
    reserved). ``delay``: seconds from now until the slot (0: start now); when refused, the delay
    it would have had: the retry-after. ``slot_ms``: the slot in Redis server time (ms since the
    epoch). ``rate`` and ``burst``: the limits in effect (set at runtime, or the caller's) of
    ``name``, the limit that set the slot (of several, :func:`reserve_all`: the fullest).
    ``cost``: the units this request reserved (in that limit). ``started``: with ``max_late``,
    the start is counted at ``slot_ms``: start then (``delay`` is at most ``near`` plus
    ``max_late`` or 1 s, the longer); otherwise come back after ``delay`` and ask again.
    """

    granted: bool
    delay: float
    slot_ms: int
    rate: Rate | None = None
    burst: int = 1
    cost: float = 1.0
    name: str = ""
    started: bool = False


@dataclass(frozen=True, slots=True)
class RateUsage:
    """A rate limit's state, as :meth:`RateLimit.usage` reads it.

    ``available``: units the bucket holds now (below 0: owed, slots reserved ahead).
    ``next_delay``: seconds until the slot a request of cost 1 would get now (0: at once), and
    ``next_slot_ms`` that slot in server time. ``paused_for``: seconds left of a pause (0:
    none). ``rate`` and ``burst``: the limits in effect. ``booked_for``: how far ahead of now
    the slots reserved reach, in seconds (the bucket is full again then; 0: it has room now).
    """

    available: float
    next_delay: float
    next_slot_ms: int
    paused_for: float
    rate: Rate
    burst: int
    booked_for: float = 0.0

    @classmethod
    def of(cls, answer: _Answer) -> RateUsage:
        interval_ms = answer.rate.per * 1000 / answer.rate.limit
        owed = max(answer.tat_ms - answer.now_ms, 0) / interval_ms
        return cls(
            available=round(answer.burst - owed, 3),
            next_delay=answer.delay,
            next_slot_ms=answer.slot_ms,
            paused_for=max(answer.paused_ms - answer.now_ms, 0) / 1000,
            rate=answer.rate,
            burst=answer.burst,
            booked_for=max(answer.tat_ms - answer.now_ms, 0) / 1000,
        )


class RateLimitBase:
    """A rate limit's settings and the script calls its operations make, whatever client runs
    them (:class:`RateLimit`; ``celery_redislock.asyncio.AsyncRateLimit``)."""

    _clients: tuple[type, ...] = (redis.Redis, RedisCluster)
    _client_kinds = "a redis.Redis or redis.cluster.RedisCluster"

    def __init__(
        self,
        client: Any,
        name: str,
        rate: Rate | str,
        *,
        burst: int = 1,
        slack: float = 0.0,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        self._name = check_name(name)
        if not isinstance(client, self._clients):
            raise LockConfigError(
                f"client must be {self._client_kinds}, got {type(client).__name__}",
                name=self._name,
            )
        self._rate = parse_rate(rate, name=self._name)
        self._burst = check_burst(burst, name=self._name)
        self._slack = seconds_or_none(slack, MAX_LATE, "slack", name=self._name) or 0.0
        self.client = client
        self.namespace = check_namespace(namespace)
        self._keys = LockKeys.of(self.namespace, self._name)
        self.key = self._keys.bucket

    @property
    def name(self) -> str:
        """The rate limit's name (its hash tag in Redis)."""
        return self._name

    @property
    def rate(self) -> Rate:
        """The rate this limit applies when none was set at runtime."""
        return self._rate

    @property
    def burst(self) -> int:
        """The burst this limit applies when none was set at runtime."""
        return self._burst

    def __repr__(self) -> str:
        burst = f", burst={self._burst}" if self._burst != 1 else ""
        return (
            f"{type(self).__name__}({self._name!r}, {str(self._rate)!r}{burst}, "
            f"namespace={self.namespace!r})"
        )

    def _call(self, op: str, request: str | None, *args: str) -> tuple[list[str], list[str]]:
        """``rate.lua``'s keys and args for the operation ``op`` of this limit alone."""
        keys = [self.key, self._keys.rate_request(request or ""), self._keys.limits]
        rate = (str(self._rate.limit), str(self._rate.per_ms), str(self._burst))
        return keys, [op, *rate, *args, _ms(self._slack)]

    def _args(self, cost: str) -> tuple[str, ...]:
        """This limit's part of a reservation of several (see rate.lua)."""
        rate = self._rate
        return (str(rate.limit), str(rate.per_ms), str(self._burst), cost, _ms(self._slack))

    def _settle_call(
        self, request_id: str, cost: float, estimate: float
    ) -> tuple[list[str], list[str]]:
        request_id = non_empty_string(request_id, "request_id", name=self._name)
        units = check_cost(cost, name=self._name)
        reserved = check_cost(estimate, "estimate", name=self._name)
        return self._call("s", request_id, _units(units), _units(reserved), "")

    def _pause_call(self, seconds: float) -> tuple[list[str], list[str]]:
        number = finite_real(seconds)
        if number is None or not 0 < number <= MAX_PAUSE:
            raise refuse(
                "pause", f"a number of seconds from 0 to {MAX_PAUSE:g}", seconds, name=self._name
            )
        return self._call("p", None, str(int(number * 1000)), "", "")


class RateLimit(RateLimitBase):
    """At most ``rate`` units across the fleet, for the name ``name``, ``burst`` at once.

    ``rate`` is a :class:`Rate` or its text (``"100/m"``, ``"5/2s"``, see :func:`parse_rate`);
    a call costs 1 unit unless it says otherwise (tokens of an API, points). ``burst``: units
    that may start at once (the bucket's size); the default 1 spreads starts evenly, so that
    any ``per`` seconds hold at most ``limit`` units. Every user of one name should give the
    same rate and burst: each call applies what it is given, unless limits were set at runtime
    for the name (:func:`~celery_redislock.core.admin.set_limits`), which apply instead.
    ``slack`` (seconds) widens the period, the code's or the runtime one, so that starts that
    lag their slots by up to that much still keep the rate (tasks use 5% of the period).
    ``client`` is a ``redis.Redis`` (also from Sentinel's ``master_for``) or a
    ``redis.cluster.RedisCluster``.

    >>> api = RateLimit(redis.Redis(), "partner-api", "100/m")     # doctest: +SKIP
    >>> booking = api.reserve(f"{task_id}:{attempt}")              # doctest: +SKIP
    >>> if booking.delay:                                          # doctest: +SKIP
    ...     task.apply_async(args, countdown=booking.delay)
    """

    client: RedisClient

    def _run(self, call: tuple[list[str], list[str]]) -> _Answer:
        with backend_errors(self._name, "rate limit"):
            return _Answer.read(run("rate", self.client, *call))

    def reserve(
        self,
        request_id: str,
        *,
        cost: float = 1.0,
        max_delay: float | None = None,
        max_late: float | None = None,
    ) -> Reservation:
        """Reserves the next free slot for the request ``request_id``, costing ``cost`` units
        (one round trip).

        The slot is the earliest at which the bucket holds ``cost`` units, not before the last
        slot handed out (a later request never gets an earlier slot) nor within a pause.
        ``max_delay`` (seconds): if the slot would be further ahead, nothing is reserved and the
        answer is refused (``granted=False``) with the delay it would have had.

        The same ``request_id`` gets the same slot again, and takes no second one: a call run
        twice after a lost reply, or a task published again with its delay that asks once
        more as it starts (then with a delay of 0, or what is left). Use one id per start (a
        task's retry is a new start: ``f"{task_id}:{retries}"``). An id is remembered for
        30 seconds after its slot; one asked again later gets a new slot, a spare one, never
        one too many. A request whose slot a pause overtook gets a new slot after it.

        ``max_late`` (seconds): starts are counted too, and held within the rate as the slots
        are. A request whose slot is due, however late it comes, keeps it and starts when the
        starts counted before it leave room: ``started`` says its start is counted, at
        ``slot_ms`` (within ``max_late`` or 1 s, the longer); else the start is kept for it to
        come back to after ``delay``, within ``max_late``. Asked again more than ``max_late``
        after its start, it is a second start, with a new slot (see the docs on slots and
        starts).

        Raises :class:`~celery_redislock.LockConfigError` for bad arguments and
        :class:`~celery_redislock.LockBackendError` if Redis fails; the call may then have
        reserved the slot, and calling again with the same id returns it.

        >>> RateLimit(client, "api", "2/s").reserve("job-1")   # doctest: +SKIP
        Reservation(granted=True, delay=0.0, slot_ms=1767225600000, ...)
        """
        return reserve_all([(self, cost)], request_id, max_delay=max_delay, max_late=max_late)

    def settle(self, request_id: str, cost: float, *, estimate: float = 1.0) -> None:
        """Tells the limit what the request ``request_id`` really cost, once it is known (the
        tokens an API call used): more than it reserved is owed by the slots after it; less is
        given back at once (never past a full bucket). Safe to call again: it records the cost,
        so a second call with the same cost changes nothing. ``estimate``: what it reserved,
        used only if the request is no longer remembered (30 seconds past its slot).

        >>> RateLimit(client, "llm", "90000/m", burst=20000).settle("job-1", 1250)  # doctest: +SKIP
        """
        self._run(self._settle_call(request_id, cost, estimate))

    def pause(self, seconds: float) -> RateUsage:
        """Hands out no slot for ``seconds`` from now (an upstream answered 429, or an operator
        says so); a longer pause already set is kept. Requests reserved before it whose slot
        falls in it get a new slot after it as they ask again (a task does, as it starts). The
        pause lives in Redis with a TTL: it outlives no one. Answers the usage after it.

        >>> RateLimit(client, "api", "100/m").pause(30)   # doctest: +SKIP
        """
        return RateUsage.of(self._run(self._pause_call(seconds)))

    def resume(self) -> RateUsage:
        """Ends a pause now (nothing happens without one). Answers the usage after it."""
        return RateUsage.of(self._run(self._call("q", None, "", "", "")))

    def usage(self) -> RateUsage:
        """How the bucket stands now (reads only, one round trip).

        >>> RateLimit(client, "api", "2/s").usage()   # doctest: +SKIP
        RateUsage(available=-1.0, next_delay=0.73, next_slot_ms=1767225601730, paused_for=0.0, ...)
        """
        return RateUsage.of(self._run(self._call("u", None, "", "", "")))

    def reset(self) -> None:
        """Forgets the bucket and a pause (an operator's tool: callers that hold a reserved slot
        still start at it, and new ones may start at once beside them). Limits set at runtime
        stay (see :func:`~celery_redislock.core.admin.clear_limits`).

        >>> RateLimit(client, "api", "2/s").reset()   # doctest: +SKIP
        """
        with backend_errors(self._name, "rate limit"):
            self.client.delete(self.key)


def reserve_all(
    limits: Sequence[tuple[RateLimit, float]],
    request_id: str,
    *,
    max_delay: float | None = None,
    max_late: float | None = None,
    near: float = 0.0,
) -> Reservation:
    """Reserves a slot for the request ``request_id`` in every limit of ``limits`` (each with
    the cost it is given): the latest of the slots each would give, so that every limit holds
    (one round trip, one script). See :meth:`RateLimit.reserve` for the rest; the answer names
    the limit that set the slot (``name``), with its figures.

    A slot within ``near`` seconds is taken in every limit. A later one is taken only in the
    limits whose own slot is that far (a limit with room keeps it for others meanwhile): ask
    again at the slot, with the same id, and start once the answer's delay is within
    ``near`` (a task does this by itself). Refused past ``max_delay``: nothing is taken.

    Every limit must be on the same client; on a Redis Cluster, in the same hash slot (their
    names start with one hash tag, ``{acme}:api`` and ``{acme}:tenant:7``), else
    :class:`~celery_redislock.LockConfigError`.

    >>> reserve_all([(tenant, 1), (api, 1)], f"{task_id}:0")   # doctest: +SKIP
    Reservation(granted=True, delay=0.3, slot_ms=1767225600300, ..., name='api')
    """
    keys, args, costs = reservation_call(limits, request_id, max_delay, max_late, near)
    first = limits[0][0]
    with backend_errors(first.name, "rate limit"):
        raw = run("rate", first.client, keys, args)
    return reservation_of(limits, costs, raw)


RateLimits = Sequence[tuple[RateLimitBase, float]]


def reservation_call(
    limits: RateLimits,
    request_id: str,
    max_delay: float | None,
    max_late: float | None,
    near: float,
) -> tuple[list[str], list[str], list[float]]:
    """``rate.lua``'s keys and args reserving a slot in every limit of ``limits`` (checked
    first: :class:`LockConfigError`), and each limit's cost."""
    if not limits:
        raise LockConfigError("reserve_all needs at least one rate limit")
    first = limits[0][0]
    names = [limit.name for limit, _ in limits]
    request_id = non_empty_string(request_id, "request_id", name=first.name)
    delay_s = seconds_or_none(max_delay, MAX_DELAY, "max_delay", name=first.name)
    late_s = seconds_or_none(max_late, MAX_LATE, "max_late", name=first.name)
    if len(set(names)) != len(names) or any(lim.namespace != first.namespace for lim, _ in limits):
        raise LockConfigError(f"rate limits must differ by name, got {names}", name=first.name)
    if any(limit.client is not first.client for limit, _ in limits):
        raise LockConfigError(
            f"rate limits {names} must share one Redis client to be reserved at once",
            name=first.name,
        )
    costs = [check_cost(cost, name=limit.name) for limit, cost in limits]
    keys: list[str] = []
    for limit, _ in limits:
        keys += [limit.key, limit._keys.rate_request(request_id), limit._keys.limits]
    clustered = isinstance(first.client, RedisCluster | AsyncRedisCluster)
    if clustered and len({key_slot(k.encode()) for k in keys}) > 1:
        raise LockConfigError(
            f"rate limits {names} are in different Redis Cluster slots, so they cannot be "
            f"reserved all or nothing: start every name with one hash tag (such as "
            f"'{{acme}}:{names[0]}'; a key template writes it '{{{{acme}}}}:...')",
            name=first.name,
        )
    head = first._args(_units(costs[0]))
    near_s = seconds_or_none(near, MAX_DELAY, "near", name=first.name)
    args = ["r", *head[:4], _ms(delay_s), _ms(late_s), head[4], _ms(near_s)]
    for (other, _), cost in list(zip(limits, costs, strict=True))[1:]:
        args += other._args(_units(cost))
    return keys, args, costs


def reservation_of(limits: RateLimits, costs: list[float], raw: object) -> Reservation:
    """The :class:`Reservation` a :func:`reservation_call`'s reply says."""
    got = _Answer.read(raw)
    by = limits[got.by][0]
    return Reservation(
        got.granted,
        got.delay,
        got.slot_ms,
        got.rate,
        got.burst,
        costs[got.by],
        by.name,
        got.started,
    )
