"""The ``redislock`` group of the console script: its Redis from ``--url`` / ``REDISLOCK_URL``
(``--cluster`` for Redis Cluster), its namespace from ``--namespace`` / ``REDISLOCK_NAMESPACE``."""

from __future__ import annotations

from urllib.parse import urlsplit

import click
import redis
from redis.cluster import RedisCluster

from .._version import __version__
from ..core.keys import DEFAULT_NAMESPACE, check_namespace
from ..core.lease import RedisClient
from ..errors import LockConfigError
from .commands import COMMANDS, Target, redacted, set_target
from .web import web_command

__all__ = ["redislock"]

# Bounded waits: an unreachable Redis is an error within seconds, not a hung command.
_TIMEOUT = 5.0


def _client(url: str, cluster: bool) -> RedisClient:
    try:
        if cluster:
            # RedisCluster connects as it is made: not before a command needs it.
            return RedisCluster.from_url(
                url, socket_timeout=_TIMEOUT, socket_connect_timeout=_TIMEOUT
            )
        return redis.Redis.from_url(url, socket_timeout=_TIMEOUT, socket_connect_timeout=_TIMEOUT)
    except ValueError as exc:
        raise click.BadParameter(f"{redacted(url)!r} is not a Redis URL: {exc}") from exc


@click.group(
    name="redislock",
    epilog="Exit codes: 0 done, 1 nothing matched, 2 usage error, 3 Redis unreachable or failing.",
)
@click.option(
    "--url",
    envvar="REDISLOCK_URL",
    default="redis://localhost:6379/0",
    show_default=True,
    show_envvar=True,
    help="The Redis the locks live on (redis://, rediss:// or unix://).",
)
@click.option(
    "--namespace",
    envvar="REDISLOCK_NAMESPACE",
    default=DEFAULT_NAMESPACE,
    show_default=True,
    show_envvar=True,
    help="The lock namespace (the prefix of every key).",
)
@click.option(
    "--cluster",
    is_flag=True,
    envvar="REDISLOCK_CLUSTER",
    show_envvar=True,
    help="The URL names a node of a Redis Cluster.",
)
@click.version_option(__version__, prog_name="redislock")
@click.pass_context
def redislock(ctx: click.Context, url: str, namespace: str, cluster: bool) -> None:
    """See and free celery-redislock locks and unique tasks' queued claims."""
    if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        raise click.BadParameter(
            f"{redacted(url)!r} is not a Redis URL (redis://, rediss:// or unix://)",
            param_hint="'--url' / REDISLOCK_URL",
        )
    try:
        namespace = check_namespace(namespace)
    except LockConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="'--namespace'") from exc
    made: list[RedisClient] = []

    def client() -> RedisClient:
        if not made:
            made.append(_client(url, cluster))
        return made[0]

    set_target(ctx, Target(client=client, namespace=namespace, where=redacted(url)))


for _command in COMMANDS:
    redislock.add_command(_command)
redislock.add_command(web_command)  # the web view (the `web` extra)
