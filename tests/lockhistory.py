"""Judging a concurrent history of lock calls: linearizability against a sequential model of the
lock, and the lock's invariants read off the history directly. No Redis here: a history is plain
data, so a failing one printed by tests/core/test_model_concurrent.py can be judged again by pasting
it into ``check(...)``.

A history is a list of :class:`Op`: who called what, the results, and two ticks of one shared
counter taken just before the call and just after it returned. ``a.res < b.inv`` means ``a``
returned before ``b`` was called; calls whose ticks interleave overlapped in time, and may take
effect in either order.

The sequential model is the one tests/core/test_model.py drives one step at a time (``fits`` and
``owned_outcome`` here are its ``fits`` and ``expect_owned``): a lock is a set of leases, each with
a mode, an owner, a re-entry count, a fence and an expiry; a new lease is granted only beside leases
of its own mode and under the mode's capacity; an owner holding a lease re-enters it (or is refused:
``once``, or a read-to-write upgrade). Server time is part of the state as a lower bound: Redis runs
scripts one at a time and each reads TIME, so along the order the calls took effect the server's
clock never goes back, a new lease expires exactly ``ttl`` after it was granted, and its fence is
``max(last fence + 1, server us)``. With ``Rules.expiring``, leases may lapse: before each call
takes effect the clock may pass any of the earliest expiries (each choice is searched).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

Mode = Literal["read", "write"]


def fits(caps: Mapping[str, int | None], live_modes: Sequence[str], mode: str) -> bool:
    """Whether a new lease of ``mode`` may be taken beside live leases of ``live_modes``;
    ``caps``: how many leases of each mode may be live at once (None: unbounded)."""
    if not live_modes:
        return True
    if any(m != mode for m in live_modes):
        return False
    cap = caps[mode]
    return cap is None or len(live_modes) < cap


def owned_outcome(held_mode: str | None, mode: str, once: bool) -> str:
    """What an acquire by an owner does when that owner holds a lease of ``held_mode`` (None:
    it holds none, the acquire is a newcomer's): "owned" (refused, ``once``), "upgrade"
    (refused: it holds a read lease and asks for write), or "reenter"."""
    if held_mode is None:
        return ""
    if once:
        return "owned"
    if (held_mode, mode) == ("read", "write"):
        return "upgrade"
    return "reenter"


class Op(NamedTuple):
    """One call and what it returned.

    ``call`` is one of ("acquire", mode, owner, once, timeout, who) (timeout None: non-blocking;
    who: the ``w`` info field stored with a new lease), ("release", token), ("renew", token,
    ttl_ms) (None: the lock's ttl), ("release_where", who), ("holders",), ("locked",).
    ``result`` is one of ("lease", token, fence, expiry_ms, mode), ("busy",), ("owned",),
    ("upgrade",), ("released", left_none), ("not_owned",), ("renewed", expiry_ms), ("lost",),
    ("dropped", tokens), ("holders", ((token, mode, owner, count, fence, who), ...)),
    ("locked", bool), ("error", text).
    """

    i: int
    thread: int
    inv: int
    res: int
    call: tuple[Any, ...]
    result: tuple[Any, ...]


class Live(NamedTuple):
    token: str
    mode: str
    owner: str | None
    entered: int  # the re-entry count
    fence: int
    who: str
    expiry: int | None  # server ms; None: known only roughly (a fair hand-over claimed later)


class State(NamedTuple):
    live: tuple[Live, ...]  # oldest fence first
    last_fence: int
    last_now: int  # server ms: a lower bound of the clock at this point of the order


class Rules(NamedTuple):
    caps: Mapping[str, int | None]
    fair: bool
    ttl_ms: int
    # Leases may lapse during the history (plain mode only: every expiry is then known). Before
    # each call takes effect the clock may pass the earliest expiries: the model tries each.
    expiring: bool = False


NEVER = float("inf")


def concurrent(a: Op, b: Op) -> bool:
    return a.inv < b.res and b.inv < a.res


def may_yield(history: Sequence[Op], op: Op, fair: bool) -> bool:
    """Whether ``op``, an acquire, may be refused although the lock has room for it: a caller
    blocked in line at the time comes first (plain mode: a reader yields to a waiting writer;
    fair mode: everyone yields to whoever stands in line ahead). A caller stands in line only
    inside its own blocking acquire call."""
    return any(
        other.call[0] == "acquire"
        and other.call[4] is not None
        and other.i != op.i
        and concurrent(op, other)
        and (fair or (op.call[1] == "read" and other.call[1] == "write"))
        for other in history
    )


def _replace(live: tuple[Live, ...], old: Live, new: Live | None) -> tuple[Live, ...]:
    """``live`` with ``old`` replaced by ``new`` (None: dropped)."""
    out = [x for x in live if x is not old]
    if new is not None:
        out.append(new)
    return tuple(sorted(out, key=lambda x: x.fence))


def _expiry_after(state: State, held: Live, got: int, ttl_ms: int, below: float) -> State | str:
    """A lease extended to max(its expiry, now + ttl) answered ``got``: check it against the
    clock (at least ``state.last_now``, below ``below``), and learn the clock where the answer
    tells it."""
    if got < state.last_now + ttl_ms:
        return f"expiry {got} < clock {state.last_now} + ttl {ttl_ms}: the clock went back"
    last_now = state.last_now
    if held.expiry is not None:
        if got < held.expiry:
            return f"expiry shortened from {held.expiry} to {got}"
        if got > held.expiry:
            last_now = got - ttl_ms  # max() took now + ttl: the clock is known exactly here
            if last_now >= below:
                return f"extended at {last_now}, when a lease that expires then was live"
    live = _replace(state.live, held, held._replace(expiry=got))
    return state._replace(live=live, last_now=last_now)


def _acquire(rules: Rules, state: State, op: Op, yields: bool, below: float) -> State | str:
    _, mode, owner, once, timeout, who = op.call
    result = op.result
    mine = next((x for x in state.live if owner is not None and x.owner == owner), None)
    outcome = owned_outcome(mine.mode if mine else None, mode, once)
    if mine is not None:
        if outcome in ("owned", "upgrade"):
            return state if result[0] == outcome else f"model says {outcome}, got {result}"
        if result[0] != "lease" or result[1:3] != (mine.token, mine.fence):
            return f"model says re-entry into {mine.token} fence {mine.fence}, got {result}"
        if result[4] != mine.mode:
            return f"re-entry reports mode {result[4]}, the lease is {mine.mode}"
        state = state._replace(
            live=_replace(state.live, mine, mine._replace(entered=mine.entered + 1))
        )
        mine = next(x for x in state.live if x.token == mine.token)
        return _expiry_after(state, mine, result[3], rules.ttl_ms, below)
    room = fits(rules.caps, [x.mode for x in state.live], mode)
    if result[0] == "busy":
        if room and not yields:
            return "model says the lock has room (and nobody waits ahead), got busy"
        return state
    if result[0] != "lease":
        return f"model says new lease or busy, got {result}"
    _, token, fence, expiry, got_mode = result
    if not room:
        return f"model says busy, got a new {mode} lease beside {[x.mode for x in state.live]}"
    if got_mode != mode or any(x.token == token for x in state.live):
        return f"a new lease must be fresh and of mode {mode}: {result}"
    if fence <= state.last_fence:
        return f"fence {fence} not above the last one {state.last_fence}"
    if fence < state.last_now * 1000:
        return f"fence {fence} below the server clock {state.last_now} ms"
    last_now = state.last_now
    exact = not (rules.fair and timeout is not None)
    if exact:
        # Granted by this call's own script: expiry = now + ttl, fence = max(last + 1, now us).
        now = expiry - rules.ttl_ms
        if now < state.last_now:
            return f"granted at server time {now}, before {state.last_now}: the clock went back"
        if now >= below:
            return f"granted at {now}, when a lease that expires then was live"
        if fence != state.last_fence + 1 and fence // 1000 != now:
            return f"fence {fence} is neither last + 1 ({state.last_fence + 1}) nor now ({now})"
        last_now = now
    # Fair and blocking: maybe handed over by another caller's script (at an unknown time) and
    # claimed later, so its expiry says when the claim ran, not when it was granted.
    new = Live(token, mode, owner, 1, fence, who, expiry if exact else None)
    live = tuple(sorted((*state.live, new), key=lambda x: x.fence))
    return State(live, fence, last_now)


def step(rules: Rules, state: State, op: Op, yields: bool, below: float = NEVER) -> State | str:
    """The state after ``op`` took effect on ``state``, or why it could not have; ``below``:
    the server clock was below this when it did (a live lease expires then)."""
    kind, result = op.call[0], op.result
    if result[0] == "error":
        return f"unexpected error {result[1]}"
    if kind == "acquire":
        return _acquire(rules, state, op, yields, below)
    if kind == "release":
        held = next((x for x in state.live if x.token == op.call[1]), None)
        if held is None:
            return state if result == ("not_owned",) else f"model says not owned, got {result}"
        if result != ("released", held.entered == 1):
            return f"model says released with {held.entered - 1} left, got {result}"
        new = None if held.entered == 1 else held._replace(entered=held.entered - 1)
        return state._replace(live=_replace(state.live, held, new))
    if kind == "renew":
        held = next((x for x in state.live if x.token == op.call[1]), None)
        if held is None:
            return state if result == ("lost",) else f"model says lost, got {result}"
        if result[0] != "renewed":
            return f"model says renewed, got {result}"
        return _expiry_after(state, held, result[1], op.call[2] or rules.ttl_ms, below)
    if kind == "release_where":
        gone = tuple(sorted(x.token for x in state.live if x.who == op.call[1]))
        if result != ("dropped", gone):
            return f"model says dropped {gone}, got {result}"
        return state._replace(live=tuple(x for x in state.live if x.who != op.call[1]))
    if kind == "holders":
        want = tuple((x.token, x.mode, x.owner, x.entered, x.fence, x.who) for x in state.live)
        return state if result == ("holders", want) else f"model says holders {want}"
    if kind == "locked":
        return state if result == ("locked", bool(state.live)) else "model says otherwise"
    raise AssertionError(f"unknown call {op.call}")


def lapses(state: State) -> list[tuple[State, float]]:
    """The ways the clock may move on before the next call takes effect: the earliest k
    expiries pass (k = 0, 1, ...), and the clock stays below the next one. Each way: the state
    without those leases, and the bound."""
    live = sorted(state.live, key=lambda x: x.expiry or 0)
    ways = []
    for k in range(len(live) + 1):
        least = max([state.last_now, *(x.expiry or 0 for x in live[:k])])
        below = live[k].expiry or NEVER if k < len(live) else NEVER
        if least < below:  # else the next lease would be gone too
            gone = {x.token for x in live[:k]}
            left = tuple(x for x in state.live if x.token not in gone)
            ways.append((state._replace(live=left, last_now=least), below))
    return ways


class Verdict(NamedTuple):
    order: list[int] | None  # op indexes in an order that explains every result; None: none
    stuck: list[str]  # where the search got deepest: why each candidate did not fit there


def linearize(rules: Rules, history: Sequence[Op]) -> Verdict:
    """Wing & Gong: try every order that respects real time (an op returned before another was
    called comes first), step the model along, backtrack on a misfit; memoised on (ops done,
    model state), so equal states reached by different orders are searched once."""
    ops = sorted(history, key=lambda o: o.inv)
    n = len(ops)
    before = [sum(1 << j for j in range(n) if ops[j].res < ops[i].inv) for i in range(n)]
    yields = [o.call[0] == "acquire" and may_yield(history, o, rules.fair) for o in ops]
    seen: set[tuple[int, State]] = set()
    deepest: list[Any] = [-1, []]

    def search(done: int, state: State, depth: int, order: list[int]) -> list[int] | None:
        if depth == n:
            return order
        if (done, state) in seen:
            return None
        seen.add((done, state))
        misfits = []
        ways = lapses(state) if rules.expiring else [(state, NEVER)]
        for i in range(n):
            if done >> i & 1 or before[i] & ~done:
                continue
            why = ""
            for moved, below in ways:
                after = step(rules, moved, ops[i], yields[i], below)
                if isinstance(after, str):
                    why = why or after
                    continue
                found = search(done | 1 << i, after, depth + 1, [*order, ops[i].i])
                if found is not None:
                    return found
            if why:
                misfits.append(f"#{ops[i].i} {ops[i].call} -> {ops[i].result}: {why}")
        if depth > deepest[0]:
            deepest[0], deepest[1] = depth, [f"after {[*order]}:", *misfits]
        return None

    start = State((), 0, 0)
    return Verdict(search(0, start, 0, []), deepest[1])


def invariants(rules: Rules, history: Sequence[Op]) -> list[str]:
    """The lock's promises read off the history alone, without the model: what is wrong.
    Fences always; exclusion and counts only when no lease may lapse (a lease that lapsed ends
    with no call saying so)."""
    problems: list[str] = []
    acquired: dict[str, list[Op]] = {}
    for op in history:
        if op.result[0] == "lease":
            acquired.setdefault(op.result[1], []).append(op)
    fences = {t: {o.result[2] for o in ops} for t, ops in acquired.items()}
    modes = {t: {o.result[4] for o in ops} for t, ops in acquired.items()}
    for token in acquired:
        if len(fences[token]) != 1 or len(modes[token]) != 1:
            problems.append(f"lease {token} reported fences {fences[token]}, modes {modes[token]}")
    fence_of = {t: min(f) for t, f in fences.items()}
    if len(set(fence_of.values())) != len(fence_of):
        problems.append("two leases share a fence")
    # Each lease was made inside one of the calls that returned it: after the earliest call of
    # them began, before the earliest one returned.
    made_after = {t: min(o.inv for o in ops) for t, ops in acquired.items()}
    made_by = {t: min(o.res for o in ops) for t, ops in acquired.items()}
    for a in acquired:
        for b in acquired:
            if made_by[a] < made_after[b] and not fence_of[a] < fence_of[b]:
                problems.append(
                    f"lease {b} made after {a} has fence {fence_of[b]} <= {fence_of[a]}"
                )

    if rules.expiring:
        return problems

    # Where each lease certainly ended: the call that said it did (a release leaving none, a
    # release_where naming it); before that call began, it was certainly held.
    ended: dict[str, Op] = {}
    for op in history:
        if op.result[0] == "released" and op.result[1]:
            ended.setdefault(op.call[1], op)
        elif op.result[0] == "dropped":
            for token in op.result[1]:
                ended.setdefault(token, op)
    end = max((o.res for o in history), default=0) + 1
    spans = {t: (made_by[t], ended[t].inv if t in ended else end) for t in acquired}
    for start, _ in spans.values():
        inside = [u for u, (s, e) in spans.items() if s <= start < e]
        held_modes = [min(modes[u]) for u in inside]
        for mode in set(held_modes):
            cap = rules.caps[mode]
            if cap is not None and held_modes.count(mode) > cap:
                problems.append(f"{held_modes.count(mode)} {mode} leases held at once: {inside}")
        if len(set(held_modes)) > 1:
            problems.append(f"readers beside a writer: {inside}")

    # Re-entry counts add up: every level taken is given back once, the last release says none
    # is left and nothing is released after it; a count seen is what was taken minus given back.
    released: dict[str, list[Op]] = {}
    for op in history:
        if op.call[0] == "release" and op.result[0] == "released":
            released.setdefault(op.call[1], []).append(op)
    for token, ops in acquired.items():
        gone = released.get(token, [])
        by_release = token in ended and ended[token].call[0] == "release"
        if by_release and (len(gone) != len(ops) or sum(o.result[1] for o in gone) != 1):
            problems.append(f"lease {token}: {len(ops)} levels taken, {len(gone)} given back")
        if token in ended and any(o.inv > ended[token].res for o in gone):
            problems.append(f"lease {token} released after it ended")
    for op in history:
        if op.result[0] != "holders":
            continue
        for token, _, _, count, _, _ in op.result[1]:
            most = sum(o.inv < op.res for o in acquired.get(token, []))
            most -= sum(o.res < op.inv for o in released.get(token, []))
            least = sum(o.res < op.inv for o in acquired.get(token, []))
            least -= sum(o.inv < op.res for o in released.get(token, []))
            if not least <= count <= most:
                problems.append(f"holders #{op.i}: {token} count {count} not in [{least}, {most}]")
    return problems


def describe(history: Iterable[Op]) -> str:
    """The history, one call a line in the order they began, as Python that ``check`` takes."""
    lines = [f"    {op!r}," for op in sorted(history, key=lambda o: o.inv)]
    return "history = [\n" + "\n".join(lines) + "\n]"


def check(rules: Rules, history: Sequence[Op], header: str = "") -> None:
    """Fails, printing the history and why, unless the history is linearizable and keeps every
    invariant."""
    problems = invariants(rules, history)
    verdict = linearize(rules, history)
    if verdict.order is not None and not problems:
        return
    why = ["no order of the calls explains every result"] if verdict.order is None else []
    detail = "\n".join(
        [
            header,
            *why,
            *problems,
            *(verdict.stuck if verdict.order is None else []),
            f"rules = {rules!r}",
            describe(history),
        ]
    )
    raise AssertionError(detail)
