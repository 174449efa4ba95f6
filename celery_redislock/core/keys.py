"""Redis key names of a lock. All keys of one lock share the hash tag ``{name}``, so every script
touches a single Redis Cluster slot."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import LockConfigError
from ._validate import non_empty_string

DEFAULT_NAMESPACE = "redislock"
_SUFFIXES = ("leases", "meta", "queue", "qdl", "wake", "done", "tenants", "limits")


def check_name(name: object, *, what: str = "name") -> str:
    name = non_empty_string(name, what)
    if name.startswith("}"):
        # "{}...}" is an empty hash tag: Redis Cluster would then hash each key on its own.
        raise LockConfigError(f"{what} must not start with '}}', got {name!r}", name=None)
    return name


def check_namespace(namespace: object, what: str = "namespace") -> str:
    return non_empty_string(namespace, what, without="{}")


@dataclass(frozen=True, slots=True)
class LockKeys:
    """The keys of one lock, in the order every lock script takes them."""

    prefix: str

    @classmethod
    def of(cls, namespace: str, name: str) -> LockKeys:
        return cls(f"{namespace}:{{{name}}}")

    @property
    def leases(self) -> str:
        return f"{self.prefix}:leases"

    @property
    def meta(self) -> str:
        return f"{self.prefix}:meta"

    @property
    def queued(self) -> str:
        """A unique task's claim while its message waits in the queue (the task id)."""
        return f"{self.prefix}:queued"

    @property
    def replaced(self) -> str:
        """Ids of queued copies a newer call replaced: they must not run when delivered."""
        return f"{self.prefix}:replaced"

    @property
    def pending(self) -> str:
        """A debounced key's pending call and the one being published (hash, see
        lua/pending_call.lua)."""
        return f"{self.prefix}:pending"

    @property
    def bucket(self) -> str:
        """The rate limit of this name: its bucket and pause (hash, see lua/rate.lua)."""
        return f"{self.prefix}:bucket"

    @property
    def limits(self) -> str:
        """The limits set at runtime for this name (hash: ``rate``, ``burst`` for its rate
        limit, ``cap`` for its lock's ``limit``), read by the scripts."""
        return f"{self.prefix}:limits"

    def rate_request(self, request_id: str) -> str:
        """A rate request's slot and cost, kept for 30 seconds past the slot."""
        return f"{self.prefix}:r:{request_id}"

    @property
    def done(self) -> str:
        """Jobs finished under this lock (sorted set: job id -> server ms it is kept until)."""
        return f"{self.prefix}:done"

    @property
    def tenants(self) -> str:
        """Parked tasks with a tenant, by tenant, priority and arrival (sorted set by member,
        see lua/_line.lua); the queue holds each such tenant's place in turn."""
        return f"{self.prefix}:tenants"

    @property
    def all(self) -> list[str]:
        return [f"{self.prefix}:{suffix}" for suffix in _SUFFIXES]

    def waiter(self, token: str) -> str:
        """The list a fair-mode waiter blocks on until it is handed the lock."""
        return f"{self.prefix}:w:{token}"


def registry_key(namespace: str) -> str:
    """The hash of unique tasks' specs, for producers that cannot import a task."""
    return f"{namespace}:{{unique-tasks}}"
