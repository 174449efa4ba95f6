"""Locked workflows on Celery: :func:`lock_workflow` declares one lock over a chain (each link's
signature stamped with it); as a link publishes the next, the lease goes in that message
(``before_task_publish``); a revoked link gives it back. Each link's run is the core's
:class:`~celery_redislock.core.run.workflow.WorkflowRun` (see :mod:`.run`)."""

from __future__ import annotations

import logging
from typing import Any

from celery.canvas import Signature, chain, chord, group

from ...core.options import option_what
from ...core.run.workflow import PassedLease, release_passed
from ...core.workflow_options import parse_workflow_option
from ...errors import LockConfigError
from ._compat import chain_links
from .kind import WORKFLOW_HEADER, WORKFLOW_LEASE_HEADER, is_locked_task
from .run import current_link
from .settings import client_for, settings_for

__all__ = ["lock_workflow", "pass_lease", "release_revoked_link"]

log = logging.getLogger(__name__)


def lock_workflow(canvas: Any, lock: object) -> Any:
    """A copy of the chain ``canvas`` (or of one task's signature) that holds ``lock`` from its
    first link's start to its last link's end: no two such workflows on one lock name run
    interleaved. ``lock`` is a task's ``lock=`` (a key template over the first link's arguments,
    or a dict: ``on_conflict``, ``ttl``, ``limit``...) plus ``max_gap``, how long the lease may
    wait in the queue between two links (default 1 h). Every link must be a task of
    :class:`~celery_redislock.LockedTask` declaring no ``lock=``, ``unique=`` or ``rate=`` of
    its own; groups and chords are refused. Raises :class:`LockConfigError` naming the task and
    the option.

    >>> flow = lock_workflow(fetch.s(tenant=42) | transform.s() | load.s(),  # doctest: +SKIP
    ...                      lock={"key": "etl:{tenant}", "on_conflict": "retry"})
    >>> flow.apply_async().get()   # doctest: +SKIP
    """
    links = _links(canvas)
    tasks = [_task_of(link) for link in links]
    first = tasks[0]
    options = parse_workflow_option(first.name, first.call_signature, lock)
    stamped = []
    for i, link in enumerate(links):
        link = link.clone()
        headers = dict(link.options.get("headers") or {})
        headers[WORKFLOW_HEADER] = {"lock": options.declared, "link": i}
        link.set(headers=headers)
        stamped.append(link)
    if len(stamped) == 1:
        return stamped[0]
    made = chain(*stamped, app=getattr(canvas, "_app", None))
    return made.set(**canvas.options) if isinstance(canvas, Signature) else made


def _links(canvas: Any) -> list[Signature]:
    """The chain's links in order (nested chains flattened); groups and chords refused."""
    members = chain_links(canvas)
    if members is None:
        members = [canvas]
    links: list[Signature] = []
    for member in members:
        inner = chain_links(member)
        if inner is not None:
            links += _links(member)
        elif isinstance(member, group) or not _is_task_signature(member):
            name = _name_in(member)
            raise LockConfigError(
                f"task {name!r}: workflow lock option 'lock': a locked workflow is a chain of "
                f"task signatures; a {type(member).__name__.lstrip('_')} in it is not offered "
                "(what would keep the lease while its members run)"
            )
        else:
            links.append(member)
    if not links:
        raise LockConfigError("workflow lock option 'lock': the chain has no task")
    return links


def _is_task_signature(member: object) -> bool:
    return isinstance(member, Signature) and not isinstance(member, group | chord)


def _name_in(member: Any) -> str:
    """A task the refused member names (its first), for the error."""
    tasks = getattr(member, "tasks", None)
    if tasks is None and hasattr(member, "get"):
        tasks = member.get("kwargs", {}).get("header")
    for each in tasks or ():
        return _name_in(each)
    return str(member.get("task", member)) if hasattr(member, "get") else str(member)


def _task_of(link: Signature) -> Any:
    try:
        task = link.type
    except (KeyError, AttributeError) as exc:
        raise LockConfigError(
            f"task {link.task!r}: workflow lock: the task is not registered in the app"
        ) from exc
    if not is_locked_task(task):
        raise LockConfigError(
            f"task {link.task!r}: workflow lock: its task class is not celery_redislock's "
            "LockedTask (call celery_redislock.install(app) before declaring it): its worker "
            "could not carry the lease"
        )
    for option, declared in (
        ("lock", task.lock_options),
        ("unique", task.unique_options),
        ("rate", task.rate_options),
    ):
        if declared is not None:
            raise LockConfigError(
                f"{option_what(task.name, option, 'task')} a link of a locked workflow takes "
                "no lock of its own (not offered: the workflow's lock says how it runs)"
            )
    return task


def pass_lease(sender: Any = None, headers: Any = None, **_: Any) -> None:
    """``before_task_publish``: a link publishing the next link of its workflow (or its own
    retry) puts the workflow's lease in that message, and keeps it until that link starts."""
    if not isinstance(headers, dict):
        return
    stamp = headers.get(WORKFLOW_HEADER)
    run = current_link()
    if run is None or not isinstance(stamp, dict):
        return
    link, me = stamp.get("link"), run.delivery.id
    next_link = headers.get("parent_id") == me and link == run.link + 1
    retried = headers.get("id") == me and link == run.link
    if not (next_link or retried):
        return  # another workflow's message, published from inside this link
    passed = run.hand_on()
    if passed is None:
        headers.pop(WORKFLOW_LEASE_HEADER, None)
    else:
        headers[WORKFLOW_LEASE_HEADER] = passed.encode()


def release_revoked_link(sender: Any = None, request: Any = None, **_: Any) -> None:
    """``task_revoked``: a link revoked (or expired) before it ran gives its workflow's lease
    back at once; a running link revoked with ``terminate=True``, as its process is killed."""
    # (The worker's Request keeps the message's headers, ours among them, in request_dict.)
    headers = getattr(request, "request_dict", None) or getattr(request, "headers", None) or {}
    passed = PassedLease.decode(headers.get(WORKFLOW_LEASE_HEADER))
    if passed is None or not is_locked_task(sender):
        return
    settings = settings_for(sender.app)
    if settings.disabled:
        return
    who = f"task {sender.name}[{request.id}]"
    release_passed(settings, client_for(sender.app, settings), passed, who, "revoked")
