"""The fault proxy itself: each fault, against a real redis-server and real clients."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from faultproxy import FaultProxy
from helpers import wait_for
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redislock.contrib.redis_server import RedisServer

COUNT = "return redis.call('INCR', KEYS[1])"


@pytest.fixture
def proxy(redis_server: RedisServer, client: redis.Redis) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        yield proxy


def _through(proxy: FaultProxy, *, timeout: float = 0.3, retries: int = 0) -> redis.Redis:
    """A client of the proxy that retries ``retries`` times, with no backoff."""
    c = redis.Redis.from_url(proxy.url, socket_timeout=timeout, retry=Retry(NoBackoff(), retries))
    c.ping()  # connected: the handshake's replies are not in the way of the faults
    return c


def _command(*args: str | bytes) -> bytes:
    out = b"*%d\r\n" % len(args)
    for arg in args:
        data = arg.encode() if isinstance(arg, str) else arg
        out += b"$%d\r\n%s\r\n" % (len(data), data)
    return out


def _receive(sock: socket.socket, size: int) -> bytes:
    """Reads ``size`` bytes (fewer if the connection closes first), failing after 5 s."""
    sock.settimeout(5)
    data = b""
    while len(data) < size and (chunk := sock.recv(size - len(data))):
        data += chunk
    return data


def test_dropped_reply_ran_in_redis_and_the_client_timed_out(
    proxy: FaultProxy, client: redis.Redis
) -> None:
    sha = client.script_load(COUNT)
    c = _through(proxy)
    proxy.drop_replies(1, command="evalsha")
    with pytest.raises(redis.TimeoutError):
        c.evalsha(sha, 1, "runs")
    assert client.get("runs") == b"1"  # Redis ran it: only the answer was lost
    assert proxy.faults == 1
    assert c.evalsha(sha, 1, "runs") == 2  # one reply only: the next one comes through
    assert proxy.seen("EVALSHA") == 2


def test_a_lost_request_never_ran_in_redis_and_the_client_timed_out(
    proxy: FaultProxy, client: redis.Redis
) -> None:
    sha = client.script_load(COUNT)
    c = _through(proxy)
    proxy.lose_requests(1, command="evalsha")
    with pytest.raises(redis.TimeoutError):
        c.evalsha(sha, 1, "runs")
    assert client.get("runs") is None  # Redis never saw it
    assert proxy.faults == 1 and proxy.seen("EVALSHA") == 0
    assert c.evalsha(sha, 1, "runs") == 1  # one request only: the next one comes through
    assert proxy.seen("EVALSHA") == 1


def test_a_retry_after_a_lost_reply_runs_the_script_again(
    proxy: FaultProxy, client: redis.Redis
) -> None:
    sha = client.script_load(COUNT)
    proxy.drop_replies(1, command="EVALSHA")
    assert _through(proxy, retries=1).evalsha(sha, 1, "runs") == 2
    assert client.get("runs") == b"2" and proxy.seen("EVALSHA") == 2
    # With redis-py's own default (which retries or not, by version) the same holds: a call
    # that returned after a lost reply ran twice.
    client.delete("runs")
    default = redis.Redis.from_url(proxy.url, socket_timeout=0.3)
    default.ping()
    proxy.drop_replies(1, command="EVALSHA")
    try:
        answer = default.evalsha(sha, 1, "runs")
    except redis.TimeoutError:
        assert client.get("runs") == b"1"
    else:
        assert answer == 2 and client.get("runs") == b"2"


def test_drops_until_healed_and_any_command_matches(proxy: FaultProxy, client: redis.Redis) -> None:
    c = _through(proxy)
    proxy.drop_replies(None, command="INCRBY")  # what incr() sends
    for expected in (b"1", b"2"):
        with pytest.raises(redis.TimeoutError):
            c.incr("n")
        assert client.get("n") == expected
    assert c.get("n") == b"2"  # another command is not touched
    proxy.heal()
    assert c.incr("n") == 3
    proxy.drop_replies(1)  # any command
    with pytest.raises(redis.TimeoutError):
        c.get("n")
    assert c.get("n") == b"3"
    assert proxy.faults == 3


def test_reset_after_fails_the_call_at_once(proxy: FaultProxy, client: redis.Redis) -> None:
    sha = client.script_load(COUNT)
    c = _through(proxy, timeout=120)
    proxy.reset_after(1, command="EVALSHA")
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError) as failed:
        c.evalsha(sha, 1, "runs")
    # Failed by the reset, not by the socket timeout (the 60 s: liveness only).
    assert not isinstance(failed.value, redis.TimeoutError)
    assert time.monotonic() - started < 60
    assert client.get("runs") == b"1" and proxy.faults == 1
    assert c.evalsha(sha, 1, "runs") == 2  # a new connection works


def test_replies_before_a_reset_reach_the_client(proxy: FaultProxy, client: redis.Redis) -> None:
    proxy.reset_after(1, command="GET")
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sock.sendall(b"".join(_command(*c) for c in [("INCR", "n")] * 2 + [("GET", "n")] * 2))
        assert _receive(sock, 8) == b":1\r\n:2\r\n"
        with pytest.raises(ConnectionResetError):
            _receive(sock, 1)
    assert client.get("n") == b"2" and proxy.seen("GET") == 2


def test_delay_adds_latency_and_heal_removes_it(proxy: FaultProxy) -> None:
    c = _through(proxy, timeout=30)
    proxy.delay(requests=0.2, replies=0.3)
    started = time.monotonic()
    assert c.ping()
    assert time.monotonic() - started >= 0.5  # at least the delays (a lower bound: no speed)
    proxy.delay(replies=600)
    proxy.heal()
    assert c.ping()  # within the 30 s socket timeout: the 600 s delay is gone


def test_replies_pair_with_pipelined_requests(proxy: FaultProxy, client: redis.Redis) -> None:
    """Every RESP2 reply type, pipelined on one connection; the proxy drops exactly the
    replies of the commands it was told to (a nested array, and a bulk string holding CRLF)."""
    requests = [
        b"PING\r\n",  # inline
        b"\r\n",  # an empty inline line: Redis does not answer it
        _command("GET", "missing"),
        _command("EVAL", "return {1, {2, 'x'}, 'y'}", "0"),
        _command("ECHO", "a\r\nb"),
        _command("BLPOP", "empty", "0.01"),
        _command("NOSUCHCOMMAND"),
        b"ECHO hi\r\n",
        _command("INCR", "n"),
    ]
    kept = b"+PONG\r\n$-1\r\n*-1\r\n"
    proxy.drop_replies(1, command="EVAL")
    proxy.drop_replies(1, command="ECHO")
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sock.sendall(b"".join(requests))
        assert _receive(sock, len(kept)) == kept
        assert _receive(sock, 5) == b"-ERR "
        error = b""
        while not error.endswith(b"\r\n"):
            error += _receive(sock, 1)
        assert _receive(sock, 12) == b"$2\r\nhi\r\n:1\r\n"
        sock.sendall(_command("PING"))  # nothing else was left in the pipe
        assert _receive(sock, 7) == b"+PONG\r\n"
    assert proxy.faults == 2
    assert [proxy.seen(c) for c in ("ping", "echo", "eval", "blpop", "nosuchcommand")] == [
        2,
        2,
        1,
        1,
        1,
    ]


def test_redis_py_pipeline(proxy: FaultProxy, client: redis.Redis) -> None:
    c = _through(proxy)
    pipe = c.pipeline(transaction=False)
    pipe.set("k", "v").incr("n").get("k").get("missing").lrange("k2", 0, -1)
    assert pipe.execute() == [True, 1, b"v", None, []]
    proxy.reset_after(1, command="GET")
    pipe.set("k", "w").incr("n").get("k").incr("n")
    with pytest.raises(redis.ConnectionError):
        pipe.execute()
    assert client.get("n") == b"3" and client.get("k") == b"w"  # every command ran


def test_reset_connections_fails_calls_in_flight(proxy: FaultProxy) -> None:
    c = _through(proxy, timeout=150)
    errors: list[BaseException] = []

    def block() -> None:
        try:
            c.blpop(["nothing"], timeout=120)
        except redis.RedisError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=block)
    with socket.create_connection(("127.0.0.1", proxy.port)) as idle:
        idle.sendall(b"PING\r\n")
        assert _receive(idle, 7) == b"+PONG\r\n"
        waiter.start()
        wait_for(lambda: proxy.seen("BLPOP") == 1, "the BLPOP is on its way to Redis")
        proxy.reset_connections()
        waiter.join(60)  # (liveness only: the BLPOP would run out after 120 s)
        with pytest.raises(ConnectionResetError):
            _receive(idle, 1)
    # Failed by the reset, not ended by the BLPOP running out (that returns, no error).
    assert not waiter.is_alive() and errors and isinstance(errors[0], redis.ConnectionError)
    assert not isinstance(errors[0], redis.TimeoutError)
    assert _through(proxy).ping()  # the proxy still accepts connections
