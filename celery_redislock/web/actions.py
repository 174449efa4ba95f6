"""The operator's actions, each a function of the admin API run with a form's fields: checked
first (a bad field is refused with what is allowed, and nothing is written), then done; each
answers the lines the CLI prints for the same command.

========================  =======================================================
action                    fields
========================  =======================================================
``release``               ``name`` and one of ``token``, ``task_id``, ``all=1``
``release-claim``         ``name`` (``task_id``: only if this task holds it)
``pause-lock``            ``name``, ``seconds``
``resume-lock``           ``name``
``pause-rate``            ``name``, ``seconds``
``resume-rate``           ``name``
``set-limits``            ``name`` and any of ``rate``, ``burst``, ``cap``
``clear-limits``          ``name``
========================  =======================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from ..core import admin
from ..core.admin import render
from ..core.admin.limits import MAX_CAP
from ..core.durations import MAX_PAUSE
from .errors import BadInput, NotFound
from .site import Site

__all__ = ["ACTIONS", "run_action"]

Form = Mapping[str, str]


def _name(form: Form) -> str:
    name = form.get("name", "")
    if not name:
        raise BadInput("name is missing: the lock, claim or rate limit to act on")
    return name


def _seconds(form: Form) -> float:
    raw = form.get("seconds", "").strip()
    allowed = f"a number of seconds above 0 and at most {MAX_PAUSE:g} (30 days), e.g. 30"
    try:
        seconds = float(raw)
    except ValueError:
        raise BadInput(f"seconds must be {allowed}, got {raw!r}") from None
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_PAUSE:
        raise BadInput(f"seconds must be {allowed}, got {raw!r}")
    return seconds


def _whole(form: Form, key: str, allowed: str) -> int | None:
    raw = form.get(key, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise BadInput(f"{key} must be {allowed}, got {raw!r}")
    return int(raw)


def release(site: Site, form: Form) -> list[str]:
    name = _name(form)
    token, task_id = form.get("token") or None, form.get("task_id") or None
    everything = form.get("all", "") in ("1", "on")
    if [token is not None, task_id is not None, everything].count(True) != 1:
        raise BadInput("release needs exactly one of token (a lease), task_id or all=1")
    released = admin.force_release(
        site.client,
        name,
        token=token,
        task_id=task_id,
        everything=everything,
        namespace=site.namespace,
        fence_keep=site.fence_keep,
        handover=site.handover,
        handover_window=site.handover_window,
    )
    if not released.holders:
        raise NotFound(
            f"no lease of lock {name!r} matched (not held, or it ended meanwhile); nothing freed"
        )
    return render.released_lines(released)


def release_claim(site: Site, form: Form) -> list[str]:
    name = _name(form)
    freed = admin.force_release_claim(
        site.client, name, task_id=form.get("task_id") or None, namespace=site.namespace
    )
    if freed is None:
        raise NotFound(f"no queued claim on unique key {name!r} matched; nothing freed")
    return render.claim_lines(freed, dry_run=False)


def pause_lock(site: Site, form: Form) -> list[str]:
    name, seconds = _name(form), _seconds(form)
    pause = admin.pause_lock(site.client, name, seconds, namespace=site.namespace)
    return [f"paused lock {pause.name!r} for {pause.paused_for:.1f}s (no new lease until then)"]


def resume_lock(site: Site, form: Form) -> list[str]:
    pause = admin.resume_lock(
        site.client,
        _name(form),
        namespace=site.namespace,
        fence_keep=site.fence_keep,
        handover=site.handover,
        handover_window=site.handover_window,
    )
    return [f"resumed lock {pause.name!r}: handed on to {pause.handed_on} waiting"]


def pause_rate(site: Site, form: Form) -> list[str]:
    name, seconds = _name(form), _seconds(form)
    state = admin.pause_rate(site.client, name, seconds, namespace=site.namespace)
    return [f"paused rate limit {state.name!r}", render.rate_line(state)]


def resume_rate(site: Site, form: Form) -> list[str]:
    state = admin.resume_rate(site.client, _name(form), namespace=site.namespace)
    return [f"resumed rate limit {state.name!r}", render.rate_line(state)]


def set_limits(site: Site, form: Form) -> list[str]:
    name = _name(form)
    rate = form.get("rate", "").strip() or None
    burst = _whole(form, "burst", "a whole number of units above 0")
    cap = _whole(form, "cap", f"a whole number from 1 to {MAX_CAP:,}")
    if rate is None and burst is None and cap is None:
        raise BadInput("set-limits needs a rate (e.g. 100/m), a burst or a cap")
    state = admin.set_limits(
        site.client, name, rate=rate, burst=burst, cap=cap, namespace=site.namespace
    )
    return [render.rate_line(state)]


def clear_limits(site: Site, form: Form) -> list[str]:
    state = admin.clear_limits(site.client, _name(form), namespace=site.namespace)
    return [render.rate_line(state)]


ACTIONS: dict[str, Callable[[Site, Form], list[str]]] = {
    "release": release,
    "release-claim": release_claim,
    "pause-lock": pause_lock,
    "resume-lock": resume_lock,
    "pause-rate": pause_rate,
    "resume-rate": resume_rate,
    "set-limits": set_limits,
    "clear-limits": clear_limits,
}
"""Every action by the name in its URL (``actions/<name>``)."""


def run_action(site: Site, action: str, form: Form) -> list[str]:
    """Does ``action`` with ``form``; raises :class:`NotFound` for an unknown action, and the
    action's own :class:`~.errors.WebError` or the admin API's ``LockConfigError``."""
    try:
        do = ACTIONS[action]
    except KeyError:
        raise NotFound(f"no action {action!r}: one of {', '.join(ACTIONS)}") from None
    return do(site, form)
