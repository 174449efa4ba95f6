"""The operator commands (click), over :mod:`celery_redislock.core.admin`: ``list``, ``show``,
``release``, ``unique``, ``release-claim``, ``beat``, ``layout``; ``rates``, ``limit set|clear``,
``pause`` and ``resume`` for a name's rate limit and lock. Framework-free: a group gives them
their Redis client and namespace with :func:`set_target` (the ``redislock`` console script from
flags and the environment, ``celery redislock`` from the app's settings).

Exit codes: 0 done, 1 nothing matched, 2 usage error (bad arguments, a bad URL or setting),
3 Redis unreachable or failing.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import click

from ..core import admin
from ..core.admin import render
from ..core.handover import DEFAULT_HANDOVER_WINDOW, Handover
from ..core.layout import read_layout, set_layout
from ..core.lease import RedisClient
from ..core.lock import DEFAULT_FENCE_KEEP
from ..core.store import backend_errors
from ..errors import LockBackendError, LockConfigError

__all__ = [
    "COMMANDS",
    "EXIT_BACKEND",
    "EXIT_NOTHING",
    "Target",
    "redacted",
    "set_target",
]

EXIT_NOTHING = 1
EXIT_BACKEND = 3  # 2 is click's, for a usage error

_TARGET = "celery_redislock.target"
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Target:
    """Where the commands look: a Redis client (made on first use) and the lock namespace."""

    client: Callable[[], RedisClient]
    namespace: str
    where: str
    """The Redis named in error messages (a URL without its password, or a setting's name)."""
    fence_keep: float = DEFAULT_FENCE_KEEP
    handover: Handover | None = None
    """Publishes the parked tasks a ``release`` hands the lock to (a framework's, as a lock's
    ``handover``); None: the workers' sweepers publish them at their next sweep."""
    handover_window: float = DEFAULT_HANDOVER_WINDOW


def redacted(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def set_target(ctx: click.Context, target: Target) -> None:
    """Called by a group's callback: the commands below it use ``target``."""
    ctx.meta[_TARGET] = target


def _target() -> Target:
    target = click.get_current_context().meta.get(_TARGET)
    if not isinstance(target, Target):
        raise click.UsageError("no Redis to look at (the group set no target)")
    return target


def _errors(command: F) -> F:
    """Turns the package's errors into clear messages and exit codes."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except LockConfigError as exc:
            raise click.UsageError(str(exc)) from exc
        except LockBackendError as exc:
            cause = exc.__cause__ or exc
            click.echo(f"Error: Redis at {_target().where} failed: {cause}", err=True)
            raise click.exceptions.Exit(EXIT_BACKEND) from exc

    return run  # type: ignore[return-value]


def _report(as_json: bool, value: Any, found: bool, lines: list[str], nothing: str) -> None:
    """Prints ``value`` as JSON, or the ``lines`` of what was found, or ``nothing`` (to stderr);
    the exit code is 1 if nothing was found."""
    if as_json:
        click.echo(json.dumps(value, indent=2, sort_keys=True))
    elif found:
        click.echo("\n".join(lines))
    else:
        click.echo(nothing, err=True)
    if not found:
        raise click.exceptions.Exit(EXIT_NOTHING)


_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


@click.command(name="list")
@click.argument("pattern", default="*")
@_json_option
@_errors
def list_command(pattern: str, as_json: bool) -> None:
    """Locks held, waited for or paused, whose name matches PATTERN (a glob, default: all):
    mode, holders, the nearest expiry, waiters, and what is set at runtime (a cap, a pause).
    Exit code 1 if none."""
    target = _target()
    client = target.client()
    states = admin.list_locks(client, pattern, target.namespace)
    live = {r.name: r for r in admin.list_rates(client, pattern, target.namespace)}
    # A paused lock nobody holds has no leases to be found by: its pause finds it.
    listed = {s.name for s in states}
    paused = [n for n, r in live.items() if r.lock_paused_for and n not in listed]
    if paused:
        states += [admin.describe_lock(client, n, target.namespace) for n in paused]
        states.sort(key=lambda s: s.name)
    _report(
        as_json,
        [
            {**render.lock_dict(s, detail=False), **render.live_dict(live.get(s.name))}
            for s in states
        ],
        bool(states),
        render.table([render.LIST_HEADER, *(render.lock_row(s, live.get(s.name)) for s in states)]),
        f"no lock matches {pattern!r}",
    )


@click.command(name="show")
@click.argument("name")
@_json_option
@_errors
def show_command(name: str, as_json: bool) -> None:
    """Each holder of lock NAME (task name and id, host, pid, fence, held for, expires in,
    token) and each waiter; whether it is paused, and for how long; and the limits set at
    runtime for NAME, if any. Exit code 1 if nobody holds it or waits for it, it is not
    paused and nothing is set at runtime for NAME."""
    target = _target()
    state = admin.describe_lock(target.client(), name, target.namespace)
    limits = admin.describe_rate(target.client(), name, target.namespace)
    live = (limits.rate, limits.burst, limits.cap) != (None, None, None) or limits.paused_for
    _report(
        as_json,
        {
            **render.lock_dict(state, detail=True),
            "paused_for": render.rounded(limits.lock_paused_for),
            "limits": render.rate_dict(limits),
        },
        bool(state.holders or state.waited_for or limits.lock_paused_for or live),
        render.lock_lines(state, limits.lock_paused_for)
        + ([f"  {render.rate_line(limits)}"] if live else []),
        f"lock {name!r} is not held, nobody waits for it, it is not paused and nothing is set "
        "at runtime for it",
    )


@click.command(name="release")
@click.argument("name")
@click.option("--task-id", help="Free the leases held by this task id.")
@click.option("--token", help="Free the lease with this token (see `show`).")
@click.option("--all", "everything", is_flag=True, help="Free every lease of the lock.")
@click.option("--dry-run", is_flag=True, help="Print what would be freed; free nothing.")
@_json_option
@_errors
def release_command(
    name: str,
    task_id: str | None,
    token: str | None,
    everything: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Free leases of lock NAME that their holders cannot free (a stuck or lost worker): the
    one with --token, those of --task-id, or --all. Each is checked in Redis against the token
    or task id, so a lease taken meanwhile by another task is never freed. The lock is handed
    on as by a release: waiters are woken, and the next task in its task line is published
    (by this command under Celery, else by a worker's sweeper). Prints what it freed; exit
    code 1 if nothing matched."""
    if [task_id is not None, token is not None, everything].count(True) != 1:
        raise click.UsageError("give exactly one of --task-id, --token or --all")
    target = _target()
    released = admin.force_release(
        target.client(),
        name,
        token=token,
        task_id=task_id,
        everything=everything,
        dry_run=dry_run,
        namespace=target.namespace,
        fence_keep=target.fence_keep,
        handover=target.handover,
        handover_window=target.handover_window,
    )
    _report(
        as_json,
        {
            "name": released.name,
            "dry_run": dry_run,
            "released": [render.holder_dict(h) for h in released.holders],
        },
        bool(released.holders),
        render.released_lines(released),
        f"no lease of lock {name!r} matched; nothing freed",
    )


@click.command(name="unique")
@click.argument("pattern", default="*")
@_json_option
@_errors
def unique_command(pattern: str, as_json: bool) -> None:
    """Queued unique tasks' claims whose key matches PATTERN (a glob, default: all): key,
    task id, time left. Exit code 1 if none."""
    target = _target()
    claims = admin.list_claims(target.client(), pattern, target.namespace)
    _report(
        as_json,
        [render.claim_dict(c) for c in claims],
        bool(claims),
        render.table([render.CLAIM_HEADER, *(render.claim_row(c) for c in claims)]),
        f"no queued claim matches {pattern!r}",
    )


@click.command(name="release-claim")
@click.argument("key")
@click.option("--task-id", help="Free it only if this task id holds it.")
@click.option("--dry-run", is_flag=True, help="Print what would be freed; free nothing.")
@_json_option
@_errors
def release_claim_command(key: str, task_id: str | None, dry_run: bool, as_json: bool) -> None:
    """Free the queued claim on unique key KEY, so the next call of its task is published
    (the queued message itself still runs when delivered). Exit code 1 if no claim matched."""
    target = _target()
    freed = admin.force_release_claim(
        target.client(), key, task_id=task_id, dry_run=dry_run, namespace=target.namespace
    )
    _report(
        as_json,
        {
            "name": key,
            "dry_run": dry_run,
            "released": [] if freed is None else [render.claim_dict(freed)],
        },
        freed is not None,
        [] if freed is None else render.claim_lines(freed, dry_run=dry_run),
        f"no queued claim on unique key {key!r} matched; nothing freed",
    )


@click.command(name="rates")
@click.argument("pattern", default="*")
@_json_option
@_errors
def rates_command(pattern: str, as_json: bool) -> None:
    """Names matching PATTERN (a glob, default: all) with a rate, burst or cap set at runtime,
    a paused rate limit or a paused lock. Exit code 1 if none."""
    target = _target()
    states = admin.list_rates(target.client(), pattern, target.namespace)
    _report(
        as_json,
        [render.rate_dict(s) for s in states],
        bool(states),
        render.table([render.RATE_HEADER, *(render.rate_row(s) for s in states)]),
        f"no rate limit or lock with a limit set at runtime or a pause matches {pattern!r}",
    )


@click.group(name="limit")
def limit_group() -> None:
    """Set or clear a name's limits at runtime: its rate limit's rate and burst, its lock's cap
    (every worker applies them at its next start, in place of the code's)."""


@limit_group.command(name="set")
@click.argument("name")
@click.option("--rate", help="A rate such as 100/m, 10/s, 5/2s.")
@click.option("--burst", type=int, help="Units that may start at once.")
@click.option(
    "--cap", type=int, help="How many hold the lock NAME at once (its limit in code: 2+)."
)
@_json_option
@_errors
def limit_set_command(
    name: str, rate: str | None, burst: int | None, cap: int | None, as_json: bool
) -> None:
    """Set the rate and/or burst of rate limit NAME, and/or the cap of lock NAME."""
    target = _target()
    state = admin.set_limits(
        target.client(), name, rate=rate, burst=burst, cap=cap, namespace=target.namespace
    )
    _report(as_json, render.rate_dict(state), True, [render.rate_line(state)], "")


@limit_group.command(name="clear")
@click.argument("name")
@_json_option
@_errors
def limit_clear_command(name: str, as_json: bool) -> None:
    """Forget the runtime limits of NAME (rate, burst, cap): the code's apply again."""
    target = _target()
    state = admin.clear_limits(target.client(), name, namespace=target.namespace)
    _report(as_json, render.rate_dict(state), True, [render.rate_line(state)], "")


@click.command(name="pause")
@click.argument("name")
@click.argument("seconds", type=float)
@_json_option
@_errors
def pause_command(name: str, seconds: float, as_json: bool) -> None:
    """Pause NAME for SECONDS: its rate limit and its lock. No task starts under the rate limit
    until then (tasks wait for a slot after the pause), and the lock hands out no new lease
    (tasks on it meet a held lock: they skip, retry, wait or wait in line, as their on_conflict
    says; holders go on). A longer pause already set is kept."""
    target = _target()
    client = target.client()
    # The lock first: its check refuses a bad SECONDS before anything is written.
    admin.pause_lock(client, name, seconds, namespace=target.namespace)
    state = admin.pause_rate(client, name, seconds, namespace=target.namespace)
    _report(as_json, render.rate_dict(state), True, render.pause_lines(state, "paused"), "")


@click.command(name="resume")
@click.argument("name")
@_json_option
@_errors
def resume_command(name: str, as_json: bool) -> None:
    """End a pause of NAME now: of its rate limit and of its lock, which is handed on at once
    to its waiters and its task line (the parked tasks are published by this command under
    Celery, else by a worker's sweeper)."""
    target = _target()
    client = target.client()
    admin.resume_rate(client, name, namespace=target.namespace)
    admin.resume_lock(
        client,
        name,
        namespace=target.namespace,
        fence_keep=target.fence_keep,
        handover=target.handover,
        handover_window=target.handover_window,
    )
    state = admin.describe_rate(client, name, target.namespace)
    _report(as_json, render.rate_dict(state), True, render.pause_lines(state, "resumed"), "")


@click.command(name="beat")
@click.argument("pattern", default="*")
@_json_option
@_errors
def beat_command(pattern: str, as_json: bool) -> None:
    """The leader of each fleet of beats (LeaderScheduler) whose name matches PATTERN (a glob,
    default: all): its host, pid, since when it leads, and when its lease lapses unless renewed.
    Exit code 1 if no beat leads."""
    target = _target()
    beats = admin.list_beats(target.client(), pattern, target.namespace)
    _report(
        as_json,
        [render.beat_dict(b) for b in beats],
        bool(beats),
        render.table([render.BEAT_HEADER, *(render.beat_row(b) for b in beats)]),
        f"no beat leads a fleet matching {pattern!r}",
    )


@click.command(name="layout")
@click.argument("layout", required=False, type=click.Choice(["lean", "shared"]))
@_json_option
@_errors
def layout_command(layout: str | None, as_json: bool) -> None:
    """Show the key layout of the namespace's locks, or set it to LAYOUT. "shared" (the
    default): every lock on the general path, whose leases workers of every release see.
    "lean": a plain mutex takes the fast path (a third of the Redis work), which workers of
    releases before it do not see: set it once every worker runs this release or later. Every
    process follows within 30 seconds; a switch back to "shared" is safe at any time."""
    target = _target()
    client = target.client()
    with backend_errors(None):
        if layout is not None:
            set_layout(client, target.namespace, layout)
        now = read_layout(client, target.namespace)
    found = {"namespace": target.namespace, "layout": now}
    _report(as_json, found, True, [f"{target.namespace}: {now}"], "")


COMMANDS: tuple[click.Command, ...] = (
    list_command,
    show_command,
    release_command,
    unique_command,
    release_claim_command,
    rates_command,
    limit_group,
    pause_command,
    resume_command,
    beat_command,
    layout_command,
)
"""Every operator command, to add to a group."""
