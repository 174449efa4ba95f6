"""Limits seen and changed live: a rate and a burst set in Redis for a name take the place of
the ones in code at the next reservation on every worker (no restart), until cleared, and so
does a cap for a lock declared with a ``limit`` of 2 or more; and a rate limit paused for a
while (after an upstream 429) and resumed (the lock of a name: :mod:`.pause`). Checked before
anything is written: a bad value is refused with a clear error and changes nothing. Each is one
script, ``lua/limits.lua``, on the name's ``:limits`` hash.

>>> set_limits(redis.Redis(), "partner-api", rate="50/m", burst=5)   # doctest: +SKIP
>>> [s.name for s in list_rates(redis.Redis())]                      # doctest: +SKIP
['partner-api']
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import LockConfigError
from .._validate import refuse
from ..keys import DEFAULT_NAMESPACE, LockKeys, check_name, check_namespace
from ..protocol import LimitsReply
from ..rate import RateLimit, RateUsage
from ..rate_options import Rate, check_burst, parse_rate
from ..scripts import run
from ..store import RedisClient, backend_errors
from .listing import scan_names

__all__ = [
    "RateState",
    "clear_limits",
    "describe_rate",
    "list_rates",
    "pause_rate",
    "resume_rate",
    "set_limits",
]

MAX_CAP = 1_000_000
"""The largest cap set at runtime."""

# A pause or a reading needs a rate to fall back on; with no limits set, the bucket's own
# figures are meaningless without the code's rate, so only the pause is shown then.
_ANY = Rate(1, 1.0)


@dataclass(frozen=True, slots=True)
class RateState:
    """A name's limits as Redis holds them: those set at runtime (``None``: the code's apply),
    and the seconds left of its rate limit's pause (0: none)."""

    name: str
    rate: Rate | None
    burst: int | None
    paused_for: float
    cap: int | None = None
    """The cap of the lock of this name, in place of its ``limit`` (of 2 or more)."""
    lock_paused_for: float = 0.0
    """Seconds left of the pause of the lock of this name (0: none; see :mod:`.pause`)."""
    booked_for: float = 0.0
    """How far ahead of now the rate limit's reserved slots reach, in seconds (its usage: 0,
    it has room now; see :class:`~celery_redislock.core.rate.RateUsage`)."""


def _limit(client: RedisClient, name: str, namespace: str) -> RateLimit:
    return RateLimit(client, name, _ANY, namespace=namespace)


def call_limits(
    client: RedisClient, name: str, namespace: str, op: str, *args: str, what: str = "rate limit"
) -> LimitsReply:
    """``lua/limits.lua``'s ``op`` on the name's limits hash (one round trip)."""
    keys = LockKeys.of(namespace, name).all
    with backend_errors(name, what):
        return LimitsReply.decode(run("limits", client, keys, [op, *args]))


def set_limits(
    client: RedisClient,
    name: str,
    *,
    rate: Rate | str | None = None,
    burst: int | None = None,
    cap: int | None = None,
    namespace: str = DEFAULT_NAMESPACE,
) -> RateState:
    """Sets the rate and/or the burst of the rate limit ``name`` at runtime, and/or the cap of
    the lock ``name`` (how many hold it at once, for a lock whose code gives a ``limit`` of 2
    or more; 1 to 1,000,000); each applies at the next reservation or acquisition of the name
    on every worker, in place of the code's, until cleared. Leases held already are kept.

    >>> set_limits(redis.Redis(), "partner-api", rate="50/m")   # doctest: +SKIP
    RateState(name='partner-api', rate=Rate(limit=50, per=60.0), burst=None, paused_for=0.0)
    """
    name, namespace = check_name(name), check_namespace(namespace)
    if rate is None and burst is None and cap is None:
        raise LockConfigError("set_limits needs a rate, a burst or a cap", name=name)
    fields: dict[str, str] = {}
    if rate is not None:
        parsed = parse_rate(rate, name=name)
        fields["rate"] = f"{parsed.limit} {parsed.per_ms}"
    if burst is not None:
        fields["burst"] = str(check_burst(burst, name=name))
    if cap is not None:
        if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_CAP:
            raise refuse("cap", f"an integer from 1 to {MAX_CAP:,}", cap, name=name)
        fields["cap"] = str(cap)
    # (A hash that held only a lock's pause had an expiry: the script writes it without.)
    call_limits(client, name, namespace, "s", *(x for item in fields.items() for x in item))
    return describe_rate(client, name, namespace)


def clear_limits(
    client: RedisClient, name: str, *, namespace: str = DEFAULT_NAMESPACE
) -> RateState:
    """Forgets the limits set at runtime for ``name``: the code's apply again. A pause of its
    lock stays (see :func:`~.pause.resume_lock`)."""
    name, namespace = check_name(name), check_namespace(namespace)
    call_limits(client, name, namespace, "c")
    return describe_rate(client, name, namespace)


def pause_rate(
    client: RedisClient, name: str, seconds: float, *, namespace: str = DEFAULT_NAMESPACE
) -> RateState:
    """Pauses the rate limit ``name`` for ``seconds`` (see :meth:`RateLimit.pause`)."""
    _limit(client, check_name(name), namespace).pause(seconds)
    return describe_rate(client, name, namespace)


def resume_rate(client: RedisClient, name: str, *, namespace: str = DEFAULT_NAMESPACE) -> RateState:
    """Ends a pause of the rate limit ``name`` now."""
    _limit(client, check_name(name), namespace).resume()
    return describe_rate(client, name, namespace)


def describe_rate(client: RedisClient, name: str, namespace: str = DEFAULT_NAMESPACE) -> RateState:
    """The limits set at runtime for ``name``, its rate limit's pause and its lock's (two
    round trips)."""
    name, namespace = check_name(name), check_namespace(namespace)
    found = call_limits(client, name, namespace, "r")
    usage: RateUsage = _limit(client, name, namespace).usage()
    parsed = None
    if found.rate is not None:
        limit, per_ms = found.rate.split()
        parsed = Rate(int(limit), int(per_ms) / 1000)
    return RateState(
        name,
        parsed,
        None if found.burst is None else int(found.burst),
        usage.paused_for,
        None if found.cap is None else int(found.cap),
        found.lock_paused_for,
        usage.booked_for,
    )


def list_rates(
    client: RedisClient, pattern: str = "*", namespace: str = DEFAULT_NAMESPACE
) -> list[RateState]:
    """The names of ``namespace`` matching the glob ``pattern`` with limits set at runtime, a
    paused rate limit or a paused lock, by name (SCAN, never KEYS)."""
    names = set(scan_names(client, namespace, pattern, "limits"))
    names |= set(scan_names(client, namespace, pattern, "bucket"))
    states = (describe_rate(client, name, namespace) for name in sorted(names))
    return [
        s
        for s in states
        if s.rate is not None
        or s.burst is not None
        or s.cap is not None
        or s.paused_for
        or s.lock_paused_for
    ]
