"""A unique claim's confirmation leaves the caller's path: sent from a thread within a few ms,
or in the round trip of this process's next claim, or at exit; never by a forked child."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest
import redis
from helpers import wait_for

from celery_redislock.contrib.redis_server import RedisServer
from celery_redislock.core.claims import ClaimKind, publish_claimed
from celery_redislock.core.confirmations import confirmations
from celery_redislock.core.keys import LockKeys

WINDOW = 30.0
LIFETIME = 600.0


def _publish(client: redis.Redis, name: str, task_id: str) -> None:
    found, result = publish_claimed(
        client,
        "redislock",
        name,
        task_id=task_id,
        lifetime=LIFETIME,
        kind=ClaimKind.NEW,
        running_counts=False,
        window=WINDOW,
        publish=lambda: "sent",
        what=f"test[{task_id}]",
    )
    assert not found.duplicate and result == "sent"


def _left_ms(client: redis.Redis, name: str) -> int:
    return int(client.pttl(LockKeys.of("redislock", name).queued))


def test_the_confirmation_follows_the_call_from_a_thread(client: redis.Redis) -> None:
    _publish(client, "conf:alone", "t-1")
    wait_for(lambda: _left_ms(client, "conf:alone") > WINDOW * 1000, "the claim confirmed")
    assert _left_ms(client, "conf:alone") <= LIFETIME * 1000


def test_the_next_claim_carries_the_unsent_confirmations_in_its_round_trip(
    client: redis.Redis, held_back: None
) -> None:
    _publish(client, "conf:first", "t-1")
    assert _left_ms(client, "conf:first") <= WINDOW * 1000, "not confirmed yet"
    before = client.info("commandstats")["cmdstat_evalsha"]["calls"]
    _publish(client, "conf:second", "t-2")
    # Sent ahead of the second claim, in its pipeline: confirmed when the second call returns.
    assert _left_ms(client, "conf:first") > WINDOW * 1000
    assert _left_ms(client, "conf:second") <= WINDOW * 1000
    assert client.info("commandstats")["cmdstat_evalsha"]["calls"] - before == 2
    confirmations.flush()
    assert _left_ms(client, "conf:second") > WINDOW * 1000


def test_a_duplicate_from_the_same_process_sees_the_confirmed_lifetime(
    client: redis.Redis, held_back: None
) -> None:
    _publish(client, "conf:dup", "t-1")
    found, result = publish_claimed(
        client,
        "redislock",
        "conf:dup",
        task_id="t-2",
        lifetime=LIFETIME,
        kind=ClaimKind.NEW,
        running_counts=False,
        window=WINDOW,
        publish=lambda: "sent",
        what="test[t-2]",
    )
    assert found.duplicate and found.holder == "t-1" and result is None
    assert found.ms_left > WINDOW * 1000, "the first call's claim was confirmed first"


def test_a_process_that_exits_at_once_sends_its_confirmation(client: redis.Redis) -> None:
    url = client.connection_pool.connection_kwargs
    code = textwrap.dedent(
        f"""
        import redis
        from celery_redislock.core import confirmations
        from celery_redislock.core.claims import ClaimKind, publish_claimed
        confirmations.LINGER = 60.0  # only the exit can send it
        client = redis.Redis(host={url["host"]!r}, port={url["port"]!r})
        publish_claimed(client, "redislock", "conf:exit", task_id="t-1", lifetime={LIFETIME},
            kind=ClaimKind.NEW, running_counts=False, window={WINDOW},
            publish=lambda: None, what="test")
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert _left_ms(client, "conf:exit") > WINDOW * 1000


def test_a_process_killed_before_its_confirmation_leaves_the_claim_to_the_window(
    client: redis.Redis,
) -> None:
    """SIGKILL between the publish and its confirmation: the message is out, its claim lasts
    the publish window (then a duplicate is published too, and only the newer copy runs)."""
    url = client.connection_pool.connection_kwargs
    code = textwrap.dedent(
        f"""
        import sys, threading, redis
        from celery_redislock.core import confirmations
        from celery_redislock.core.claims import ClaimKind, publish_claimed
        confirmations.LINGER = 60.0
        client = redis.Redis(host={url["host"]!r}, port={url["port"]!r})
        publish_claimed(client, "redislock", "conf:killed", task_id="t-1", lifetime={LIFETIME},
            kind=ClaimKind.NEW, running_counts=False, window={WINDOW},
            publish=lambda: None, what="test")
        print("published", flush=True)
        threading.Event().wait()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"published\n"
    finally:
        proc.kill()
        proc.wait()
    assert 0 < _left_ms(client, "conf:killed") <= WINDOW * 1000


def test_a_forked_child_does_not_send_its_parents_confirmations(
    client: redis.Redis, held_back: None
) -> None:
    _publish(client, "conf:fork", "t-1")
    pid = os.fork()
    if pid == 0:  # the child: nothing of the parent's to send
        os._exit(0 if not confirmations.pending else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _left_ms(client, "conf:fork") <= WINDOW * 1000
    confirmations.flush()
    assert _left_ms(client, "conf:fork") > WINDOW * 1000


def test_a_confirmation_that_fails_is_logged(
    own_server: RedisServer, held_back: None, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.Redis.from_url(own_server.url, socket_connect_timeout=0.5)
    _publish(client, "conf:lost", "t-1")
    own_server.stop()  # Redis gone before the confirmation left
    with caplog.at_level(logging.WARNING, logger="celery_redislock.core.confirmations"):
        confirmations.flush()
    assert "lapses 30s after the publish instead of 600s" in caplog.text
    assert not confirmations.pending
    client.close()
