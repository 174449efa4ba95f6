"""``celery -A proj redislock ...`` (a ``celery.commands`` entry point): the operator commands of
:mod:`celery_redislock.cli` on the Redis and namespace of the app's lock settings.

>>> # celery -A proj redislock show sync:42          # doctest: +SKIP
"""

from __future__ import annotations

import click
from celery.signals import worker_init

from ...cli.commands import COMMANDS, Target, redacted, set_target
from ...core.lease import RedisClient
from ...errors import LockConfigError
from .beat import refuse_bad_beat
from .guard import refuse_unlocked_tasks
from .run import handover_for
from .settings import client_for, settings_for

__all__ = ["redislock"]


@click.group(
    name="redislock",
    epilog="Exit codes: 0 done, 1 nothing matched, 2 usage error, 3 Redis unreachable or failing.",
)
@click.pass_context
def redislock(ctx: click.Context) -> None:
    """See and free celery-redislock locks and unique tasks' queued claims, on the Redis of
    the app's lock settings."""
    app = getattr(ctx.obj, "app", None)
    if app is None:
        raise click.UsageError("no Celery app: run it as `celery -A proj redislock ...`")
    try:
        settings = settings_for(app)
    except LockConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    where = "setting redislock_client" if settings.client_factory else redacted(settings.url or "")

    def client() -> RedisClient:
        try:
            return client_for(app, settings)
        except LockConfigError as exc:
            raise click.UsageError(str(exc)) from exc

    set_target(
        ctx,
        Target(
            client=client,
            namespace=settings.namespace,
            where=where,
            fence_keep=settings.fence_keep,
            # A release publishes the next parked task itself, as the holder's release would.
            handover=handover_for(app),
            handover_window=settings.line_handover_window,
        ),
    )


for _command in COMMANDS:
    redislock.add_command(_command)

# Celery imports this module for every `celery` command (its entry point): the one place that
# runs in a worker whose app never called install(), whose locked tasks would run unlocked.
worker_init.connect(
    refuse_unlocked_tasks, weak=False, dispatch_uid="celery_redislock.refuse_unlocked_tasks"
)
# And one whose beat (LeaderScheduler) is misconfigured: checked in every worker of such an app,
# with or without --beat (a setting that stops one worker's beat is a mistake in all of them).
worker_init.connect(refuse_bad_beat, weak=False, dispatch_uid="celery_redislock.refuse_bad_beat")
