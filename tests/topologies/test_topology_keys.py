"""Static checks that every script stays within one Redis Cluster slot: each key a Lua script
touches is passed in ``KEYS`` (never built inside the script), and every key the Python side
passes shares the lock's hash tag. Fast: runs with the default tests (no marker)."""

from __future__ import annotations

import contextlib
import re
import threading

import pytest
import redis
from helpers import wait_until_queued
from redis.crc import key_slot

from celery_redislock import Lease, Lock, LockNotAcquired, renew_leases
from celery_redislock.core.admin import (
    clear_limits,
    describe_rate,
    pause_lock,
    resume_lock,
    set_limits,
)
from celery_redislock.core.claims import claim, release_claim
from celery_redislock.core.debounce import defer, sweep_pending
from celery_redislock.core.keys import LockKeys, check_name, registry_key
from celery_redislock.core.line import park
from celery_redislock.core.protocol import ClaimKind
from celery_redislock.core.rate import RateLimit
from celery_redislock.core.scripts import NAMES, assembled

_CALL = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'\s*(,|\))")
# Commands our scripts may run without a key.
_KEYLESS = {"TIME"}
# Commands whose every argument is a key (the others take one key, first).
_ALL_KEYS = {"DEL", "EXISTS", "UNLINK", "TOUCH", "MGET"}
_FIELD = re.compile(r"^\s*(?:local\s+)?K\s*=\s*\{(.*?)\}", re.S | re.M)


def _args(text: str, start: int) -> list[str]:
    """The top-level, comma-separated argument expressions of the call whose arguments start
    at ``start`` (just after the command name's comma)."""
    depth, current, out, quote = 0, "", [], ""
    for ch in text[start:]:
        if quote:  # inside a string literal: brackets and commas there are text
            current += ch
            quote = "" if ch == quote else quote
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                out.append(current.strip())
                return out
            depth -= 1
        if ch == "," and depth == 0:
            out.append(current.strip())
            current = ""
        else:
            current += ch
    raise AssertionError("unbalanced call")


def _key_names(source: str) -> tuple[dict[str, int], set[str]]:
    """The ``K`` table's fields (name -> KEYS index) and the local names bound to KEYS."""
    fields: dict[str, int] = {}
    found = _FIELD.search(source)
    if found:
        for name, index in re.findall(r"(\w+)\s*=\s*KEYS\[(\d+)\]", found.group(1)):
            fields[name] = int(index)
        # Every field of K is a KEYS entry: nothing else may hide in it.
        assert len(fields) == found.group(1).count("="), found.group(1)
    names: set[str] = set()
    # A table of keys and other values, as a helper builds one per rate limit:
    # local b = {key = KEYS[k], request = KEYS[k + 1], now = now}: its fields bound to KEYS
    # are keys wherever the table goes (`b.key`, `first.request`), as ".key", ".request".
    for body in re.findall(r"local\s+\w+\s*=\s*\{([^{}]*)\}", source):
        for field_name in re.findall(r"(\w+)\s*=\s*KEYS\[", body):
            names.add(f".{field_name}")
    # local a, b, tok = KEYS[...], KEYS[...], ARGV[...]
    for lhs, rhs in re.findall(r"local\s+([\w\s,]+?)\s*=\s*([^\n]+)", source):
        targets = [t.strip() for t in lhs.split(",")]
        values = [v.strip() for v in rhs.split(", ")]
        for target, value in zip(targets, values, strict=False):
            if value.startswith("KEYS["):
                names.add(target)
    # for _, key in ipairs(KEYS) / ipairs(keys) where every caller passes a table of K fields
    for var, table in re.findall(r"for\s+\w+\s*,\s*(\w+)\s+in\s+ipairs\((\w+)\)", source):
        if table == "KEYS":
            names.add(var)
        elif table == "keys":
            calls = re.findall(r"\bkeep\(\{([^}]*)\}", source)
            assert calls, "a helper iterates over `keys` but nobody passes it a table of keys"
            for call in calls:
                assert all(re.fullmatch(r"K\.\w+", k.strip()) for k in call.split(",")), call
            names.add(var)
    return fields, names


def _is_key(expr: str, fields: dict[str, int], names: set[str]) -> bool:
    if re.fullmatch(r"KEYS\[[^\]]+\]", expr):
        return True
    field = re.fullmatch(r"K\.(\w+)", expr)
    if field:
        return field.group(1) in fields
    member = re.fullmatch(r"\w+(\.\w+)", expr)
    if member and member.group(1) in names:
        return True
    return expr in names


def _full(name: str) -> str:
    return assembled(name).decode()


@pytest.mark.parametrize("name", NAMES)
def test_every_key_a_script_touches_comes_from_keys(name: str) -> None:
    source = re.sub(r"--[^\n]*", "", _full(name))  # comments out
    fields, names = _key_names(source)
    calls = list(_CALL.finditer(source))
    assert calls, f"{name}.lua calls no Redis command?"
    for call in calls:
        command = call.group(1).upper()
        if command in _KEYLESS:
            continue
        assert call.group(2) == ",", f"{name}.lua: {command} without a key"
        args = _args(source, call.end())
        keys = args if command in _ALL_KEYS else args[:1]
        for key in keys:
            assert _is_key(key, fields, names), (
                f"{name}.lua: {command} touches {key!r}, which is not passed in KEYS: build "
                "the key in Python (sharing the lock's hash tag) and pass it in KEYS"
            )


def test_the_check_catches_a_key_built_inside_a_script() -> None:
    source = "local K = { leases = KEYS[1] }\nredis.call('DEL', K.leases .. ':x')\n"
    fields, names = _key_names(source)
    [call] = _CALL.finditer(source)
    assert not _is_key(_args(source, call.end())[0], fields, names)
    bad = "local K = { leases = KEYS[1], other = 'ns:x' }\n"
    with pytest.raises(AssertionError):
        _key_names(bad)
    # A table of keys and other values: its KEYS fields are keys, nothing else of it is.
    source = "local b = {key = KEYS[k], now = now}\nredis.call('GET', b.key)\n"
    fields, names = _key_names(source)
    assert _is_key("b.key", fields, names) and _is_key("first.key", fields, names)
    assert not _is_key("b.now", fields, names)
    assert not _is_key("b.key .. ':x'", fields, names)


@pytest.mark.parametrize("name", ["report", "a}b{c", "{x}", "sync:{42}", "é ü", "x" * 300])
def test_every_key_of_a_lock_shares_its_hash_tag(name: str) -> None:
    keys = LockKeys.of("redislock", check_name(name))
    every = [
        *keys.all,
        keys.queued,
        keys.replaced,
        keys.pending,
        keys.done,
        keys.waiter("tok"),
        keys.bucket,  # a rate limit of the same name: its bucket, runtime limits, requests
        keys.limits,
        keys.rate_request("job-1"),
        keys.rate_request(""),
    ]
    # Every key-valued property of LockKeys is in that list: a new one cannot be missed.
    properties = {
        attr
        for attr, value in vars(LockKeys).items()
        if isinstance(value, property) and attr != "all"
    }
    assert {getattr(keys, attr) for attr in properties} <= set(every)
    for key in every:
        # (Redis hashes the text between the first '{' and the first '}' after it.)
        assert key_slot(key.encode()) == key_slot(keys.leases.encode()), key
    assert key_slot(registry_key("redislock").encode()) == key_slot(b"{unique-tasks}")


def test_at_run_time_every_key_a_script_touches_was_passed_to_it(client: redis.Redis) -> None:
    """The same, watched on a real server: MONITOR shows each EVALSHA with its KEYS and then
    each command the script ran; every key those commands touch must be one of those KEYS, and
    all of them in one slot."""
    seen: list[dict[str, str]] = []
    ready = threading.Event()

    def watch() -> None:
        with client.monitor() as monitor:
            ready.set()
            for command in monitor.listen():
                seen.append(command)
                if command["command"].startswith("ECHO end-of-check"):
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    ready.wait(5)
    worker = redis.Redis(connection_pool=client.connection_pool)
    for name in ("plain", "fair"):
        lock = Lock(worker, f"keys-{name}", ttl=5, fair=name == "fair")
        lease = lock.acquire(info={"task_id": "t1"})
        got: list[Lease] = []
        waiter = threading.Thread(target=lambda lock=lock, got=got: got.append(lock.acquire()))
        waiter.start()
        wait_until_queued(worker, lock)
        renew_leases([lease])
        lock.holders()
        lease.release()
        waiter.join(10)
        got[0].release(finish_job="job-1", keep=5)
        readers = Lock(worker, f"keys-{name}", ttl=5, mode="read")
        readers.acquire(info={"pid": "1"})
        readers.release_where(pid="1")
        claim(
            worker,
            "redislock",
            f"keys-{name}",
            task_id="a",
            lifetime=5,
            kind=ClaimKind.NEW,
            running_counts=True,
        )
        release_claim(worker, "redislock", f"keys-{name}", "a")
        # A debounced call: kept, then taken and published by a sweep.
        defer(worker, "redislock", f"keys-{name}", "d", "payload", quiet=0.0, max_wait=None)
        sweep_pending(worker, "redislock", lambda call_id, payload: None)
        # A rate limit of the same name, with limits set at runtime: every op of rate.lua.
        set_limits(worker, f"keys-{name}", burst=2)
        limit = RateLimit(worker, f"keys-{name}", "10/s")
        limit.reserve("r1", cost=2)
        limit.reserve("r1", max_late=0)
        limit.settle("r1", 3)
        limit.settle("gone", 1)
        limit.pause(5)
        limit.usage()
        limit.resume()
        # The lock of the name paused (every op of limits.lua), a call refused and one parked
        # meanwhile, then resumed (handing the lock on) and its limits cleared.
        pause_lock(worker, f"keys-{name}", 5)
        with contextlib.suppress(LockNotAcquired):
            lock.acquire(blocking=False)
        park(lock, "payload", owner="p1")
        resume_lock(worker, f"keys-{name}")
        clear_limits(worker, f"keys-{name}")
        describe_rate(worker, f"keys-{name}")
    client.echo("end-of-check")
    watcher.join(10)
    keys: list[str] = []
    scripts = 0
    for entry in seen:
        words = entry["command"].split(" ")
        if entry["client_type"] != "lua":
            if words[0].upper() == "EVALSHA":
                scripts += 1
                keys = words[3 : 3 + int(words[2])]
                assert len({key_slot(k.encode()) for k in keys}) == 1, keys
            continue
        command = words[0].upper()
        if command in _KEYLESS:
            continue
        touched = words[1:] if command in _ALL_KEYS else words[1:2]
        for key in touched:
            assert key in keys, f"{command} touched {key!r}, not among the script's KEYS {keys}"
    assert scripts >= 20
