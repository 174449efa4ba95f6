"""What goes over the wire to each Lua script and comes back: one typed request (``encode()``
gives its ARGV) and one typed reply (``decode()`` reads the raw answer) per script, as each
script's header in ``lua/`` describes them. Nothing here talks to Redis.

NamedTuples, not frozen dataclasses (half the cost to make, on the lock's hot path); build them
by keyword. Replies come as bytes, or as str (``decode_responses=True``): decoders take either.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum, StrEnum
from json import loads
from typing import Any, Literal, NamedTuple

__all__ = [
    "PRIORITIES",
    "AcquireAllArgs",
    "AcquireAllReply",
    "AcquireAllStatus",
    "AcquireArgs",
    "AcquireReply",
    "AcquireStatus",
    "ClaimArgs",
    "ClaimKind",
    "ClaimReply",
    "ClaimStatus",
    "FinishArgs",
    "Grant",
    "HoldersReply",
    "LimitsReply",
    "LiveLease",
    "LockSpec",
    "Mode",
    "NotifyArgs",
    "ParkArgs",
    "ReleaseArgs",
    "ReleaseClaimArgs",
    "ReleaseClaimReply",
    "ReleaseMode",
    "ReleaseReply",
    "ReleaseWhereArgs",
    "ReleaseWhereReply",
    "RenewArgs",
    "RenewReply",
    "SweepReply",
    "Wake",
    "text",
]

Mode = Literal["read", "write"]

# The scripts name a mode by its first letter.
_MODE_CODE: dict[Mode, str] = {"read": "r", "write": "w"}
_MODE_OF: dict[str | bytes, Mode] = {"r": "read", b"r": "read", "w": "write", b"w": "write"}


def text(value: Any) -> str:
    """A reply element as str (redis-py gives bytes unless the client decodes responses)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _bit(flag: bool) -> str:
    return "01"[flag]


# -- shared by the lock scripts ----------------------------------------------------------------


class LockSpec(NamedTuple):
    """A lock's settings, passed to every lock script (``parse_spec`` in ``_lock.lua``)."""

    mode: Mode
    limit: int
    """Holders at once; 0 means unbounded."""
    ttl_ms: int
    fair: bool
    entry_ms: int
    """How long a waiter's place in line lasts unless refreshed."""
    keep_ms: int
    """How long the fence mark outlives the lock's last use."""

    def encode(self) -> str:
        return (
            f"{_MODE_CODE[self.mode]} {self.limit} {self.ttl_ms} {_bit(self.fair)} "
            f"{self.entry_ms} {self.keep_ms}"
        )


class Grant(NamedTuple):
    """A waiter a script handed the lock to (fair mode): the caller wakes it (notify.lua).
    Fence 0: no lease was handed, the waiter is woken to try again (its owner holds one)."""

    token: str
    fence: int
    expires_at_ms: int

    @classmethod
    def decode_all(cls, items: Sequence[Any]) -> tuple[Grant, ...]:
        """The grants in a reply's tail: token, fence, expiry for each."""
        it = iter(items)
        return tuple(
            cls(token=text(t), fence=int(f), expires_at_ms=int(e))
            for t, f, e in zip(it, it, it, strict=True)
        )


class Wake(NamedTuple):
    """The payload a granted waiter pops from its wake list: ``'fence:expiry'`` (see Grant)."""

    fence: int
    expires_at_ms: int

    def encode(self) -> str:
        return f"{self.fence}:{self.expires_at_ms}"

    @classmethod
    def decode(cls, raw: Any) -> Wake:
        fence, expiry = text(raw).split(":")
        return cls(fence=int(fence), expires_at_ms=int(expiry))


def _tokens_and_grants(parts: Sequence[Any]) -> tuple[tuple[str, ...], tuple[Grant, ...]]:
    """A reply's tail of a count, that many tokens, then grants."""
    count = int(parts[0])
    return tuple(text(t) for t in parts[1 : 1 + count]), Grant.decode_all(parts[1 + count :])


# -- acquire.lua -------------------------------------------------------------------------------


class AcquireStatus(IntEnum):
    NOT_HELD = 0
    """Not held (still queued, if the call waits)."""
    HELD = 1
    UPGRADE_REFUSED = -1
    """The owner holds a read lease and asked for write."""
    JOB_FINISHED = 2
    """The job is recorded as finished (finish.lua)."""
    OWNER_HOLDS = 3
    """The owner holds a live lease and may not re-enter (``once``)."""
    PARKED = 4
    """Parked in the task line (``park``): published again when handed the lock."""
    LINE_FULL = 5
    """Not parked: the line holds its maximum of parked entries."""


_ACQUIRE_STATUS = {int(s): s for s in AcquireStatus}


class AcquireArgs(NamedTuple):
    token: str
    """Chosen by the client: the same call sent again returns the lease it made."""
    spec: str
    """:meth:`LockSpec.encode`, computed once per lock."""
    wait: bool
    """Stay queued on failure."""
    info: str
    """The holder's record, a JSON object stored as given."""
    woke: bool = False
    """The caller was woken by a signal (passed on if it cannot use it)."""
    once: bool = False
    """An owner holding a live lease is refused rather than re-entering."""
    owner: str | None = None
    job: str | None = None
    """Refused with JOB_FINISHED if this job is recorded as finished."""
    claim: str = ""
    """Chosen per call: claims a lease handed to a parked task (a token ``L...``)."""
    park: ParkArgs | None = None
    """Park in the task line rather than fail or wait."""
    give_up: str = ""
    """The owner's unique claim on the key named like the lock ends as a new lease is taken
    (``lean_acquire.lua`` alone: ``'g'`` given up, ``'s<ms>'`` kept for a period); sent only
    without a job, a park or a claim."""

    def encode(self) -> list[str]:
        flags = f"{self.wait:d}{self.woke:d}{self.once:d}"  # e.g. '100'
        args = [self.token, self.spec, flags, self.owner or "", self.info, self.job or ""]
        if self.park is not None:
            args[2] += "1"
            args += [self.claim, *self.park.encode()]
        elif self.claim:
            args.append(self.claim)
        elif self.give_up:
            args.append(self.give_up)
        return args


PRIORITIES = (-(2**31), 2**31 - 1)
"""The priorities a parked task may have within its tenant, higher first (``ParkArgs.tenant``
writes one in 8 hex digits)."""


class ParkArgs(NamedTuple):
    """What a parked task leaves in line (acquire.lua, ARGV 8-12)."""

    payload: str
    """Published again on hand-over; opaque to the lock."""
    wait_ms: int
    """The entry's deadline: past it the task is published as expired."""
    max_parked: int
    """0: unbounded."""
    publish_ms: int
    """How long a lease handed to it lasts until the hand-over is published."""
    tenant: str = ""
    """The tenant's id and the priority within it, 24 hex (``""``: no tenant; sent only when
    there is one)."""

    def encode(self) -> list[str]:
        args = [self.payload, str(self.wait_ms), str(self.max_parked), str(self.publish_ms)]
        if self.tenant:
            args.append(self.tenant)
        return args


class AcquireReply(NamedTuple):
    status: AcquireStatus
    token: str
    """The lease held (HELD), or the owner's (OWNER_HOLDS, UPGRADE_REFUSED); else ``'-'``."""
    fence: int
    expires_at_ms: int
    entered: int
    """The lease's re-entry count: how many times its owner holds it (PARKED, LINE_FULL: the
    parked entries in line)."""
    ms_left: int
    """NOT_HELD, PARKED: ms until the earliest live lease lapses (0: none); OWNER_HOLDS: ms the
    owner's lease has left."""
    mode: Mode
    granted: tuple[Grant, ...]
    gave_up: ReleaseClaimReply | None = None
    """How the owner's unique claim ended with the lease (``AcquireArgs.give_up``); None: it
    was not touched (the general path, or no new lease)."""

    @classmethod
    def decode(cls, raw: Any) -> AcquireReply:
        parts = raw.split()  # one string: a single reply element to parse (the hot path)
        granted: tuple[Grant, ...] = ()
        gave_up = None
        if len(parts) > 7:
            if parts[7] in _CLAIM_MARK:  # (a fast-path reply has no grants)
                gave_up = ReleaseClaimReply.decode_parts(parts[8:])
            else:
                granted = Grant.decode_all(parts[7:])
        return cls(
            status=_ACQUIRE_STATUS[int(parts[0])],
            token=text(parts[1]),
            fence=int(parts[2]),
            expires_at_ms=int(parts[3]),
            entered=int(parts[4]),
            ms_left=int(parts[5]),
            mode=_MODE_OF[parts[6]],
            granted=granted,
            gave_up=gave_up,
        )


_CLAIM_MARK = (b"~", "~")


# -- limits.lua -------------------------------------------------------------------------------


class LimitsReply(NamedTuple):
    """What ``lua/limits.lua`` answered: the name's ``:limits`` hash after the call."""

    now_ms: int
    """The server's clock."""
    lock_paused_ms: int
    """The end of the lock's pause (server ms; 0: not paused)."""
    rate: str | None
    """As stored: ``'limit per_ms'``."""
    burst: str | None
    cap: str | None
    granted: tuple[Grant, ...]
    """The waiters and parked tasks a resume handed the lock to."""

    @property
    def lock_paused_for(self) -> float:
        return max(self.lock_paused_ms - self.now_ms, 0) / 1000

    @classmethod
    def decode(cls, raw: Sequence[Any]) -> LimitsReply:
        def field(value: Any) -> str | None:
            return None if value is None else text(value)

        return cls(
            now_ms=int(raw[0]),
            lock_paused_ms=int(raw[1]),
            rate=field(raw[2]),
            burst=field(raw[3]),
            cap=field(raw[4]),
            granted=Grant.decode_all(raw[5:]),
        )


# -- acquire_all.lua ----------------------------------------------------------------------------


class AcquireAllArgs(NamedTuple):
    """A lease in each of several locks, or in none (acquire_all.lua)."""

    tokens: Sequence[str]
    """Chosen by the client, one per lock: the call sent again answers the leases it made."""
    specs: Sequence[str]
    """Each lock's :meth:`LockSpec.encode`, in the order of the locks' keys."""
    info: str
    once: bool = False
    """An owner holding a live lease in any of the locks is refused."""
    owner: str | None = None
    job: str | None = None
    """Refused with JOB_FINISHED if the first lock records this job as finished."""

    def encode(self) -> list[str]:
        args = [f"{self.once:d}", self.owner or "", self.info, self.job or ""]
        for token, spec in zip(self.tokens, self.specs, strict=True):
            args += [token, spec]
        return args


class AcquireAllStatus(IntEnum):
    NOT_HELD = 0
    """Lock ``at`` has no room now; nothing was taken."""
    HELD = 1
    JOB_FINISHED = 2
    OWNER_HOLDS = 3
    """The owner holds a live lease in lock ``at`` (``ms`` left)."""
    PART_GONE = 4
    """The call ran before, and its lease in lock ``at`` is gone since: give back the rest."""


_ACQUIRE_ALL_STATUS = {int(s): s for s in AcquireAllStatus}


class AcquireAllReply(NamedTuple):
    status: AcquireAllStatus
    at: int
    """The lock (0-based) the status is about (not HELD)."""
    ms: int
    """NOT_HELD: ms until that lock's earliest lease lapses (0: none); OWNER_HOLDS: ms left."""
    held: tuple[tuple[int, int], ...]
    """HELD: each lock's fence and expiry (server ms), in order."""

    @classmethod
    def decode(cls, raw: Any) -> AcquireAllReply:
        parts = [int(p) for p in raw.split()]
        pairs = parts[3:]
        return cls(
            status=_ACQUIRE_ALL_STATUS[parts[0]],
            at=max(0, parts[1] - 1),
            ms=parts[2],
            held=tuple(zip(pairs[::2], pairs[1::2], strict=True)),
        )


# -- release.lua, finish.lua -------------------------------------------------------------------


class FinishArgs(NamedTuple):
    """Records ``job`` as finished for ``keep_ms`` (finish.lua, or with a release)."""

    job: str
    keep_ms: int

    def encode(self) -> list[str]:
        return [self.job, str(self.keep_ms)]


class ReleaseArgs(NamedTuple):
    token: str
    spec: str
    whole: bool
    """Drop the lease whatever its re-entry count, rather than one level."""
    request: str
    """Chosen by the client: the same call sent again does not count twice."""
    finish: FinishArgs | None = None
    """Also record a job as finished, in the same step."""

    def encode(self) -> list[str]:
        args = [self.token, self.spec, _bit(self.whole), self.request]
        if self.finish is not None:
            args += self.finish.encode()
        return args


class ReleaseReply(NamedTuple):
    released: bool
    """False: the token held no live lease."""
    left: int
    """The re-entry count left (0: the lease is gone)."""
    granted: tuple[Grant, ...]

    @classmethod
    def decode(cls, raw: Any) -> ReleaseReply:
        parts = raw.split()
        return cls(
            released=int(parts[0]) == 1,
            left=int(parts[1]),
            granted=Grant.decode_all(parts[2:]) if len(parts) > 2 else (),
        )


# -- line_sweep.lua, line_sent.lua ------------------------------------------------------------


class SweepReply(NamedTuple):
    parked: int
    """Parked entries left in line."""
    leases: int
    """Leases on the lock (live or handed over and unclaimed)."""
    expired: tuple[str, ...]
    """Tokens of parked entries past their wait deadline (to publish as expired), or replaced
    under their unique key (to end unrun: their record says so)."""
    granted: tuple[Grant, ...]

    @classmethod
    def decode(cls, raw: Any) -> SweepReply:
        parts = raw.split()
        expired, granted = _tokens_and_grants(parts[2:])
        return cls(parked=int(parts[0]), leases=int(parts[1]), expired=expired, granted=granted)


# -- release_where.lua -------------------------------------------------------------------------


class ReleaseWhereArgs(NamedTuple):
    spec: str
    match: str
    """A JSON object: every field must equal the lease's info field."""
    request: str = ""
    """Chosen by the client: the same call sent again returns the first run's answer."""
    tokens: Sequence[str] = ()
    """Only these leases are looked at (none given: every lease)."""

    def encode(self) -> list[str]:
        return [self.spec, self.match, self.request, *self.tokens]


class ReleaseWhereReply(NamedTuple):
    released: tuple[str, ...]
    """The tokens of the leases dropped."""
    granted: tuple[Grant, ...]

    @classmethod
    def decode(cls, raw: Sequence[Any]) -> ReleaseWhereReply:
        return cls(*_tokens_and_grants(raw))


# -- renew.lua, notify.lua ---------------------------------------------------------------------


class RenewArgs(NamedTuple):
    """Extends the leases ``tokens`` (KEYS: the leases and meta key of each, in pairs)."""

    ttl_ms: int
    tokens: Sequence[str]

    def encode(self) -> list[str]:
        return [str(self.ttl_ms), *self.tokens]


class RenewReply(NamedTuple):
    expiries: tuple[int, ...]
    """Each lease's new expiry (server ms), in the order asked; 0: it was lost."""

    @classmethod
    def decode(cls, raw: Any) -> RenewReply:
        # One space-separated string (one reply element to parse for thousands of leases).
        return cls(expiries=tuple(map(int, raw.split())))


class NotifyArgs(NamedTuple):
    """Wakes granted waiters (KEYS: each one's wake list, in the order of ``grants``)."""

    list_ms: int
    """How long a wake list lives if its waiter never pops it."""
    grants: Sequence[Grant]

    def encode(self) -> list[str]:
        wakes = [Wake(fence=g.fence, expires_at_ms=g.expires_at_ms).encode() for g in self.grants]
        return [str(self.list_ms), *wakes]


# -- holders.lua -------------------------------------------------------------------------------


class LiveLease(NamedTuple):
    token: str
    expires_at_ms: int
    mode: Mode
    entered: int
    """How many times its owner holds it."""
    fence: int
    owner: str | None
    info: dict[str, str]


class HoldersReply(NamedTuple):
    now_ms: int
    """The server's clock when the leases were read."""
    leases: tuple[LiveLease, ...]

    @classmethod
    def decode(cls, raw: Sequence[Any]) -> HoldersReply:
        leases = []
        it = iter(raw[1:])
        for token, expiry, record, info in zip(it, it, it, it, strict=True):
            # The record is 'mode|count|fence|requests|owner'; an owner may contain '|'.
            mode, count, fence, _, owner = text(record).split("|", 4)
            leases.append(
                LiveLease(
                    token=text(token),
                    expires_at_ms=int(expiry),
                    mode=_MODE_OF[mode],
                    entered=int(count),
                    fence=int(fence),
                    owner=owner or None,
                    info={k: str(v) for k, v in loads(text(info)).items()},
                )
            )
        return cls(now_ms=int(raw[0]), leases=tuple(leases))


# -- unique_claim.lua, unique_release.lua ------------------------------------------------------


class ClaimKind(StrEnum):
    NEW = "n"
    """A new call."""
    REPLACE = "x"
    """A new call that replaces a queued holder."""
    CANCEL = "k"
    """A new call that replaces a queued holder or cancels a running one (until_finished)."""
    REPUBLISH = "r"
    """A re-publish of the same job (its retry)."""
    CONFIRM = "c"
    """The publish of this id went through: its claim is extended to its lifetime (never made
    anew: the copy may have started and given it up already)."""


class ClaimStatus(IntEnum):
    DUPLICATE = 0
    """Another id holds the key (queued, or running)."""
    CLAIMED = 1
    """Claimed, or this id's already (its lifetime extended, never shortened)."""
    REPLACED = 2
    """Claimed from a queued holder, for the caller to revoke; or (a cancel) from a running
    one, for the caller to stop."""
    REPUBLISH_UNCLAIMED = 3
    """A re-publish that found another id holding the key: published without it. For a
    confirmation: the key is not this id's (holder ``'-'``: nobody holds it)."""


_CLAIM_STATUS = {int(s): s for s in ClaimStatus}


class ClaimArgs(NamedTuple):
    task_id: str
    lifetime_ms: int
    kind: ClaimKind
    running_counts: bool
    """A running copy counts as a duplicate (unique until finished)."""
    parked_as: str = ""
    """A re-publish's (kind ``REPUBLISH``) task line token as it has just parked, if it did."""

    def encode(self) -> list[str]:
        args = [self.task_id, str(self.lifetime_ms), self.kind.value, _bit(self.running_counts)]
        return [*args, self.parked_as] if self.parked_as else args


class ClaimReply(NamedTuple):
    status: ClaimStatus
    holder: str
    """This id (CLAIMED), the replaced id (REPLACED), or the id holding the key."""
    ms_left: int
    """DUPLICATE, REPUBLISH_UNCLAIMED: what the holder's claim (or run lease) has left; else 0."""
    running: bool
    """DUPLICATE: the holder runs (else it is queued); REPLACED: the replaced holder runs (a
    cancel: the caller stops it)."""
    started: bool = False
    """DUPLICATE: the holder is a once_per_period run that started within its period."""
    also: str | None = None
    """REPLACED by a cancel: a queued copy replaced in the same step, for the caller to revoke."""

    @property
    def duplicate(self) -> bool:
        return self.status is ClaimStatus.DUPLICATE

    @property
    def replaced(self) -> bool:
        return self.status is ClaimStatus.REPLACED

    @classmethod
    def decode(cls, raw: Any) -> ClaimReply:
        status, holder, ms, state, *rest = text(raw).split()
        also = rest[0] if rest and rest[0] != "-" else None
        return cls(
            status=_CLAIM_STATUS[int(status)],
            holder=holder,
            ms_left=int(ms),
            running=state == "r",
            started=state == "s",
            also=also,
        )


GIVE_UP_MODES = ("g", "s")
"""The first letter of ``AcquireArgs.give_up`` (a line claim's token starts with ``L``)."""


class ReleaseMode(StrEnum):
    GIVE_UP = "g"
    """The copy gives its claim up (a once_per_period run that started keeps its period)."""
    START = "s"
    """A once_per_period run starts: the key is its for the period, whatever the outcome."""
    FORCE = "f"
    """An operator frees the key, started or not."""


class ReleaseClaimArgs(NamedTuple):
    task_id: str
    mode: ReleaseMode = ReleaseMode.GIVE_UP
    keep_ms: int = 0
    """START: the period."""

    def encode(self) -> list[str]:
        return [self.task_id, self.mode.value, str(self.keep_ms)]


class ReleaseClaimReply(NamedTuple):
    superseded_by: str | None
    """``None``: released, or nobody held the key. Else the id of the task that replaced this
    one or holds the key (``'-'``: the replacing copy has gone already)."""

    @classmethod
    def decode(cls, raw: Any) -> ReleaseClaimReply:
        return cls.decode_parts(text(raw).split())

    @classmethod
    def decode_parts(cls, parts: Sequence[Any]) -> ReleaseClaimReply:
        """From the reply's words (``lean_acquire.lua`` answers them after its own)."""
        return cls(superseded_by=text(parts[1]) if text(parts[0]) == "0" else None)
