"""A unique task's spec as producers need it, and as JSON: the workers write it to Redis as
they start, so that a producer that cannot import the task (beat, a service sending by name)
claims its key as one that can."""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import Any

from ..options import LockOptions
from ..unique_options import LIFECYCLES, ON_DUPLICATE, UniqueOptions

__all__ = ["Spec"]


@dataclass(frozen=True, slots=True)
class Spec:
    """What a producer needs to claim a unique task's key: its options and call signature."""

    task: str
    unique: UniqueOptions
    signature: inspect.Signature | None
    expires: float | None
    """The task's own default ``expires`` (seconds), if any."""
    derivable: bool = True
    """False when the key is a callable this process does not have (a task it cannot import)."""

    def to_json(self) -> str:
        key = self.unique.keying.key
        return json.dumps(
            {
                "lifecycle": self.unique.lifecycle,
                "on_duplicate": self.unique.on_duplicate,
                "allowance": self.unique.allowance,
                "period": self.unique.period,
                "max_wait": self.unique.max_wait,
                "key": key if isinstance(key, str) or key is None else {"callable": True},
                "scope": self.unique.keying.scope,
                "params": _params(self.signature),
                "expires": self.expires,
            }
        )

    @classmethod
    def from_json(cls, task: str, text: str | bytes) -> Spec | None:
        raw = json.loads(text)
        on_duplicate = raw.get("on_duplicate")
        if raw.get("lifecycle") not in LIFECYCLES or on_duplicate not in (None, *ON_DUPLICATE):
            return None  # written by another version: do not guess
        key = raw.get("key")
        signature = _signature(raw.get("params"))
        unique = UniqueOptions(
            lifecycle=raw["lifecycle"],
            keying=LockOptions(key=key if isinstance(key, str) else None, scope=raw["scope"]),
            on_duplicate=on_duplicate,
            allowance=raw.get("allowance"),
            period=raw.get("period"),
            max_wait=raw.get("max_wait"),
        )
        derivable = not isinstance(key, dict) and raw.get("params") is not None
        return cls(task, unique, signature, raw.get("expires"), derivable)


def _params(signature: inspect.Signature | None) -> list[list[Any]] | None:
    """The signature as JSON, or None if a default cannot be written as JSON."""
    if signature is None:
        return None
    out: list[list[Any]] = []
    for p in signature.parameters.values():
        entry: list[Any] = [p.name, int(p.kind)]
        if p.default is not inspect.Parameter.empty:
            try:
                json.dumps(p.default)
            except TypeError:
                return None
            entry.append(p.default)
        out.append(entry)
    return out


def _signature(params: list[list[Any]] | None) -> inspect.Signature | None:
    if params is None:
        return None
    # The enum of parameter kinds (its name is private), to read a kind back from its number.
    kind = type(inspect.Parameter("_", inspect.Parameter.POSITIONAL_ONLY).kind)
    return inspect.Signature(
        [
            inspect.Parameter(
                p[0], kind(p[1]), default=p[2] if len(p) > 2 else inspect.Parameter.empty
            )
            for p in params
        ]
    )
