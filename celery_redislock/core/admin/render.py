"""How the admin API's results read: plain lines for people and JSON for scripts. The CLI prints
them and the web view shows them; both import this module, which imports neither."""

from __future__ import annotations

from typing import Any

from ..beat_leader import LeaderInfo
from ..lease import Holder
from . import ClaimState, LockState, RateState, Released, Waiter

__all__ = [
    "BEAT_HEADER",
    "CLAIM_HEADER",
    "LIST_HEADER",
    "RATE_HEADER",
    "beat_dict",
    "beat_row",
    "claim_dict",
    "claim_lines",
    "claim_row",
    "holder_dict",
    "holder_line",
    "live_dict",
    "lock_dict",
    "lock_lines",
    "lock_row",
    "pause_lines",
    "rate_dict",
    "rate_line",
    "rate_row",
    "released_lines",
    "rounded",
    "table",
    "waiter_dict",
]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def rounded(value: float | None) -> float | None:
    """Seconds as JSON gives them: to the ms."""
    return None if value is None else round(value, 3)


def _task_dict(info: dict[str, str]) -> dict[str, Any]:
    return {
        "task_id": info.get("task_id"),
        "task": info.get("task"),
        "host": info.get("host"),
        "pid": int(info["pid"]) if info.get("pid", "").isdigit() else info.get("pid"),
        "info": info,
    }


def holder_dict(holder: Holder, state: LockState | None = None) -> dict[str, Any]:
    return {
        "token": holder.token,
        "mode": holder.mode,
        "fence": holder.fence,
        "owner": holder.owner,
        "count": holder.count,
        "held_for": state.held_for(holder) if state is not None else None,
        "expires_in": round(holder.expires_in, 3),
        **_task_dict(holder.info),
    }


def waiter_dict(waiter: Waiter) -> dict[str, Any]:
    return {
        "position": waiter.position,
        "token": waiter.token,
        "mode": waiter.mode,
        "owner": waiter.owner,
        "expires_in": rounded(waiter.expires_in),
        "parked": waiter.parked,
        **_task_dict(waiter.info),
    }


def lock_dict(state: LockState, *, detail: bool) -> dict[str, Any]:
    return {
        "name": state.name,
        "mode": state.mode,
        "expires_in": rounded(state.expires_in),
        "holders": [holder_dict(h, state) for h in state.holders] if detail else len(state.holders),
        "waiters": [waiter_dict(w) for w in state.waiters] if detail else len(state.waiters),
        "blocked_for": rounded(state.blocked_for),
    }


LIST_HEADER = ("NAME", "MODE", "HOLDERS", "EXPIRES IN", "WAITERS", "CAP SET", "PAUSED FOR")


def lock_row(state: LockState, live: RateState | None = None) -> tuple[str, ...]:
    """A lock's row of ``list``; ``live``: what is set at runtime for its name, if anything."""
    cap = live.cap if live is not None else None
    paused = live.lock_paused_for if live is not None else 0.0
    return (
        state.name,
        state.mode or "-",
        str(len(state.holders)),
        _seconds(state.expires_in),
        str(len(state.waiters)) + ("+" if state.blocked_for is not None else ""),
        "-" if cap is None else str(cap),
        _seconds(paused) if paused else "-",
    )


def live_dict(live: RateState | None) -> dict[str, Any]:
    """What ``list --json`` adds to a lock: its cap set at runtime and its pause."""
    return {
        "cap": live.cap if live is not None else None,
        "paused_for": rounded(live.lock_paused_for) if live is not None else 0.0,
    }


def table(rows: list[tuple[str, ...]]) -> list[str]:
    """Columns padded to their widest cell; the last column is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=False)) + "  " + row[-1]
        for row in rows
    ]


def _who(info: dict[str, str], token: str) -> str:
    if "task_id" in info:
        return f"task {info.get('task', '?')}[{info['task_id']}]"
    if info.get("role") == "beat":
        return f"beat leader since {info.get('since', '?')}, lease {token}"
    return f"lease {token}"


def _where(info: dict[str, str]) -> str:
    return f"host {info.get('host', '?')}, pid {info.get('pid', '?')}"


def holder_line(holder: Holder, state: LockState | None = None) -> str:
    parts = [
        _who(holder.info, holder.token),
        f"{holder.mode}",
        _where(holder.info),
        f"fence {holder.fence}",
    ]
    if holder.count > 1:
        parts.append(f"entered {holder.count} times")
    if state is not None:
        parts.append(f"held for {_seconds(state.held_for(holder))}")
    parts += [f"expires in {_seconds(holder.expires_in)}", f"token {holder.token}"]
    return ", ".join(parts)


def lock_lines(state: LockState, paused_for: float = 0.0) -> list[str]:
    """``paused_for``: seconds left of the lock's pause (0: not paused)."""
    paused = f", paused for {_seconds(paused_for)} (no new lease until then)" if paused_for else ""
    lines = [
        f"lock {state.name!r}: {state.mode or 'not held'}, {len(state.holders)} holder(s), "
        f"{len(state.waiters)} waiter(s){paused}"
    ]
    lines += [f"  holder {i}: {holder_line(h, state)}" for i, h in enumerate(state.holders, 1)]
    lines += [f"  waiter {w.position}: {_waiter_line(w)}" for w in state.waiters]
    if state.blocked_for is not None:
        lines.append(
            "  callers blocked on the fast path (no place in line): for at most "
            f"{_seconds(state.blocked_for)}"
        )
    return lines


def _waiter_line(w: Waiter) -> str:
    if w.parked:
        return (
            f"{_who(w.info, w.token)}, parked in the task line, {w.mode}, {_where(w.info)}, "
            f"ends as expired in {_seconds(w.expires_in)}, token {w.token}"
        )
    return (
        f"{_who(w.info, w.token)}, {w.mode}, {_where(w.info)}, "
        f"place lapses in {_seconds(w.expires_in)} unless refreshed, token {w.token}"
    )


def released_lines(released: Released) -> list[str]:
    verb = "would free" if released.dry_run else "freed"
    return [f"{verb} lock {released.name!r}: {holder_line(h)}" for h in released.holders]


CLAIM_HEADER = ("KEY", "TASK ID", "STATE", "TIME LEFT")


def claim_row(claim: ClaimState) -> tuple[str, ...]:
    state = "started" if claim.started else "queued"
    return (claim.name, claim.task_id, state, _seconds(claim.expires_in))


def claim_dict(claim: ClaimState) -> dict[str, Any]:
    return {
        "name": claim.name,
        "task_id": claim.task_id,
        "started": claim.started,
        "expires_in": rounded(claim.expires_in),
    }


def claim_lines(claim: ClaimState, *, dry_run: bool) -> list[str]:
    verb = "would free" if dry_run else "freed"
    return [
        f"{verb} the queued claim on unique key {claim.name!r}: task {claim.task_id}, "
        f"{_seconds(claim.expires_in)} left"
    ]


RATE_HEADER = ("NAME", "RATE", "BURST", "CAP", "PAUSED FOR", "LOCK PAUSED FOR")


def rate_row(state: RateState) -> tuple[str, ...]:
    return (
        state.name,
        "code's" if state.rate is None else str(state.rate),
        "code's" if state.burst is None else str(state.burst),
        "code's" if state.cap is None else str(state.cap),
        _seconds(state.paused_for) if state.paused_for else "-",
        _seconds(state.lock_paused_for) if state.lock_paused_for else "-",
    )


def rate_dict(state: RateState) -> dict[str, Any]:
    return {
        "name": state.name,
        "rate": None if state.rate is None else str(state.rate),
        "burst": state.burst,
        "cap": state.cap,
        "paused_for": rounded(state.paused_for),
        "lock_paused_for": rounded(state.lock_paused_for),
        "booked_for": rounded(state.booked_for),
    }


def rate_line(state: RateState) -> str:
    rate = "the code's rate" if state.rate is None else f"rate {state.rate}"
    burst = "the code's burst" if state.burst is None else f"burst {state.burst}"
    paused = f", paused for {_seconds(state.paused_for)}" if state.paused_for else ", not paused"
    cap = f", cap {state.cap}" if state.cap is not None else ""
    lock = f"; lock paused for {_seconds(state.lock_paused_for)}" if state.lock_paused_for else ""
    return f"rate limit {state.name!r}: {rate}, {burst}{paused}{cap}{lock}"


def pause_lines(state: RateState, verb: str) -> list[str]:
    """What ``pause`` and ``resume`` (``verb``) did to the name: its rate limit and its lock."""
    return [f"{verb} rate limit and lock {state.name!r}", rate_line(state)]


BEAT_HEADER = ("BEAT", "LEADER HOST", "PID", "LEADS SINCE", "LEASE EXPIRES IN")


def beat_row(beat: LeaderInfo) -> tuple[str, ...]:
    return (
        beat.name,
        beat.host or "?",
        beat.pid or "?",
        beat.since or "?",
        _seconds(beat.expires_in),
    )


def beat_dict(beat: LeaderInfo) -> dict[str, Any]:
    return {
        "name": beat.name,
        "host": beat.host,
        "pid": int(beat.pid) if beat.pid and beat.pid.isdigit() else beat.pid,
        "since": beat.since,
        "expires_in": rounded(beat.expires_in),
    }
