"""Redis topologies from local processes, for the topology tests and benchmarks: a Sentinel
group (1 master, 1 replica, 3 sentinels) and a Redis Cluster (3 masters, each with a replica,
made by ``redis-cli --cluster create``). No Docker: every process is a child of this one,
started on free ports and stopped by its pid.

Each starter waits for real readiness, not for a fixed time: sentinels that know each other and
the replica, a cluster whose every node says ``cluster_state:ok`` and whose replicas have
finished their first sync.

>>> with SentinelGroup() as group:                       # doctest: +SKIP
...     client = group.sentinel().master_for(group.service)
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import redis
from helpers import load_factor
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.sentinel import Sentinel

# CI sets it: a machine without the binaries fails the topology tests instead of skipping them.
REQUIRED = bool(os.environ.get("REDISLOCK_REQUIRE_TOPOLOGIES"))
SERVICE = "locks"
DOWN_AFTER_MS = 1000
NODE_TIMEOUT_MS = 1000


def redis_binary() -> str | None:
    """The redis-server on PATH (it runs as a sentinel with ``--sentinel`` too)."""
    return shutil.which("redis-server")


def redis_cli() -> str | None:
    return shutil.which("redis-cli")


def stretched(seconds: float) -> float:
    """``seconds`` on an idle machine, stretched by the load (:func:`load_factor`)."""
    return seconds * load_factor()


PROGRESS_EVERY_S = 0.5


def wait_until(
    condition: Callable[[], object],
    what: str,
    timeout: float = 30,
    *,
    progress: Callable[[], object] | None = None,
    cap: float | None = None,
) -> None:
    """Polls ``condition`` (errors count as not yet) until it holds; raises naming ``what``.

    ``timeout`` is for an idle machine: it is stretched by the load as the wait goes on
    (:func:`load_factor`). With ``progress``, a function that returns what is seen now (a
    replica's sync state, what each node knows), the wait goes on while what is seen keeps
    changing: it times out after ``timeout`` (stretched) with no change, or after ``cap``
    (stretched; 5 times ``timeout`` by default) in all. The error says what was seen last.
    """
    started = time.monotonic()
    changed = started
    limit = 5 * timeout if cap is None else cap
    seen: object = None
    look = started
    last: BaseException | None = None
    while True:
        try:
            if condition():
                return
        except (redis.RedisError, OSError) as exc:
            last = exc
        now = time.monotonic()
        if progress is not None and now >= look:
            look = now + PROGRESS_EVERY_S
            try:
                now_seen = progress()
            except (redis.RedisError, OSError) as exc:
                now_seen = f"({exc!r})"
            if now_seen != seen:
                seen, changed = now_seen, now
        factor = load_factor()
        if progress is None and now - started > timeout * factor:
            raise TimeoutError(
                f"timed out after {now - started:.0f}s (load factor {factor:.1f}) waiting until "
                f"{what} ({last!r})"
            )
        if progress is not None and (
            now - changed > timeout * factor or now - started > limit * factor
        ):
            raise TimeoutError(
                f"timed out after {now - started:.0f}s, {now - changed:.0f}s of them with nothing "
                f"changing (load factor {factor:.1f}), waiting until {what} ({last!r}); "
                f"last seen: {seen}"
            )
        time.sleep(0.02)


def _free_port(*, with_bus: bool = False) -> int:
    """A free loopback port; ``with_bus``: port + 10000 is free too (a cluster node's bus)."""
    for _ in range(500):
        port = random.randint(20000, 30000) if with_bus else 0
        try:
            with socket.socket() as a:
                a.bind(("127.0.0.1", port))
                port = int(a.getsockname()[1])
                if with_bus:
                    with socket.socket() as b:
                        b.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port")


class Process:
    """One redis-server (or sentinel) process of ours, on its own port and directory."""

    def __init__(self, binary: str, port: int, args: list[str], *, cwd: str) -> None:
        self.binary, self.port, self.args, self.cwd = binary, port, args, cwd
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    def start(self) -> Process:
        log = open(Path(self.cwd) / "log.txt", "ab")  # noqa: SIM115 (the child keeps it)
        with log:
            self.popen = subprocess.Popen(
                [self.binary, *self.args], cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, socket_connect_timeout=1, **kwargs)

    def ready(self) -> bool:
        with self.client() as c:
            return bool(c.ping())

    def replication(self) -> str:
        """This server's replication as it sees it, in short: its role and link, its sync and
        offset as a replica, and each replica's state and offset as a master sees it. (Not a
        master's own offset: it moves with every write, whether a replica follows or not.)"""
        with self.client(decode_responses=True) as c:
            info = c.info("replication")
        fields = (
            "role", "master_port", "master_link_status", "master_sync_in_progress",
            "master_sync_read_bytes", "slave_repl_offset",
        )  # fmt: skip
        seen = [f"{k}={info[k]}" for k in fields if k in info]
        for key in sorted(k for k in info if re.fullmatch(r"slave\d+", k)):
            replica = info[key]
            seen.append(f"{key}=:{replica['port']} {replica['state']} offset {replica['offset']}")
        return f":{self.port} " + " ".join(seen)

    def kill(self) -> None:
        """SIGKILL: the process dies at once, as a crashed host would."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self._signal(signal.SIGCONT)  # a paused process cannot exit
            self._signal(signal.SIGTERM)
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
        self.popen.wait()
        self.popen = None

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        if self.popen is not None and self.popen.poll() is None:
            os.kill(self.popen.pid, sig)  # by pid: never by name

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log(self) -> str:
        path = Path(self.cwd) / "log.txt"
        return path.read_text(errors="replace") if path.exists() else ""


class Link:
    """A TCP forwarder between a replica and its master whose link can be cut: while cut, the
    bytes either way are read and thrown away (the connections stay open, as on a network that
    drops packets), so the replica neither gets writes nor acknowledges them."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.cut = threading.Event()
        self.closed = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="link-accept").start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=2)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self.sockets += [client, upstream]
            threading.Thread(
                target=self._pump, args=(client, upstream), daemon=True, name="link-pump"
            ).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self.closed.is_set():
                readable, _, _ = select.select([a, b], [], [], 0.2)
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    if not self.cut.is_set():
                        peers[s].sendall(data)
        except OSError:
            return
        finally:
            a.close()
            b.close()

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept thread; close() does not
        self.listener.close()
        for s in self.sockets:
            s.close()  # (closing a closed socket is fine)


class _Group:
    """What both topologies share: a temporary directory and the processes started in it."""

    def __init__(self, binary: str | None) -> None:
        found = binary or redis_binary()
        if found is None:
            raise RuntimeError("no redis-server on PATH")
        self.binary = found
        self.dir = tempfile.mkdtemp(prefix="redislock-topology-")
        self.processes: list[Process] = []

    def _process(self, name: str, port: int, args: list[str]) -> Process:
        cwd = Path(self.dir) / name
        cwd.mkdir()
        process = Process(self.binary, port, args, cwd=str(cwd))
        self.processes.append(process)
        return process.start()

    def close(self) -> None:
        for process in self.processes:
            process.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self) -> str:
        return "\n".join(f"--- port {p.port}\n{p.log()[-4000:]}" for p in self.processes)


def _server_args(port: int, *extra: str) -> list[str]:
    return [
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        *extra,
    ]


class SentinelGroup(_Group):
    """A master, a replica and three sentinels (quorum 2, down-after 1 s).

    ``cuttable=True`` puts a :class:`Link` between the replica and the master (``link.cut``
    stops replication both ways). Sentinels would "fix" a replica that names another address
    than the master's after ``failover-timeout``; it is long here, so that does not happen
    within a test.
    """

    def __init__(self, binary: str | None = None, *, cuttable: bool = False) -> None:
        super().__init__(binary)
        self.service = SERVICE
        self.cuttable = cuttable
        self.link: Link | None = None
        self.servers: list[Process] = []
        self.sentinels: list[Process] = []

    def start(self) -> SentinelGroup:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        master_port = _free_port()
        master = self._process("master", master_port, _server_args(master_port))
        wait_until(master.ready, "the master answers", 10)
        upstream = master_port
        if self.cuttable:
            self.link = Link(master_port)
            upstream = self.link.port
        replica_port = _free_port()
        replica = self._process(
            "replica",
            replica_port,
            _server_args(replica_port, "--replicaof", "127.0.0.1", str(upstream)),
        )
        self.servers = [master, replica]
        wait_until(
            lambda: self._link_up(replica),
            "the replica synced",
            20,
            progress=lambda: f"{replica.replication()}; {master.replication()}",
        )
        failover_timeout = 60000 if self.cuttable else 10000
        for i in range(3):
            port = _free_port()
            cwd = Path(self.dir) / f"sentinel{i}"
            cwd.mkdir()
            (cwd / "sentinel.conf").write_text(
                f"port {port}\nbind 127.0.0.1\ndaemonize no\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {failover_timeout}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            sentinel = Process(self.binary, port, ["sentinel.conf", "--sentinel"], cwd=str(cwd))
            self.processes.append(sentinel)
            self.sentinels.append(sentinel.start())
        # Sentinels find each other by hello messages every 2 s and the replica in the master's
        # INFO every 10 s: on a loaded machine that can take several rounds. As long as they keep
        # learning, the wait goes on.
        self.unsettled = ""
        wait_until(
            self._settled,
            "the sentinels know each other and the replica",
            60,
            progress=lambda: self.unsettled,
        )

    @staticmethod
    def _link_up(replica: Process) -> bool:
        with replica.client() as c:
            return c.info("replication").get("master_link_status") == "up"

    def _settled(self) -> bool:
        seen = []
        for sentinel in self.sentinels:
            with sentinel.client() as c:
                others = len(c.sentinel_sentinels(self.service))
                replicas = c.sentinel_slaves(self.service)
                flags = [r["flags"] for r in replicas]
                seen.append(f"sentinel :{sentinel.port} knows {others} other(s), replicas {flags}")
                if others != 2 or len(replicas) != 1 or "s_down" in replicas[0]["flags"]:
                    self.unsettled = "; ".join(seen)
                    return False
                c.execute_command("SENTINEL", "CKQUORUM", self.service)
        return True

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", s.port) for s in self.sentinels]

    def sentinel(self, **kwargs: object) -> Sentinel:
        return Sentinel(self.addresses, socket_timeout=1, **kwargs)

    def master_port(self) -> int:
        """The master's port as the sentinels now see it."""
        _, port = self.sentinel().discover_master(self.service)
        return int(port)

    def server(self, port: int) -> Process:
        return next(p for p in self.servers if p.port == port)

    def master(self) -> Process:
        return self.server(self.master_port())

    def replica(self) -> Process:
        master = self.master_port()
        return next(p for p in self.servers if p.port != master)

    def views(self) -> str:
        """Where each sentinel sees the master, with its flags and failover state."""
        seen = []
        for sentinel in self.sentinels:
            try:
                with sentinel.client(decode_responses=True) as c:
                    master = c.sentinel_master(self.service)
                seen.append(
                    f"sentinel :{sentinel.port}: master :{master['port']} {master['flags']} "
                    f"{master.get('failover-state', '')}"
                )
            except redis.RedisError as exc:
                seen.append(f"sentinel :{sentinel.port}: {exc!r}")
        return "; ".join(seen)

    def failover_after_kill(self, timeout: float = 30) -> Process:
        """Kills the master (SIGKILL) and waits until the sentinels promoted the replica and it
        takes writes; returns the new master."""
        old = self.master()
        new = self.replica()
        old.kill()
        wait_until(
            lambda: self.master_port() == new.port,
            "the sentinels promoted the replica",
            timeout,
            progress=self.views,
        )
        wait_until(
            lambda: new.client().info("replication")["role"] == "master",
            "new master",
            timeout,
            progress=new.replication,
        )
        self.servers.remove(old)
        return new

    def close(self) -> None:
        super().close()
        if self.link is not None:
            self.link.close()

    def __enter__(self) -> SentinelGroup:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ClusterGroup(_Group):
    """A Redis Cluster of 3 masters, each with one replica (node timeout 1 s)."""

    def __init__(self, binary: str | None = None, *, masters: int = 3) -> None:
        super().__init__(binary)
        self.masters = masters
        cli = redis_cli()
        if cli is None:
            raise RuntimeError("no redis-cli on PATH")
        self.cli = cli

    def start(self) -> ClusterGroup:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        for i in range(self.masters * 2):
            port = _free_port(with_bus=True)
            self._process(
                f"node{i}",
                port,
                _server_args(
                    port,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    str(NODE_TIMEOUT_MS),
                    # A replica fails over however long its link has been down: the tests kill
                    # masters on a loaded machine.
                    "--cluster-replica-validity-factor",
                    "0",
                ),
            )
        for process in self.processes:
            wait_until(process.ready, f"node {process.port} answers", 10)
        out = subprocess.run(  # (it waits for the nodes to join, checking once a second)
            [
                self.cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{p.port}" for p in self.processes),
                "--cluster-replicas",
                "1",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=stretched(60),
        )
        if out.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout}{out.stderr}")
        wait_until(
            self.settled, "the cluster is ok and every replica synced", 60, progress=self.views
        )

    def views(self) -> str:
        """What each live node says: its cluster state, its role and link, and the masters it
        counts as serving slots."""
        seen = []
        for process in self.processes:
            if not process.alive():
                continue
            try:
                with process.client(decode_responses=True) as c:
                    state = c.execute_command("CLUSTER", "INFO").split()[0]  # cluster_state:..
                    info = c.info("replication")
                    nodes: str = c.execute_command("CLUSTER", "NODES")
            except redis.RedisError as exc:
                seen.append(f":{process.port} {exc!r}")
                continue
            masters = sorted(
                int(fields[1].split("@")[0].split(":")[1])
                for fields in (line.split() for line in nodes.splitlines())
                if "master" in fields[2] and "fail" not in fields[2] and fields[8:]
            )
            link = info.get("master_link_status", "")
            seen.append(f":{process.port} {state} {info['role']} {link} masters {masters}")
        return "; ".join(seen)

    def settled(self) -> bool:
        """Every live node says ok and agrees on the masters; every replica has synced."""
        masters = set()
        for process in self.processes:
            if not process.alive():
                continue
            with process.client() as c:
                if b"cluster_state:ok" not in c.execute_command("CLUSTER", "INFO"):
                    return False
                info = c.info("replication")
                if info["role"] == "slave" and info.get("master_link_status") != "up":
                    return False
                if info["role"] == "master":
                    masters.add(process.port)
        return len(masters) == self.masters and self._views_agree(masters) and self._acked(masters)

    def _acked(self, masters: set[int]) -> bool:
        """Every master's replica acknowledges a write (WAIT on the connection that made it)."""
        for port in masters:
            with self._by_port(port).client() as c:
                slots = c.execute_command("CLUSTER", "SLOTS")
                mine = [(r[0], r[1]) for r in slots if int(r[2][1]) == port]
                key = next(
                    f"probe:{i}"
                    for i in range(100000)
                    if any(a <= key_slot(f"probe:{i}".encode()) <= b for a, b in mine)
                )
                pipe = c.pipeline(transaction=False)
                pipe.incr(key)
                pipe.execute_command("WAIT", 1, 1000)
                if pipe.execute(raise_on_error=False)[-1] != 1:
                    return False
        return True

    def _by_port(self, port: int) -> Process:
        return next(p for p in self.processes if p.port == port)

    def _views_agree(self, masters: set[int]) -> bool:
        for process in self.processes:
            if not process.alive():
                continue
            with process.client(decode_responses=True) as c:
                raw: str = c.execute_command("CLUSTER", "NODES")
            seen = set()
            for line in raw.splitlines():
                fields = line.split()
                if "master" in fields[2] and "fail" not in fields[2] and fields[8:]:
                    seen.add(int(fields[1].split("@")[0].split(":")[1]))
            if seen != masters:
                return False
        return True

    def client(self, **kwargs: object) -> RedisCluster:
        live = next(p for p in self.processes if p.alive())
        return RedisCluster(host="127.0.0.1", port=live.port, **kwargs)

    def node_of(self, key: str) -> Process:
        """The live master that serves ``key`` now."""
        for process in self.processes:
            if not process.alive():
                continue
            with process.client() as c:
                if c.info("replication")["role"] != "master":
                    continue
                slot = c.execute_command("CLUSTER", "KEYSLOT", key)
                for start, end, *nodes in c.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        port = int(nodes[0][1])
                        return next(p for p in self.processes if p.port == port)
        raise LookupError(f"no live master serves {key!r}")

    def replica_of(self, master: Process) -> Process:
        with master.client(decode_responses=True) as c:
            info = c.info("replication")
        port = int(info["slave0"]["port"])
        return next(p for p in self.processes if p.port == port)

    def failover_after_kill(self, master: Process, timeout: float = 60) -> Process:
        """Kills ``master`` (SIGKILL) and waits until its replica took over and the cluster is
        ok again; returns the new master. The dead node is left down."""
        replica = self.replica_of(master)
        master.kill()
        wait_until(
            lambda: replica.client().info("replication")["role"] == "master",
            "the replica took over",
            timeout,
            progress=self.views,
        )

        def ok() -> bool:
            for p in self.processes:
                if p.alive():
                    with p.client() as c:
                        if b"cluster_state:ok" not in c.execute_command("CLUSTER", "INFO"):
                            return False
            return True

        wait_until(ok, "the cluster is ok again", timeout, progress=self.views)
        return replica

    def restart(self, process: Process, timeout: float = 60) -> None:
        """Starts a killed node again (its nodes.conf kept): it rejoins, as a replica of the
        node that took over, and the cluster settles."""
        process.start()
        wait_until(process.ready, f"node {process.port} answers", 10)
        wait_until(
            self.settled, "the cluster settled with the node back", timeout, progress=self.views
        )

    def __enter__(self) -> ClusterGroup:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
