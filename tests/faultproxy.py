"""A fault-injecting TCP proxy between Redis clients and a ``redis-server``, for tests and soaks.

It loses replies after Redis ran the command (:meth:`FaultProxy.drop_replies`), loses requests
before Redis sees them (:meth:`FaultProxy.lose_requests`), resets a
connection right after Redis answered (:meth:`FaultProxy.reset_after`), adds latency
(:meth:`FaultProxy.delay`) and resets every open connection (:meth:`FaultProxy.reset_connections`).
Its asyncio loop runs in a daemon thread; every method may be called from any thread.

>>> with FaultProxy("127.0.0.1", server.port) as proxy:    # doctest: +SKIP
...     client = redis.Redis.from_url(proxy.url, socket_timeout=0.3)
...     proxy.drop_replies(1, command="EVALSHA")

To pair each reply with its request it parses RESP both ways (RESP2, and RESP3, which redis-py 8
speaks by default) and matches replies to requests first in, first out per connection; RESP3
pushes pass through unpaired. Limits: commands that answer other than once per request (SUBSCRIBE
and RESP2 pub/sub, MONITOR, CLIENT REPLY OFF/SKIP) break that pairing. A delay is added per chunk
read, so it is a lower bound for each message it holds up.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Literal

Action = Literal["drop", "reset", "lose"]


_LINES = b"+-:_#,("  # RESP2 and RESP3 types of one line
_BLOBS = b"$!="  # length-prefixed strings
_ARRAYS = {ord("*"): 1, ord("~"): 1, ord(">"): 1, ord("%"): 2, ord("|"): 2}  # items per count
_PUSH = ord(">")


def _value_end(buf: bytearray, pos: int) -> int | None:
    """Where the RESP value starting at ``pos`` ends; None if ``buf`` holds only part of it."""
    line_end = buf.find(b"\r\n", pos)
    if line_end < 0:
        return None
    kind = buf[pos]
    if kind in _LINES:
        return line_end + 2
    size = int(buf[pos + 1 : line_end])
    if kind in _BLOBS:
        end = line_end + 2 + size + 2 if size >= 0 else line_end + 2
        return end if len(buf) >= end else None
    if kind not in _ARRAYS:
        raise ValueError(f"not RESP: {bytes(buf[pos : pos + 20])!r}")
    end = line_end + 2
    # A null array (*-1) has no items; an attribute (|) comes with the value it describes.
    for _ in range(size * _ARRAYS[kind] + (kind == ord("|"))):
        found = _value_end(buf, end)
        if found is None:
            return None
        end = found
    return end


def _request(buf: bytearray, pos: int) -> tuple[int, str | None] | None:
    """The end of the request starting at ``pos`` and its command name (None for an empty
    request, which Redis does not answer); None if ``buf`` holds only part of it."""
    if pos >= len(buf):
        return None
    if buf[pos] != ord("*"):  # an inline command: words on one line
        line_end = buf.find(b"\n", pos)
        if line_end < 0:
            return None
        words = bytes(buf[pos:line_end]).split()
        return line_end + 1, words[0].decode(errors="replace").upper() if words else None
    end = _value_end(buf, pos)
    if end is None:
        return None
    if buf.startswith((b"*0\r", b"*-1"), pos):
        return end, None
    name_start = buf.find(b"\r\n", buf.find(b"\r\n", pos) + 2) + 2  # past "*N\r\n$len\r\n"
    name = bytes(buf[name_start : buf.find(b"\r\n", name_start)])
    return end, name.decode(errors="replace").upper()


@dataclass
class _Rule:
    action: Action
    remaining: int | None  # None: until heal()
    command: str | None  # None: any command


@dataclass(eq=False)
class _Conn:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    pending: deque[Action | None] = field(default_factory=deque)  # per request awaiting reply

    def reset(self) -> None:
        sock = self.client.get_extra_info("socket")
        if sock is not None:  # linger 0: close() sends RST, the client fails at once
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.client.transport.abort()
        self.upstream.transport.abort()


class FaultProxy:
    """A TCP proxy to ``upstream_host:upstream_port`` that injects faults on demand."""

    def __init__(
        self, upstream_host: str, upstream_port: int, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host, self.port = host, port
        self.url = ""
        self._lock = threading.Lock()  # guards the fault state below, shared with the loop
        self._rules: list[_Rule] = []
        self._delays = (0.0, 0.0)
        self._faults = 0
        self._seen: Counter[str] = Counter()
        self._conns: set[_Conn] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None

    def start(self) -> FaultProxy:
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="faultproxy", daemon=True)
        self._thread.start()
        server = asyncio.start_server(self._serve, self.host, self.port)
        self._server = asyncio.run_coroutine_threadsafe(server, loop).result(5)
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"redis://{self.host}:{self.port}"
        return self

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(5)
        loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def drop_replies(self, count: int | None = 1, *, command: str | None = None) -> None:
        """Swallows the replies to the next ``count`` requests of ``command`` (any name, any
        case; None: any command) sent on from now on; ``count=None``: all of them until
        :meth:`heal`. Redis still runs them; the client waits for its socket timeout."""
        self._add("drop", count, command)

    def lose_requests(self, count: int | None = 1, *, command: str | None = None) -> None:
        """Swallows the next ``count`` requests of ``command`` themselves: Redis never sees them
        (a request lost on the way); the client waits for its socket timeout."""
        self._add("lose", count, command)

    def reset_after(self, count: int | None = 1, *, command: str | None = None) -> None:
        """Like :meth:`drop_replies`, but resets (RST) the client's connection once Redis has
        answered: the client fails at once with a connection error."""
        self._add("reset", count, command)

    def delay(self, *, requests: float = 0.0, replies: float = 0.0) -> None:
        """Holds each request and each reply back this many seconds (replacing earlier delays)."""
        with self._lock:
            self._delays = (requests, replies)

    def reset_connections(self) -> None:
        """Resets (RST) every open connection now; new ones are accepted as usual."""
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._reset_all(), self._loop).result(5)

    def heal(self) -> None:
        """Clears every fault: pending drops and resets, and delays."""
        with self._lock:
            self._rules.clear()
            self._delays = (0.0, 0.0)

    @property
    def faults(self) -> int:
        """How many replies were dropped or reset, and requests lost, so far."""
        with self._lock:
            return self._faults

    def seen(self, command: str) -> int:
        """How many requests of ``command`` (any case) were sent on to Redis so far."""
        with self._lock:
            return self._seen[command.upper()]

    def _add(self, action: Action, count: int | None, command: str | None) -> None:
        if count is not None and count < 1:
            raise ValueError(f"count must be None or >= 1, got {count}")
        with self._lock:
            self._rules.append(_Rule(action, count, None if command is None else command.upper()))

    def _forwarded(self, name: str) -> Action | None:
        """Counts a request forwarded now and picks the fault its reply gets, if any (or
        ``"lose"``: the request itself is not forwarded, and counted as a fault, not seen)."""
        with self._lock:
            action: Action | None = None
            for rule in self._rules:
                if rule.command in (None, name):
                    if rule.remaining is not None:
                        rule.remaining -= 1
                        if rule.remaining == 0:
                            self._rules.remove(rule)
                    action = rule.action
                    break
            if action == "lose":
                self._faults += 1
            else:
                self._seen[name] += 1
        return action

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        conn = _Conn(writer, up_writer)
        self._conns.add(conn)
        pumps = [
            asyncio.ensure_future(self._requests(conn, reader)),
            asyncio.ensure_future(self._replies(conn, up_reader)),
        ]
        try:  # either side closing ends both
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            self._conns.discard(conn)
            writer.transport.abort()
            up_writer.transport.abort()

    async def _requests(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        buf = bytearray()
        try:
            while data := await reader.read(1 << 16):
                buf += data
                requests: list[tuple[int, int, str | None]] = []
                end = 0
                while (found := _request(buf, end)) is not None:
                    start, (end, name) = end, found
                    requests.append((start, end, name))
                if not requests:
                    continue
                with self._lock:
                    wait = self._delays[0]
                if wait:
                    await asyncio.sleep(wait)
                # Counted and matched to a fault only when sent on: the reply comes after this.
                out = bytearray()
                for start, stop, name in requests:
                    action = self._forwarded(name) if name is not None else None
                    if action == "lose":
                        continue  # never reaches Redis, so no reply to pair
                    if name is not None:
                        conn.pending.append(action)
                    out += buf[start:stop]
                conn.upstream.write(bytes(out))
                del buf[:end]
                await conn.upstream.drain()
        except (OSError, ValueError):
            pass

    async def _replies(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        buf = bytearray()
        try:
            while data := await reader.read(1 << 16):
                buf += data
                out = bytearray()
                pos, reset = 0, False
                while not reset and (end := _value_end(buf, pos)) is not None:
                    # A push (RESP3) answers no request: it passes, paired with nothing.
                    paired = conn.pending and buf[pos] != _PUSH
                    action = conn.pending.popleft() if paired else None
                    if action is None:
                        out += buf[pos:end]
                    else:
                        with self._lock:
                            self._faults += 1
                        reset = action == "reset"
                    pos = end
                del buf[:pos]
                with self._lock:
                    wait = self._delays[1]
                if wait and out:
                    await asyncio.sleep(wait)
                conn.client.write(bytes(out))
                await conn.client.drain()  # replies before the reset still reach the client
                if reset:
                    conn.reset()
                    return
        except (OSError, ValueError):
            pass

    async def _reset_all(self) -> None:
        for conn in list(self._conns):
            conn.reset()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._reset_all()
        # Aborted, every connection's handler ends by itself (cancelling one makes asyncio log).
        handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if handlers:
            await asyncio.wait(handlers, timeout=2)
