"""Real Redis topologies on free loopback ports, for tests of Sentinel and Cluster support.

``SentinelSet`` runs a master, one or more replicas and three sentinels; ``ClusterSet`` runs a
cluster of three masters with one replica each. Both start ``redis-server`` processes,
wait until the topology is healthy, and can kill, fail over and restart nodes. Nothing is
written to disk outside one temporary directory per topology (config files, cluster node
files, logs), removed on close. Only redis-py and the standard library are used, so the
harness does not depend on the product code it tests.
"""

from __future__ import annotations

import functools
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

import redis

from afterthought.testing.redis_server import _binary, free_port, listening

HOST = "127.0.0.1"
START_TIMEOUT = 20.0
#: How long a sentinel in TILT mode waits before it acts again (Redis' own constant).
SENTINEL_TILT_SECONDS = 30.0
_POLL = 0.05

# Commands a master executes besides the workload: the harness's own polling and resets,
# replication, and each new connection's set-up. ClusterSet.executed_by_master leaves them
# out (the harness opens a connection per query, so its AUTHs alone would skew counts).
HOUSEKEEPING = frozenset(
    {
        *("info", "cluster|info", "cluster|nodes", "cluster|myid", "config|resetstat"),
        *("replconf", "psync", "sync"),
        *("auth", "hello", "client|setinfo"),
    }
)


def have_redis_server() -> bool:
    """True when ``redis-server`` and ``redis-cli`` are on PATH."""
    return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


def _free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _config_quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _auth(password: str | None) -> str:
    return f":{quote(password, safe='')}@" if password else ""


class _Topology:
    """The processes of one topology, by port: started, killed, restarted, stopped."""

    def __init__(self, kind: str, password: str | None) -> None:
        self._kind = kind
        self.password = password
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._args: dict[int, list[str]] = {}

    @property
    def _dir(self) -> Path:
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"afterthought-{self._kind}-")
        return Path(self._tmp.name)

    def _data_args(self, port: int) -> list[str]:
        args = [
            _binary(),
            "--port",
            str(port),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self._dir),
            # Diskless full syncs wait 5 s by default for more replicas to join the same
            # transfer; here there is only ever one.
            "--repl-diskless-sync-delay",
            "0",
        ]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        return args

    def _log(self, port: int) -> Path:
        return self._dir / f"{port}.log"

    def _spawn(self, port: int, args: list[str]) -> None:
        self._args[port] = args
        # stdout rather than --logfile: errors printed before logging starts (a bad
        # option, a port in use) land in the same file.
        with self._log(port).open("ab") as log:
            self._procs[port] = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )

    def _kill(self, port: int) -> None:
        proc = self._procs.pop(port, None)
        if proc is None:
            raise ValueError(f"no running node on port {port}")
        proc.kill()
        proc.wait()

    def _respawn(self, port: int) -> None:
        if port in self._procs:
            raise ValueError(f"the node on port {port} is running")
        if port not in self._args:
            raise ValueError(f"port {port} is not a node of this topology")
        self._spawn(port, self._args[port])

    def _log_tail(self, port: int, lines: int = 5) -> str:
        try:
            text = self._log(port).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _check_alive(self) -> None:
        for port, proc in self._procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server on port {port} exited with {proc.returncode}:\n"
                    + self._log_tail(port)
                )

    def _wait(
        self,
        what: str,
        check: Callable[[], str | None],
        deadline: float | Callable[[], float],
        logs: Iterable[int] = (),
    ) -> None:
        """Poll ``check`` (None when satisfied, else what is still missing) until it passes;
        RuntimeError naming ``what`` and the last thing missing at the deadline (a time, or
        a function giving it: a wait that may grow), with the
        end of the logs of the nodes on ``logs`` (the directory is gone after close)."""
        while True:
            self._check_alive()
            try:
                problem = check()
            except (redis.RedisError, OSError) as error:
                problem = f"{type(error).__name__}: {error}"
            if problem is None:
                return
            if time.monotonic() > (deadline() if callable(deadline) else deadline):
                tails = "".join(f"\nlog of {port}:\n{self._log_tail(port)}" for port in logs)
                raise RuntimeError(f"{what}: {problem}{tails}")
            time.sleep(_POLL)

    def _wait_up(self, ports: list[int], deadline: float) -> None:
        def check() -> str | None:
            down = [port for port in ports if not listening(HOST, port)]
            if down:
                return f"ports {down} not listening"
            # Whatever listens must be our server: another program that took the port
            # would make everything after this hang or fail obscurely.
            for port in ports:
                with self._client(port) as client:
                    client.ping()
            return None

        self._wait("redis-server did not start", check, deadline)

    def _password_for(self, port: int) -> str | None:
        return self.password

    def _client(self, port: int) -> Any:
        # No CLIENT SETINFO on connect: it would show up in the nodes' command counts.
        return redis.Redis(
            host=HOST,
            port=port,
            password=self._password_for(port),
            decode_responses=True,
            socket_timeout=2,
            socket_connect_timeout=1,
            lib_name=None,
            lib_version=None,
        )

    def _call(self, port: int, *args: str) -> Any:
        with self._client(port) as client:
            return client.execute_command(*args)

    def _info(self, port: int, section: str) -> dict[str, Any]:
        with self._client(port) as client:
            info: dict[str, Any] = client.info(section)
            return info

    def _replica_problem(self, port: int, master: int) -> str | None:
        info = self._info(port, "replication")
        if info.get("role") != "slave" or info.get("master_port") != master:
            return f"node {port} is not a replica of {master} (role {info.get('role')})"
        if info.get("master_link_status") != "up":
            return f"replica {port} is not in sync with {master}"
        return None

    def _start(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        """Start every process and return once the topology is healthy; on failure, stop
        whatever did start and raise RuntimeError."""
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL after 5 s) and remove the directory."""
        procs = list(self._procs.values())
        self._procs.clear()
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + 5
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class SentinelSet(_Topology):
    """``with SentinelSet() as s:`` — a master, ``replicas`` replicas and three sentinels
    (quorum 2) monitoring them as ``service``. Data nodes require ``password`` when one is
    given; the sentinels never do."""

    def __init__(
        self, *, service: str = "afterthought", password: str | None = None, replicas: int = 1
    ) -> None:
        super().__init__("sentinel", password)
        if replicas < 1:
            raise ValueError("a Sentinel set needs at least one replica")
        self._service = service
        ports = _free_ports(1 + replicas + 3)
        self._data_ports = ports[: 1 + replicas]
        self._sentinel_ports = ports[1 + replicas :]

    @property
    def service(self) -> str:
        return self._service

    @property
    def data_ports(self) -> list[int]:
        """The ports of the master and the replicas (which is which changes in failovers)."""
        return list(self._data_ports)

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        return [(HOST, port) for port in self._sentinel_ports]

    @property
    def url(self) -> str:
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinels)
        return f"redis+sentinel://{_auth(self.password)}{hosts}/{quote(self._service, safe='')}/0"

    def _start(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        master, *replicas = self._data_ports
        self._spawn(master, self._data_args(master))
        for replica in replicas:
            self._spawn(replica, [*self._data_args(replica), "--replicaof", HOST, str(master)])
        self._wait_up(self._data_ports, deadline)
        # A sentinel learns of replicas from the master's INFO, which it reads every 10 s:
        # started before the replicas are attached, it would not list them that long.
        for replica in replicas:
            self._wait(
                "the replica did not sync",
                functools.partial(self._replica_problem, replica, master),
                deadline,
                logs=[replica],
            )
        for port in self._sentinel_ports:
            self._spawn(port, [_binary(), str(self._write_sentinel_config(port)), "--sentinel"])
        self._wait_up(self._sentinel_ports, deadline)
        self._wait(
            "the sentinels did not come up",
            lambda: self._sentinels_problem(master, replicas),
            deadline,
            logs=self._sentinel_ports,
        )

    def _write_sentinel_config(self, port: int) -> Path:
        service = self._service
        lines = [
            f"port {port}",
            f"bind {HOST}",
            f"dir {_config_quote(str(self._dir))}",
            "sentinel resolve-hostnames no",
            f"sentinel monitor {service} {HOST} {self._data_ports[0]} 2",
            f"sentinel down-after-milliseconds {service} 1000",
            f"sentinel failover-timeout {service} 3000",
        ]
        if self.password:
            lines.append(f"sentinel auth-pass {service} {_config_quote(self.password)}")
        # Sentinels rewrite their config file as they learn the topology: one file each.
        path = self._dir / f"sentinel-{port}.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    def _password_for(self, port: int) -> str | None:
        return None if port in self._sentinel_ports else self.password

    def _sentinels_problem(self, master: int, replicas: list[int]) -> str | None:
        for port in self._sentinel_ports:
            with self._client(port) as sentinel:
                address = sentinel.sentinel_get_master_addr_by_name(self._service)
                if address is None or address[1] != master:
                    return f"sentinel {port} reports master {address}, not {master}"
                seen = {
                    entry["port"]
                    for entry in sentinel.sentinel_slaves(self._service)
                    if not (entry["is_sdown"] or entry["is_disconnected"])
                }
                missing = sorted(set(replicas) - seen)
                if missing:
                    return f"sentinel {port} does not see the replicas {missing}"
                peers = {
                    entry["port"]
                    for entry in sentinel.sentinel_sentinels(self._service)
                    if not (entry["is_sdown"] or entry["is_disconnected"])
                }
                missing = sorted(set(self._sentinel_ports) - {port} - peers)
                if missing:
                    return f"sentinel {port} does not see the sentinels {missing}"
        return None

    def master_address(self) -> tuple[str, int]:
        """The master's address as the first sentinel that answers reports it."""
        errors = []
        for port in self._sentinel_ports:
            try:
                with self._client(port) as sentinel:
                    address = sentinel.sentinel_get_master_addr_by_name(self._service)
            except redis.RedisError as error:
                errors.append(f"{port}: {error}")
                continue
            if address is not None:
                return str(address[0]), int(address[1])
            errors.append(f"{port}: unknown service {self._service!r}")
        raise RuntimeError(f"no sentinel reports the master ({'; '.join(errors)})")

    def kill_master(self) -> int:
        """SIGKILL the node the sentinels consider the master; return its port."""
        _, port = self.master_address()
        self._kill(port)
        return port

    def freeze_master(self) -> int:
        """SIGSTOP the master (a partition: it keeps its connections and, thawed, serves
        them as master until the sentinels demote it); return its port."""
        _, port = self.master_address()
        self.freeze(port)
        return port

    def freeze(self, port: int) -> None:
        """SIGSTOP the data node on ``port``: it keeps its connections and answers nothing
        (a replica stops acknowledging, and its master lists it until ``repl-timeout``)."""
        self._procs[port].send_signal(signal.SIGSTOP)

    def thaw(self, port: int) -> None:
        self._procs[port].send_signal(signal.SIGCONT)

    def pause_sentinels(self, only: Iterable[tuple[str, int]] | None = None) -> None:
        """SIGSTOP every sentinel (or those at ``only``): they keep their connections and
        answer nothing, and the set stays as it is (a failover under way stops where it
        is) until resumed."""
        for port in self._sentinels_at(only):
            self._procs[port].send_signal(signal.SIGSTOP)

    def resume_sentinels(self, only: Iterable[tuple[str, int]] | None = None) -> None:
        for port in self._sentinels_at(only):
            self._procs[port].send_signal(signal.SIGCONT)

    def _sentinels_at(self, only: Iterable[tuple[str, int]] | None) -> list[int]:
        if only is None:
            return list(self._sentinel_ports)
        ports = [port for _, port in only]
        strangers = sorted(set(ports) - set(self._sentinel_ports))
        if strangers:
            raise ValueError(f"no sentinel of this set on ports {strangers}")
        return ports

    def hand_over(self) -> int:
        """``SENTINEL FAILOVER``: a planned failover, nothing killed; return the old
        master's port."""
        _, port = self.master_address()
        with self._client(self._sentinel_ports[0]) as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", self._service)
        return port

    def wait_failover(self, old_port: int, timeout: float = 20) -> tuple[str, int]:
        """Wait until every sentinel reports the same master other than ``old_port`` and
        that node answers as a master; return its address. A sentinel in TILT (its timer
        ran late: a stalled machine) acts on nothing for ``SENTINEL_TILT_SECONDS``: the
        wait is that much longer once one is seen in it."""
        found: list[int] = []
        tilted: list[bool] = []

        def check() -> str | None:
            reported: list[int | None] = []
            for port in self._sentinel_ports:
                with self._client(port) as sentinel:
                    address = sentinel.sentinel_get_master_addr_by_name(self._service)
                    if not tilted and sentinel.info("sentinel").get("sentinel_tilt"):
                        tilted.append(True)
                        deadline[0] += SENTINEL_TILT_SECONDS
                reported.append(None if address is None else int(address[1]))
            new = reported[0]
            if new is None or new == old_port or any(other != new for other in reported):
                return f"the sentinels report the masters {reported}"
            role = self._info(new, "replication").get("role")
            if role != "master":
                return f"the reported master {new} has the role {role}"
            found.append(new)
            return None

        deadline = [time.monotonic() + timeout]
        self._wait(
            f"no failover from {old_port} within {timeout:g} s",
            check,
            lambda: deadline[0],
            logs=self._sentinel_ports,
        )
        return HOST, found[-1]

    def wait_settled(self, timeout: float = 30) -> None:
        """Wait until every running data node but the master the sentinels report is that
        master's replica, in sync, and every sentinel sees it so: after a handover the old
        master goes on serving as a master until the sentinels demote it (about 10 s), and a
        next ``SENTINEL FAILOVER`` before then is refused."""
        deadline = time.monotonic() + timeout

        def check() -> str | None:
            _, master = self.master_address()
            for port in sorted(set(self._procs) & set(self._data_ports) - {master}):
                problem = self._replica_problem(port, master) or self._sentinels_see_replica(port)
                if problem:
                    return problem
            return None

        self._wait("the set did not settle", check, deadline, logs=self._sentinel_ports)

    def restart(self, port: int, timeout: float = 20) -> None:
        """Start a killed data node again on ``port``. When another node is the master by
        now, it comes back as that node's replica (an emptied old master must not serve
        writes meanwhile) and this returns once it is in sync and every sentinel sees it."""
        if port not in self._data_ports:
            raise ValueError(f"port {port} is not a data node of this set")
        if port in self._procs:
            raise ValueError(f"the node on port {port} is running")
        deadline = time.monotonic() + timeout
        _, master = self.master_address()
        args = self._data_args(port)
        if master != port:
            args += ["--replicaof", HOST, str(master)]
        self._spawn(port, args)
        self._wait_up([port], deadline)
        if master == port:
            return
        self._wait(
            f"the restarted node {port} did not sync",
            lambda: self._replica_problem(port, master),
            deadline,
            logs=[port],
        )
        self._wait(
            f"the sentinels do not see the restarted node {port}",
            lambda: self._sentinels_see_replica(port),
            deadline,
        )

    def _sentinels_see_replica(self, replica: int) -> str | None:
        for port in self._sentinel_ports:
            with self._client(port) as sentinel:
                entries = sentinel.sentinel_slaves(self._service)
            # A fresh entry (the old master, re-added as a replica at the failover) is
            # neither down nor disconnected yet: the link status says it was heard from.
            if not any(
                e["port"] == replica
                and not (e["is_sdown"] or e["is_disconnected"])
                and e.get("master-link-status") == "ok"
                for e in entries
            ):
                return f"sentinel {port} does not see the replica {replica}"
        return None


@dataclass(frozen=True)
class _Node:
    """One line of CLUSTER NODES."""

    id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    has_slots: bool

    @classmethod
    def parse(cls, line: str) -> _Node:
        fields = line.split()
        address = fields[1].split("@")[0].split(",")[0]
        return cls(
            id=fields[0],
            port=int(address.rsplit(":", 1)[1]),
            flags=frozenset(fields[2].split(",")),
            master_id=None if fields[3] == "-" else fields[3],
            has_slots=len(fields) > 8,
        )

    @property
    def is_master(self) -> bool:
        return "master" in self.flags and self.has_slots


class ClusterSet(_Topology):
    """``with ClusterSet() as c:`` — three masters with ``replicas`` replicas each (six
    nodes by default). Every node requires ``password`` when one is given."""

    def __init__(self, *, password: str | None = None, replicas: int = 1) -> None:
        super().__init__("cluster", password)
        self._replicas = replicas
        nodes = 3 * (1 + replicas)
        ports = _free_ports(2 * nodes)
        self._ports = ports[:nodes]
        # An explicit bus port: the default, port + 10000, is past 65535 for ports above
        # 55535, which the kernel hands out as free ones.
        self._bus_ports = dict(zip(ports[:nodes], ports[nodes:], strict=True))
        self._ids: dict[int, str] = {}
        self._masters_beside: dict[int, list[int]] = {}

    @property
    def nodes(self) -> list[int]:
        return list(self._ports)

    @property
    def url(self) -> str:
        hosts = ",".join(f"{HOST}:{port}" for port in self._ports[:3])
        return f"redis+cluster://{_auth(self.password)}{hosts}/0"

    def _start(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        for port in self._ports:
            self._spawn(
                port,
                [
                    *self._data_args(port),
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    str(self._dir / f"nodes-{port}.conf"),
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-port",
                    str(self._bus_ports[port]),
                ],
            )
        self._wait_up(self._ports, deadline)
        self._create(deadline)
        self._ids = {port: str(self._call(port, "CLUSTER", "MYID")) for port in self._ports}
        self._wait(
            "the cluster did not come up",
            lambda: self._health_problem(with_replicas=True),
            deadline,
            logs=self._ports,
        )

    def _create(self, deadline: float) -> None:
        command = ["redis-cli", "--cluster", "create"]
        command += [f"{HOST}:{port}" for port in self._ports]
        command += ["--cluster-replicas", str(self._replicas), "--cluster-yes"]
        if self.password:
            command += ["-a", self.password, "--no-auth-warning"]
        try:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=max(1.0, deadline - time.monotonic()),
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError("redis-cli --cluster create did not finish in time") from None
        if done.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed ({done.returncode}):\n"
                + (done.stdout + done.stderr)[-2000:]
            )

    def _view(self, port: int) -> list[_Node]:
        text = str(self._call(port, "CLUSTER", "NODES"))
        return [_Node.parse(line) for line in text.splitlines() if line.strip()]

    def _any_view(self) -> list[_Node]:
        errors = []
        for port in sorted(self._procs):
            try:
                return self._view(port)
            except redis.RedisError as error:
                errors.append(f"{port}: {error}")
        raise RuntimeError(f"no cluster node answers ({'; '.join(errors) or 'none running'})")

    def masters(self) -> list[int]:
        """Ports of the nodes that own slots, as a running node sees the cluster."""
        return sorted(node.port for node in self._any_view() if node.is_master)

    def replica_of(self, master_port: int) -> int:
        """The port of a running replica of the master on ``master_port``."""
        master_id = self._ids[master_port]
        for node in sorted(self._any_view(), key=lambda node: node.port):
            if node.master_id == master_id and node.port in self._procs:
                return node.port
        raise LookupError(f"the master on port {master_port} has no running replica")

    def commandstats(self, port: int) -> dict[str, int]:
        """Calls per command on ``port`` since the last reset, e.g. ``{"get": 3}``;
        subcommands as ``"cluster|nodes"``."""
        return {
            name.removeprefix("cmdstat_"): int(stats["calls"])
            for name, stats in self._info(port, "commandstats").items()
        }

    def reset_stats(self) -> None:
        """CONFIG RESETSTAT on every running node."""
        for port in self._procs:
            self._call(port, "CONFIG", "RESETSTAT")

    def executed_by_master(self) -> dict[int, int]:
        """Commands executed per current master since the last reset, without the
        ``HOUSEKEEPING`` ones."""
        return {
            port: sum(
                calls for name, calls in self.commandstats(port).items() if name not in HOUSEKEEPING
            )
            for port in self.masters()
        }

    def _health_problem(self, *, with_replicas: bool) -> str | None:
        """None when every running node reports cluster_state:ok, they all agree on which
        nodes own slots, those are running, none of the running nodes is flagged as
        failed, and every running replica is in sync (and, ``with_replicas``, every master
        has one)."""
        running = sorted(self._procs)
        views: dict[int, list[_Node]] = {}
        for port in running:
            if "cluster_state:ok" not in str(self._call(port, "CLUSTER", "INFO")):
                return f"node {port} reports a failed cluster state"
            views[port] = self._view(port)
        masters_seen = {port: {n.port for n in view if n.is_master} for port, view in views.items()}
        masters = masters_seen[running[0]]
        if any(seen != masters for seen in masters_seen.values()):
            return f"the nodes disagree on the masters: {masters_seen}"
        if not masters <= set(running):
            return f"masters {sorted(masters - set(running))} are not running"
        for port, view in views.items():
            failed = [n.port for n in view if n.port in running and "fail" in n.flags]
            if failed:
                return f"node {port} sees running nodes {failed} as failed"
        ports_by_id = {node_id: port for port, node_id in self._ids.items()}
        served = set()
        for node in views[running[0]]:
            if node.port in running and node.master_id is not None:
                master = ports_by_id[node.master_id]
                problem = self._replica_problem(node.port, master)
                if problem:
                    return problem
                served.add(master)
        if with_replicas and not masters <= served:
            return f"masters {sorted(masters - served)} have no replica"
        return None

    def failover(self, master_port: int, timeout: float = 20) -> int:
        """CLUSTER FAILOVER on a replica of ``master_port``; return the replica's port once
        it is the master, the old master is its replica in sync and the cluster is ok."""
        replica = self.replica_of(master_port)
        self._call(replica, "CLUSTER", "FAILOVER")
        asked = [time.monotonic()]

        def check() -> str | None:
            masters = self.masters()
            if replica not in masters or master_port in masters:
                # A manual failover not done in 5 s (its election short of votes, say) is
                # dropped without a word: ask again.
                if time.monotonic() - asked[-1] > 6:
                    self._call(replica, "CLUSTER", "FAILOVER")
                    asked.append(time.monotonic())
                return f"the masters are still {masters} (asked {len(asked)} times)"
            return self._health_problem(with_replicas=True)

        self._wait(
            f"the failover of {master_port} to {replica} did not finish within {timeout:g} s",
            check,
            time.monotonic() + timeout,
            logs=[master_port, replica],
        )
        return replica

    def freeze(self, port: int) -> None:
        """SIGSTOP the node on ``port``: it keeps its connections, and answers nothing
        (a replica stops acknowledging its master's writes) until thawed."""
        self._procs[port].send_signal(signal.SIGSTOP)

    def thaw(self, port: int) -> None:
        self._procs[port].send_signal(signal.SIGCONT)

    def kill_master(self, port: int) -> None:
        """SIGKILL the master on ``port``."""
        if port not in self.masters():
            raise ValueError(f"the node on port {port} is not a master")
        # The heir is whichever master is new after the kill, not a replica listed now:
        # a node's view may not list every replica yet (gossip about the last CLUSTER
        # REPLICATE lags), and an unlisted one can be the one elected.
        self._masters_beside[port] = [master for master in self.masters() if master != port]
        self._kill(port)

    def wait_promoted(self, port: int, timeout: float = 20) -> int:
        """After kill_master(port): wait until a replica of that master owns its slots and
        the running nodes are healthy again; return the new master's port."""
        others = self._masters_beside[port]
        found: list[int] = []

        def check() -> str | None:
            # The killed master itself owns its slots until the failover: not its heir.
            promoted = [m for m in self.masters() if m not in others and m != port]
            if not promoted:
                return f"no replica of {port} is a master yet"
            found.append(promoted[0])
            return self._health_problem(with_replicas=False)

        replicas = [node for node in self._procs if node not in others and node != port]
        self._wait(
            f"no replica of {port} took over within {timeout:g} s",
            check,
            time.monotonic() + timeout,
            logs=replicas,
        )
        return found[-1]

    def restart(self, port: int, timeout: float = 20) -> None:
        """Start a killed node again on ``port`` with its cluster config (a replaced master
        comes back as a replica of its successor); return once the cluster is healthy: with
        every node running again, once every master has its replica (a node's view names
        the returned one a replica some gossip rounds after it answers as healthy)."""
        deadline = time.monotonic() + timeout
        self._respawn(port)
        self._wait_up([port], deadline)
        whole = self._replicas > 0 and set(self._procs) == set(self._ports)
        self._wait(
            f"the cluster did not take the restarted node {port} back",
            lambda: self._health_problem(with_replicas=whole),
            deadline,
            logs=[port],
        )
