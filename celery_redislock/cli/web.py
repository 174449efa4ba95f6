"""``redislock web``: serves the web view (:mod:`celery_redislock.web`) of the group's Redis and
namespace with uvicorn. It needs the ``web`` extra.

    redislock web --url redis://localhost:6379/0
    REDISLOCK_WEB_TOKEN=... redislock web --allow-actions --port 8080

Read-only unless ``--allow-actions`` is given with a token (``--token-file``, else the
environment's ``REDISLOCK_WEB_TOKEN``); with ``--allow-actions`` and no token it refuses to start.
It binds to 127.0.0.1 unless ``--host`` says otherwise, and warns when that is not a loopback
address.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import click
import redis

from .commands import EXIT_BACKEND, _target

__all__ = ["TOKEN_ENV", "web_command"]

TOKEN_ENV = "REDISLOCK_WEB_TOKEN"
INSTALL = "pip install 'celery-redislock[web]'"
_WEB_MODULES = {"starlette", "jinja2", "uvicorn", "anyio", "markupsafe"}


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _token(token_file: Path | None) -> str | None:
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise click.BadParameter(
                f"cannot read {token_file}: {exc.strerror}", param_hint="'--token-file'"
            ) from exc
        if not token:
            raise click.BadParameter(f"{token_file} is empty", param_hint="'--token-file'")
        return token
    return os.environ.get(TOKEN_ENV, "").strip() or None


def _retarget(ctx: click.Context, url: str | None, namespace: str | None) -> None:
    """``--url`` / ``--namespace`` given after ``web``: the group's own checks and client, as if
    given before it."""
    group = ctx.parent
    if group is None or (url is None and namespace is None):
        return
    # The group's command, from the context: importing .script here would close a circle.
    callback = group.command.callback
    assert callback is not None
    group.invoke(
        callback,
        url=url or group.params["url"],
        namespace=namespace or group.params["namespace"],
        cluster=group.params["cluster"],
    )


@click.command(name="web")
@click.option("--url", help="The Redis the locks live on (as the group's --url / REDISLOCK_URL).")
@click.option("--namespace", help="The lock namespace (as the group's --namespace).")
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to bind.")
@click.option(
    "--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="The port."
)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Let an operator who logs in with the token release leases and claims, pause and "
    "resume, and set limits. Needs a token.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"A file holding the token (else the environment's {TOKEN_ENV}); 16 characters or more.",
)
@click.pass_context
def web_command(
    ctx: click.Context,
    url: str | None,
    namespace: str | None,
    host: str,
    port: int,
    allow_actions: bool,
    token_file: Path | None,
) -> None:
    """Serve a web view of the locks (holders and task lines), unique claims, rate limits and
    pauses, updated every second. Read-only unless --allow-actions (with a token)."""
    try:
        import uvicorn

        from ..web import create_app
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in _WEB_MODULES:
            raise
        click.echo(f"Error: redislock web needs the web extra: {INSTALL}", err=True)
        raise click.exceptions.Exit(2) from exc
    _retarget(ctx, url, namespace)
    target = _target()
    token = _token(token_file)
    if allow_actions and token is None:
        raise click.UsageError(
            f"--allow-actions needs a token: --token-file PATH or {TOKEN_ENV} (16 characters or "
            "more, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    if not _loopback(host):
        click.echo(
            f"Warning: serving on {host}, not a loopback address: anyone who reaches it sees "
            "every lock" + (" and may log in to act" if allow_actions else ""),
            err=True,
        )
    try:
        app = create_app(
            target.client(),
            namespace=target.namespace,
            actions=allow_actions,
            token=token if allow_actions else None,
            fence_keep=target.fence_keep,
            handover=target.handover,
            handover_window=target.handover_window,
        )
    except ValueError as exc:  # LockConfigError: a short token
        raise click.UsageError(str(exc)) from exc
    try:
        target.client().ping()
    except redis.RedisError as exc:
        click.echo(f"Error: Redis at {target.where} is unreachable: {exc}", err=True)
        raise click.exceptions.Exit(EXIT_BACKEND) from exc
    mode = "actions on: log in with the token" if allow_actions else "read-only"
    click.echo(f"redislock web on http://{host}:{port}/ ({target.where}, {mode})", err=True)
    uvicorn.run(app, host=host, port=port, log_level="info", server_header=False)
