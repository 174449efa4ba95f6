"""RedLock: one lock over several independent Redis masters (3 or 5), held while a majority of
them hold its lease. The same :class:`~celery_redislock.core.lock.Lock` API (a subclass of it):
``acquire``/``release``, leases the heartbeat renews, ``holders``, ``locked``, ``with``.

Each master runs the lock's own scripts (``acquire.lua``, ``release.lua``, ...) with the same
token, all masters at once, through clients with retries off and short timeouts. An acquire
holds when a majority granted it within the validity ``ttl - elapsed - drift`` (drift: 1% of
ttl + 2 ms); otherwise what it took is released everywhere (a request still in flight is
released when it settles). A blocking acquire tries again after a short random pause (no
wake-up crosses masters). Fences: the highest fence the granting masters gave is raised on a
majority before the acquire returns (``redlock_fence.lua``), so fences grow strictly from one
acquisition to the next. ``limit`` above 1 and ``fair`` are refused (see docs/topologies.md).

>>> masters = master_clients(["redis://a", "redis://b", "redis://c"])   # doctest: +SKIP
>>> with RedLock(masters, "report", ttl=30).acquire(timeout=5) as lease:  # doctest: +SKIP
...     print(lease.fence)

Over 300 lines: one class, whose methods each send one script to every master and count the
answers.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
from redis.cluster import RedisCluster

from ..errors import (
    JobFinished,
    LockBackendError,
    LockConfigError,
    LockNotAcquired,
    LockNotOwned,
    LockUpgradeError,
)
from .keys import DEFAULT_NAMESPACE, check_name
from .lease import Holder, Lease, Mode, RedisClient
from .lock import DEFAULT_FENCE_KEEP, Lock, _info_json
from .protocol import (
    AcquireArgs,
    AcquireReply,
    AcquireStatus,
    HoldersReply,
    ReleaseArgs,
    ReleaseReply,
    ReleaseWhereArgs,
    ReleaseWhereReply,
)
from .redlock_masters import check_masters, gather, master_clients, on_each, quorum
from .redlock_renew import drift, renew_report
from .scripts import run

__all__ = ["RedLease", "RedLock", "lock_factory"]

T = TypeVar("T")

# A blocking acquire that met the lock held tries again after a random pause drawn from the
# upper half of this, doubled per try up to the cap: contenders spread out, a free lock is
# noticed within the cap.
_RETRY_BASE_S = 0.01
_RETRY_CAP_S = 0.2


@dataclass(eq=False)
class RedLease(Lease):
    """A lease held on a majority of a :class:`RedLock`'s masters. ``valid_until`` is the end of
    its validity (``ttl - elapsed - drift`` from its acquisition or last renewal)."""

    renew_apart = staticmethod(renew_report)  # type: ignore[assignment]


class _Refused(Exception):
    """An attempt that did not get a majority because the lock is held (try again later)."""


class RedLock(Lock):
    """A lock over independent Redis masters: a mutex (``limit`` None or 1) or a read/write
    lock, held while a majority of the masters hold its lease.

    ``masters``: one ``redis.Redis`` client per master, an odd number of at least 3 (see
    :func:`~celery_redislock.core.redlock_masters.master_clients` to make them from URLs, with
    retries off and short timeouts). ``client`` is the first master's (it is not used alone).

    Failures: a majority of masters unreachable, or a majority granted only after the validity
    ran out, raise :class:`LockBackendError` (fail closed); the lock held elsewhere raises
    :class:`LockNotAcquired` (after ``timeout`` when blocking).

    >>> lock = RedLock(masters, "nightly-report", ttl=30)   # doctest: +SKIP
    >>> with lock.acquire(timeout=5) as lease:              # doctest: +SKIP
    ...     store.write(data, fence=lease.fence)
    """

    def __init__(
        self,
        masters: Sequence[redis.Redis],
        name: str,
        *,
        ttl: float,
        mode: Mode = "write",
        limit: int | None = None,
        fair: bool = False,
        namespace: str = DEFAULT_NAMESPACE,
        fence_keep: float = DEFAULT_FENCE_KEEP,
        min_replicas: int | None = None,
        replica_timeout: float | None = None,
        **more: Any,
    ) -> None:
        name = check_name(name)
        clients = check_masters(masters, name=name)
        if limit is not None and limit != 1:
            raise LockConfigError(
                f"limit must be None or 1 in RedLock mode, got {limit!r}: a cap counted per "
                "master is not safe with majorities (3 masters, limit 2: holders on {A,B}, "
                "{B,C} and {A,C} each have a majority, no master counts more than 2, and 3 "
                "run); use one lock per permit instead",
                name=name,
            )
        if fair is not False:
            raise LockConfigError(
                "fair=True is not available in RedLock mode: each master would hand the lock "
                "to its own first waiter; blocking acquires try again instead",
                name=name,
            )
        if min_replicas or replica_timeout is not None:
            raise LockConfigError(
                "min_replicas does not apply in RedLock mode: the masters are independent, "
                "and a majority of them is what keeps a lease",
                name=name,
            )
        super().__init__(
            clients[0],
            name,
            ttl=ttl,
            mode=mode,
            limit=limit,
            namespace=namespace,
            fence_keep=fence_keep,
            min_replicas=0,
            **more,  # (the task line's hand-over: nobody parks on a RedLock, see the docs)
        )
        self.masters = clients
        self.quorum = quorum(len(clients))
        self.drift = drift(self.ttl)
        """Seconds of the ttl a lease is not counted on for (clock drift)."""

    def __repr__(self) -> str:
        return (
            f"RedLock({self.name!r}, masters={len(self.masters)}, mode={self.mode!r}, "
            f"ttl={self.ttl})"
        )

    # -- acquiring ---------------------------------------------------------------------------

    def acquire(
        self,
        blocking: bool = True,
        timeout: float | None = None,
        *,
        owner: str | None = None,
        info: Mapping[str, object] | None = None,
        reentrant: bool = True,
        job: str | None = None,
    ) -> Lease:
        """As :meth:`Lock.acquire`, on a majority of the masters. Waiting is by retries at
        random intervals of up to 0.2 s (no wake-up crosses masters), so a released lock is
        taken again within about that."""
        self._check_acquire_args(blocking, timeout, owner)
        if not isinstance(reentrant, bool):
            raise LockConfigError(
                f"reentrant must be True or False, got {reentrant!r}", name=self.name
            )
        if job is not None and (not isinstance(job, str) or not job or " " in job):
            raise LockConfigError(
                f"job must be None or a non-empty string without spaces, got {job!r}",
                name=self.name,
            )
        request = AcquireArgs(
            token="",
            spec=self._spec,
            wait=False,
            once=not reentrant,
            owner=owner,
            info=_info_json(info),
            job=job,
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        tries = 0
        while True:
            # A new token for every try: a try's late answer gives back that try's lease only
            # (were it shared, it could take a master's vote from the next try).
            token = os.urandom(16).hex()
            try:
                return self._attempt(token, request._replace(token=token).encode(), owner, job)
            except _Refused:
                pass
            remaining = float("inf") if deadline is None else deadline - time.monotonic()
            if not blocking or remaining <= 0:
                raise LockNotAcquired(
                    f"lock {self.name!r} is held"
                    + (f" (gave up after {timeout}s)" if timeout and blocking else ""),
                    name=self.name,
                    timeout=timeout,
                )
            pause = min(_RETRY_CAP_S, _RETRY_BASE_S * 2**tries)
            time.sleep(min(remaining, random.uniform(pause / 2, pause)))
            tries += 1

    def _attempt(self, token: str, args: list[str], owner: str | None, job: str | None) -> Lease:
        started = time.monotonic()
        valid_until = started + self.ttl - self.drift
        need, count = self.quorum, len(self.masters)

        def acquire(master: redis.Redis) -> AcquireReply:
            return AcquireReply.decode(run("acquire", master, self.encoded_keys, args))

        futures = on_each(self.masters, acquire)

        def decided() -> bool:
            done = [f for f in futures if f.done()]
            held = Counter(r.token for r in _replies(done) if r.status is AcquireStatus.HELD)
            best = max(held.values(), default=0)
            return best >= need or best + count - len(done) < need

        gather(futures, decided, valid_until)
        replies = _replies(futures)
        held = Counter(r.token for r in replies if r.status is AcquireStatus.HELD)
        winner, votes = held.most_common(1)[0] if held else ("", 0)
        finished = any(r.status is AcquireStatus.JOB_FINISHED for r in replies)
        lease: Lease | str | None = None
        if votes >= need and not finished:
            lease = self._agree(winner, futures, owner, valid_until)
        kept = winner if isinstance(lease, Lease) else None
        undone = [
            self._undo_when_settled(master, future, token, kept)
            for master, future in zip(self.masters, futures, strict=True)
        ]
        if isinstance(lease, Lease):
            return lease
        # Failed: what it took is given back before the next try (or the error), except on a
        # master still out, which gives it back when it answers.
        gather([f for f in undone if f is not None], lambda: False, time.monotonic() + self.ttl)
        if finished:
            raise JobFinished(
                f"lock {self.name!r}: job {job!r} is recorded as finished",
                name=self.name,
                job=job or "",
            )
        statuses = Counter(r.status for r in replies)
        if statuses[AcquireStatus.UPGRADE_REFUSED]:
            raise LockUpgradeError(
                f"lock {self.name!r}: owner {owner!r} holds a read lease and asked for write; "
                "release the read lease first",
                name=self.name,
            )
        errors = sum(1 for f in futures if f.done() and f.exception() is not None)
        # Requests still out are failures if the validity ran out; if the outcome was decided
        # before they answered, they may yet say the lock is free or held: not counted.
        late = count - len(replies) - errors if time.monotonic() >= valid_until else 0
        if errors + late > count - need:
            slow = f", {late} no answer within the validity" if late else ""
            raise LockBackendError(
                f"lock {self.name!r}: {errors} of {count} RedLock masters failed{slow}; a "
                f"majority ({need}) must grant the lease ({_errors(futures)})",
                name=self.name,
            )
        if statuses[AcquireStatus.OWNER_HOLDS]:
            left = max(r.ms_left for r in replies if r.status is AcquireStatus.OWNER_HOLDS)
            raise LockNotAcquired(
                f"lock {self.name!r} is held by owner {owner!r} already",
                name=self.name,
                owner_expires_in=left / 1000,
            )
        if lease is not None:  # granted by a majority, but not agreed on in time
            raise LockBackendError(
                f"lock {self.name!r}: a majority of the RedLock masters granted the lease, but "
                f"{lease} (after {time.monotonic() - started:.3f}s, validity "
                f"{self.ttl - self.drift:.3f}s)",
                name=self.name,
            )
        raise _Refused()

    def _agree(
        self,
        winner: str,
        futures: list[Future[AcquireReply]],
        owner: str | None,
        valid_until: float,
    ) -> Lease | str:
        """With a majority granted: raises the fence mark to the highest fence given on the
        granting masters whose fence is lower; the lease if a majority then has it in time,
        else why not."""
        granted = [
            (master, future.result())
            for master, future in zip(self.masters, futures, strict=True)
            if future.done()
            and future.exception() is None
            and future.result().status is AcquireStatus.HELD
            and future.result().token == winner
        ]
        fence = max(reply.fence for _, reply in granted)
        agreed = sum(1 for _, reply in granted if reply.fence == fence)
        behind = [master for master, reply in granted if reply.fence < fence]
        raised: list[Future[int]] = []
        if behind:
            args = [winner, str(fence)]
            raised = on_each(
                behind, lambda master: int(run("redlock_fence", master, self.encoded_keys, args))
            )
            gather(raised, lambda: False, valid_until)
            agreed += sum(1 for f in raised if f.done() and not f.exception() and f.result())
        if agreed < self.quorum:
            return f"only {agreed} of them took its fence ({_errors(raised)})"
        if time.monotonic() >= valid_until:
            return "the validity ran out first: the masters answer too slowly"
        expiries = sorted((reply.expires_at_ms for _, reply in granted), reverse=True)
        return RedLease(
            lock=self,
            token=winner,
            fence=fence,
            mode=granted[0][1].mode,
            owner=owner,
            expires_at_ms=expiries[self.quorum - 1],
            valid_until=valid_until,
        )

    def _undo_when_settled(
        self,
        master: redis.Redis,
        future: Future[AcquireReply],
        token: str,
        kept: str | None,
    ) -> Future[None] | None:
        """Once ``future`` (an acquire on ``master``) has settled: gives back what it took
        unless it is part of the lease ``kept`` (``None``: the attempt failed). Settled
        already: the give-back, started (``None``: nothing to give back); else it is started
        by the thread that settles it."""

        def what(settled: Future[AcquireReply]) -> tuple[str, bool] | None:
            """The lease to give back there, and whether whole (else one re-entry level)."""
            if settled.exception() is not None:
                # It may have made a lease for the token (its answer lost): drop that.
                return None if kept == token else (token, True)
            reply = settled.result()
            if reply.status is not AcquireStatus.HELD or reply.token == kept:
                return None
            # A new lease of this call's token, or a re-entry of the owner's other lease there.
            return reply.token, reply.token == token

        def undo(settled: Future[AcquireReply]) -> None:
            found = what(settled)
            if found is not None:
                self._give_back(master, found[0], whole=found[1])

        if not future.done():
            future.add_done_callback(undo)
            return None
        found = what(future)
        if found is None:
            return None
        return on_each([master], lambda _: self._give_back(master, found[0], whole=found[1]))[0]

    def _give_back(self, master: redis.Redis, token: str, *, whole: bool) -> None:
        request = token if whole else os.urandom(8).hex()
        args = ReleaseArgs(token=token, spec=self._spec, whole=whole, request=request).encode()
        with contextlib.suppress(redis.RedisError):  # unreachable: it lapses within its ttl
            run("release", master, self.encoded_keys, args)

    # -- releasing ---------------------------------------------------------------------------

    def release(
        self, lease: Lease, *, finish_job: str | None = None, keep: float | None = None
    ) -> None:
        """Releases ``lease`` (one re-entry level) on every master. Raises
        :class:`LockNotOwned` if a majority no longer held it, :class:`LockBackendError` if too
        few masters answered to tell (what was not released lapses within the ttl)."""
        if lease.lock is not self and lease.lock.keys != self.keys:
            raise LockNotOwned(
                f"lease {lease.token} belongs to lock {lease.name!r}, not to lock {self.name!r}",
                name=self.name,
                token=lease.token,
            )
        if lease.released:
            raise LockNotOwned(
                f"lease {lease.token} of lock {self.name!r} is not held (released already)",
                name=self.name,
                token=lease.token,
            )
        args = ReleaseArgs(
            token=lease.token,
            spec=self._spec,
            whole=False,
            request=os.urandom(8).hex(),
            finish=None if finish_job is None else self._finish_args(finish_job, keep),
        ).encode()
        replies = self._on_all(
            lambda master: ReleaseReply.decode(run("release", master, self.encoded_keys, args))
        )
        released = [r for r in replies if isinstance(r, ReleaseReply) and r.released]
        answered = sum(1 for r in replies if isinstance(r, ReleaseReply))
        if len(released) >= self.quorum:
            if max(r.left for r in released) == 0:
                lease.released = True
            return
        if answered >= self.quorum:
            lease.released = True
            raise LockNotOwned(
                f"lease {lease.token} of lock {self.name!r} is not held by a majority of the "
                "masters (expired or released)",
                name=self.name,
                token=lease.token,
            )
        raise self._too_few(replies, "release")

    def release_where(self, **match: object) -> list[str]:
        """As :meth:`Lock.release_where`, on every master; the tokens released anywhere."""
        if not match:
            raise LockConfigError(
                "release_where needs at least one field to match (e.g. task_id=..., pid=...)",
                name=self.name,
            )
        args = ReleaseWhereArgs(
            spec=self._spec,
            match=json.dumps({k: str(v) for k, v in match.items()}),
            request=os.urandom(8).hex(),
        ).encode()
        replies = self._majority(
            lambda master: ReleaseWhereReply.decode(
                run("release_where", master, self.encoded_keys, args)
            ),
            "release_where",
        )
        return list(dict.fromkeys(token for reply in replies for token in reply.released))

    def finish_job(self, job: str, keep: float) -> None:
        """As :meth:`Lock.finish_job`, recorded on a majority of the masters (an acquire on any
        majority then sees it)."""
        args = self._finish_args(job, keep).encode()
        self._majority(lambda master: run("finish", master, self.encoded_keys, args), "finish")

    # -- inspecting --------------------------------------------------------------------------

    def holders(self) -> list[Holder]:
        """The leases a majority of the masters hold, oldest fence first; ``expires_in`` is
        how long a majority still has each (by the masters' clocks)."""
        keys = self.encoded_keys[:2]
        replies = self._majority(
            lambda master: HoldersReply.decode(run("holders", master, keys, [])), "holders"
        )
        seen: dict[str, list[Holder]] = {}
        for reply in replies:
            for live in reply.leases:
                seen.setdefault(live.token, []).append(
                    Holder(
                        token=live.token,
                        mode=live.mode,
                        fence=live.fence,
                        owner=live.owner,
                        info=live.info,
                        count=live.entered,
                        expires_in=(live.expires_at_ms - reply.now_ms) / 1000,
                    )
                )
        out = []
        for copies in seen.values():
            if len(copies) < self.quorum:
                continue  # a stray lease on a minority holds nothing
            left = sorted((h.expires_in for h in copies), reverse=True)[self.quorum - 1]
            first = copies[0]
            out.append(
                Holder(
                    token=first.token,
                    mode=first.mode,
                    # What a majority agreed on (a master that answered late may have more).
                    fence=sorted((h.fence for h in copies), reverse=True)[self.quorum - 1],
                    owner=first.owner,
                    info=first.info,
                    count=max(h.count for h in copies),
                    expires_in=left,
                )
            )
        return sorted(out, key=lambda h: h.fence)

    # -- every master ------------------------------------------------------------------------

    def _on_all(self, call: Callable[[redis.Redis], T]) -> list[T | BaseException]:
        """``call`` on every master at once; each one's answer or error. Waits at most a ttl
        (after that, whatever the call would change has lapsed anyway)."""
        futures = on_each(self.masters, call)
        gather(futures, lambda: False, time.monotonic() + self.ttl)
        out: list[T | BaseException] = []
        for future in futures:
            if not future.done():
                out.append(TimeoutError("no answer within the ttl"))
            elif (error := future.exception()) is not None:
                out.append(error)
            else:
                out.append(future.result())
        return out

    def _majority(self, call: Callable[[redis.Redis], T], what: str) -> list[T]:
        """The answers of the masters that answered, if a majority did; else
        :class:`LockBackendError`."""
        replies = self._on_all(call)
        good = [r for r in replies if not isinstance(r, BaseException)]
        if len(good) < self.quorum:
            raise self._too_few(replies, what)
        return good

    def _too_few(self, replies: Sequence[object], what: str) -> LockBackendError:
        errors = [_describe(r) for r in replies if isinstance(r, BaseException)]
        return LockBackendError(
            f"lock {self.name!r}: {what} answered by {len(replies) - len(errors)} of "
            f"{len(self.masters)} RedLock masters, a majority ({self.quorum}) is needed "
            f"({'; '.join(errors)})",
            name=self.name,
        )


def _replies(futures: Sequence[Future[AcquireReply]]) -> list[AcquireReply]:
    return [f.result() for f in futures if f.done() and f.exception() is None]


def _errors(futures: Sequence[Future[Any]]) -> str:
    out = []
    for future in futures:
        if not future.done():
            out.append("no answer yet")
        elif (error := future.exception()) is not None:
            out.append(_describe(error))
    return "; ".join(out)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def lock_factory(
    target: RedisClient | Sequence[redis.Redis] | Sequence[str], name: str, **options: Any
) -> Lock:
    """A lock on ``target``: one Redis client (plain, Sentinel-managed, or a Cluster) gives a
    :class:`Lock`; a list or tuple of master clients, or of master URLs (clients then made by
    :func:`~celery_redislock.core.redlock_masters.master_clients`, once per process), gives a
    :class:`RedLock`. ``options`` are :class:`Lock`'s keyword arguments (``ttl``, ``mode``, ...).

    >>> lock_factory(settings.redlock_urls or client, "report", ttl=30)   # doctest: +SKIP
    """
    if isinstance(target, redis.Redis | RedisCluster):
        return Lock(target, name, **options)
    if isinstance(target, list | tuple):
        if target and all(isinstance(item, str) for item in target):
            return RedLock(master_clients(target), name, **options)
        return RedLock(target, name, **options)
    raise LockConfigError(
        "a lock needs a Redis client (redis.Redis or RedisCluster), or a list of RedLock "
        f"masters (clients or URLs), got {type(target).__name__}",
        name=name,
    )
