"""Redis clients, for every process, from one URL: the only place one is built.

- ``redis://``, ``rediss://`` (TLS), ``unix://``: one Redis, as redis-py reads the URL.
- ``redis+sentinel://[[user]:password@]host:port[,host:port...]/SERVICE[/DB]`` (TLS:
  ``rediss+sentinel://``): the master of ``SERVICE`` as the sentinels name it, found again
  after a failover. The password is the data nodes'; sentinels that want one of their own
  take ``?sentinel_password=...`` (and ``sentinel_username``).

- ``redis+cluster://[[user]:password@]host:port[,host:port...][/0][?option=...]`` (TLS:
  ``rediss+cluster://``): a Redis Cluster, found from any of the startup nodes listed. It
  needs ``redis_shards`` (the queue's keys then share a hash slot per script, W10) and a
  Redis of arq's own, standalone or Sentinel (``ARQ_REDIS_URL``): arq cannot use a cluster.

Building a client connects nothing, so it cannot fail a turn; every error it may raise
later is one of :data:`FAILURES`. A cluster client is returned as the ``Redis`` type the
rest of the code is written against: it answers the same single-slot commands, and the
few places that must act otherwise ask :func:`is_cluster`.

Every asyncio client looks host names up itself (:class:`_Resolved`), in a daemon thread,
within the connect timeout: asyncio's own lookup runs in the event loop's default executor,
which ``asyncio.run`` joins at exit, so a name server that does not answer (10-15 s a
lookup, then a failure) held the agent's exit past ``exit_flush_seconds``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.cluster
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import ClusterPipeline
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSentinelConnection
from redis.asyncio.sentinel import SentinelManagedSSLConnection as AsyncSentinelSSLConnection
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.sentinel import Sentinel, SentinelManagedSSLConnection

#: What a Redis call may raise when Redis is unreachable, failing over or refusing: the
#: turn path treats all of them alike (Sentinel's ``MasterNotFoundError`` is a
#: ``ConnectionError``; a cluster client's errors are not all ``RedisError``: a
#: ``ClusterDownError``, ``TryAgainError`` or ``MovedError`` is, while the client's own
#: checks (keys of several slots, "TTL exhausted" after a storm of redirections) raise a
#: ``RedisClusterException``).
FAILURES: tuple[type[Exception], ...] = (RedisError, RedisClusterException, OSError, TimeoutError)

SENTINEL_PORT = 26379
CLUSTER_PORT = 6379
#: What a process waits for one Redis command when it has no tighter budget (workers, the
#: CLI): long enough for any script of ours, short enough that a client stuck on a
#: partitioned master gives up and finds the one the sentinels promoted.
COMMAND_SECONDS = 10.0
_STANDALONE = {"redis", "rediss", "unix"}
_SENTINEL = {"redis+sentinel": False, "rediss+sentinel": True}
_CLUSTER = {"redis+cluster": False, "rediss+cluster": True}
#: What a Cluster URL may say after ``?``: TLS files and checks, and the client's name.
CLUSTER_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "client_name")
#: What redis-py reads as a URL's ``ssl_cert_reqs`` (anything else fails each connection).
CERT_REQS = ("none", "optional", "required")


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """What a Redis URL names. Its repr holds no credentials."""

    topology: Literal["standalone", "sentinel", "cluster"]
    nodes: tuple[tuple[str, int], ...] = ()
    """The sentinels (Sentinel), or the startup nodes (Cluster)."""
    service: str | None = None
    db: int = 0
    tls: bool = False
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    sentinel_auth: dict[str, str] = field(default_factory=dict, repr=False)
    options: dict[str, str] = field(default_factory=dict, repr=False)
    """A cluster client's options from the URL (:data:`CLUSTER_OPTIONS`)."""


def parse(url: str) -> RedisTarget:
    """The target of a URL; ``ValueError`` (never quoting the URL, which may hold a
    password) when it names none."""
    parts = split_url(url, "the Redis URL")
    scheme = parts.scheme
    if scheme in _CLUSTER:
        return _cluster(parts.netloc, parts.path, parts.query, tls=_CLUSTER[scheme])
    if scheme not in _STANDALONE and scheme not in _SENTINEL:
        raise ValueError(
            "the Redis URL must start with redis://, rediss://, unix://, redis+sentinel://, "
            "rediss+sentinel://, redis+cluster:// or rediss+cluster://"
        )
    if scheme in _STANDALONE:
        database = parts.path.strip("/")
        if scheme != "unix" and database and not database.isdigit():
            raise ValueError("the Redis URL's database (its path) must be a number")
        try:
            parts.port  # noqa: B018 - raises on a port out of range
        except ValueError:
            raise ValueError("the Redis URL's port must be a number 0-65535") from None
        # redis-py would quietly use localhost, and messages would name no server.
        if scheme != "unix" and not parts.hostname:
            raise ValueError(
                "the Redis URL names no host: redis://[[USER]:PASSWORD@]HOST[:PORT]/DB"
            )
        _standalone_options(url)
        return RedisTarget("standalone")
    service, _, database = parts.path.removeprefix("/").rstrip("/").partition("/")
    if not service:
        raise ValueError("a Sentinel URL names the service after the hosts: .../SERVICE[/DB]")
    if database and not database.isdigit():
        raise ValueError("the Sentinel URL's database (after the service) must be a number")
    query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    if set(query) - {"sentinel_password", "sentinel_username"}:
        # Not named: a password with an unescaped '?' in it would be read as one.
        raise ValueError(
            "the Sentinel URL takes only the options sentinel_password and sentinel_username"
        )
    return RedisTarget(
        "sentinel",
        nodes=tuple(_hosts(parts.netloc.rpartition("@")[2], SENTINEL_PORT, "sentinels")),
        service=unquote(service),
        db=int(database or 0),
        tls=_SENTINEL[scheme],
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        sentinel_auth={k.removeprefix("sentinel_"): v for k, v in query.items()},
    )


def _standalone_options(url: str) -> None:
    """Refuses what redis-py would refuse of the URL's options (``?name=value``) only when
    it first connects, failing every turn: a name no connection takes, a value it cannot
    read, an ``ssl_cert_reqs`` that is none of its three. Checked by building the
    connection, which opens nothing."""
    try:
        aioredis.ConnectionPool.from_url(url).make_connection()
    except (TypeError, ValueError, RedisError):
        # Neither name nor value is said: a password with an unescaped '?' in it would be
        # read as an option.
        raise ValueError(
            "the Redis URL's options (after ?) must be ones redis-py takes, with values it "
            f"reads (ssl_cert_reqs: {', '.join(CERT_REQS)}; ssl_ options only in rediss://)"
        ) from None


def split_url(url: str, what: str) -> SplitResult:
    """``url`` split; ``ValueError`` naming ``what``, never the URL, when it cannot be
    (urllib's own errors quote the host part, credentials and all: a character that NFKC
    turns into a separator, such as a full-width ``#``, or a ``[`` left open)."""
    try:
        return urlsplit(url)
    except ValueError:
        raise ValueError(
            f"{what} cannot be read as a URL (an unclosed [, or a character such as a "
            "full-width # that reads as a separator: percent-encode the password)"
        ) from None


def _cluster(netloc: str, path: str, query: str, *, tls: bool) -> RedisTarget:
    if path.strip("/") not in ("", "0"):
        raise ValueError("a Redis Cluster has only database 0 (the Cluster URL's path)")
    options = {name: values[-1] for name, values in parse_qs(query).items()}
    if set(options) - set(CLUSTER_OPTIONS):
        # Not named: a password with an unescaped '?' in it would be read as one.
        raise ValueError(f"the Cluster URL takes only the options {', '.join(CLUSTER_OPTIONS)}")
    if options.get("ssl_cert_reqs", CERT_REQS[-1]) not in CERT_REQS:  # else every turn fails
        raise ValueError(f"the Cluster URL's ssl_cert_reqs must be {', '.join(CERT_REQS)}")
    credentials, _, hosts = netloc.rpartition("@")
    username, _, password = credentials.partition(":")
    return RedisTarget(
        "cluster",
        nodes=tuple(_hosts(hosts, CLUSTER_PORT, "nodes")),
        tls=tls,
        username=unquote(username) or None,
        password=unquote(password) or None,
        options=options,
    )


def _hosts(netloc: str, default_port: int, what: str) -> list[tuple[str, int]]:
    hosts = []
    for node in netloc.split(","):
        host, port = node, str(default_port)
        if ":" in node.rpartition("]")[2]:  # a port given (an IPv6 host is in brackets)
            host, _, port = node.rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            kind = "Sentinel" if what == "sentinels" else "Cluster"
            raise ValueError(f"a {kind} URL lists its {what} as host:port,host:port")
        hosts.append((host, int(port)))
    return hosts


def is_cluster(client: object) -> bool:
    """Whether a client from :func:`connect` (or :func:`connect_sync`) is a cluster's."""
    return isinstance(client, AsyncRedisCluster | redis.RedisCluster)


#: Sentinel promotes no replica whose link to the master has been down for longer than
#: this many times the service's ``down-after-milliseconds``.
PROMOTABLE_LINK_DOWN = 10


@dataclass(frozen=True, slots=True)
class SentinelView:
    """What the sentinels of a service say about its data nodes (:func:`sentinel_view`):
    whom a write must reach before a handover cannot lose it."""

    replicas: frozenset[tuple[str, int]]
    """Every replica a failover could promote: each one a sentinel that answered sees up
    (not down, its link to the master not down too long), and the one a sentinel is
    promoting, however it sees it. A sentinel's own link to a replica being cut does not
    count against it: promoting a replica cuts every sentinel's link to it (the leader
    kills its clients as it sends ``REPLICAOF NO ONE``), and a replica that is gone is
    down after ``down-after-milliseconds``. One that reports itself a master is left out
    only while the set is settled (below): that is an old master not yet demoted, not
    one being promoted."""
    master: tuple[str, int] | None
    """The master, when the set is settled: every sentinel answered, all name the same
    master and none is failing it over. Else None."""
    masters: frozenset[tuple[str, int]] = frozenset()
    """Every node a sentinel that answered names the master, settled or not. A node one
    names that is not the node written to was promoted (or is being): it does not hold
    what that node takes now, whatever the replicas still attached to that node say
    (while a sentinel is silent the view is not settled, and those that switched list
    only the promoted node's followers)."""
    down: frozenset[tuple[str, int]] = frozenset()
    """Replicas no failover can promote now: every sentinel answered, and none of them
    sees the replica up (each that lists it has it down or cut off too long). A master
    lists a frozen replica until its ``repl-timeout`` (60 s); the sentinels drop it
    after ``down-after-milliseconds``, and a write need not wait for it. Empty while any
    sentinel is silent: that one might see it up and lead a failover."""


async def sentinel_view(client: aioredis.Redis) -> SentinelView | None:
    """What the sentinels of a Sentinel client's service say now (None for any other
    client); one of :data:`FAILURES` when no sentinel answers."""
    pool = client.connection_pool
    if not isinstance(pool, AsyncSentinelPool):
        return None
    service = pool.service_name
    sentinels = pool.sentinel_manager.sentinels
    answers = await asyncio.gather(
        *(_sentinel_answer(sentinel, service) for sentinel in sentinels), return_exceptions=True
    )
    heard = [answer for answer in answers if not isinstance(answer, BaseException)]
    if not heard:
        failure = answers[0]
        raise failure if isinstance(failure, Exception) else RedisConnectionError(str(failure))
    masters = {(str(master["ip"]), int(master["port"])) for master, _ in heard}
    settled = (
        len(heard) == len(answers)
        and len(masters) == 1
        and not any("failover_in_progress" in master["flags"].split(",") for master, _ in heard)
    )
    up = [entry for master, entries in heard for entry in entries if _promotable(master, entry)]
    followers = {_address(e) for e in up if e.get("role-reported") == "slave"}
    listed = {_address(entry) for _, entries in heard for entry in entries}
    return SentinelView(
        replicas=frozenset(followers if settled else {_address(e) for e in up}),
        master=next(iter(masters)) if settled else None,
        masters=frozenset(masters),
        down=frozenset(listed - {_address(e) for e in up} if len(heard) == len(answers) else ()),
    )


def _promotable(master: dict[str, Any], entry: dict[str, Any]) -> bool:
    """Whether a sentinel's entry for a replica leaves a failover free to promote it: the
    one it is promoting, or one it has not down (its own link to it cut or not)."""
    if "promoted" in entry["flags"].split(","):
        return True
    # As the sentinels choose: a replica cut off from its master for over ten times the
    # time that makes a master down is never promoted (while that master is up).
    cut_off = entry.get("master-link-down-time", 0) > PROMOTABLE_LINK_DOWN * master.get(
        "down-after-milliseconds", 0
    )
    return not (entry["is_sdown"] or entry["is_odown"] or cut_off)


async def _sentinel_answer(
    sentinel: aioredis.Redis, service: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    master = await sentinel.sentinel_master(service)
    replicas = await sentinel.sentinel_slaves(service)
    return master, replicas


def _address(entry: dict[str, Any]) -> tuple[str, int]:
    return str(entry["ip"]), int(entry["port"])


_LookUp = concurrent.futures.Future[list[tuple[Any, ...]]]
_LOOKUPS: dict[tuple[str, int], _LookUp] = {}
"""The lookups under way, by name and port: connections retried while a name server is
silent share one thread, not one each."""
_LOOKUPS_LOCK = threading.Lock()


def _look_up(host: str, port: int) -> _LookUp:
    with _LOOKUPS_LOCK:
        pending = _LOOKUPS.get((host, port))
        if pending is None:
            pending = _LOOKUPS[host, port] = concurrent.futures.Future()
            pending.set_running_or_notify_cancel()  # a caller giving up cancels nothing
            # A daemon: the process exits without waiting for a lookup nobody needs now.
            threading.Thread(
                target=_resolve, args=(host, port, pending), name="redis-lookup", daemon=True
            ).start()
    return pending


def _resolve(host: str, port: int, pending: _LookUp) -> None:
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        outcome: list[tuple[Any, ...]] | OSError = exc
    else:
        outcome = list(found)
    with _LOOKUPS_LOCK:
        del _LOOKUPS[host, port]
    if isinstance(outcome, OSError):
        pending.set_exception(outcome)
    else:
        pending.set_result(outcome)


def _numeric(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _Resolved(aioredis.Connection):  # type: ignore[misc]
    """A TCP connection (TLS too, through the subclasses below) that looks its host name
    up itself (:func:`_look_up`) and connects to each address found in turn, as asyncio
    would, all within the connect timeout. TLS still names the host: its SNI and the
    certificate check are the name's, not the address's."""

    _address: str | None = None

    async def _connect(self) -> None:
        if _numeric(self.host):
            return await super()._connect()  # type: ignore[no-any-return]
        async with asyncio.timeout(self.socket_connect_timeout):
            found = await asyncio.wrap_future(_look_up(self.host, self.port))
            failure = OSError(f"no address found for {self.host}")
            for address in dict.fromkeys(str(entry[4][0]) for entry in found):
                self._address = address
                try:
                    return await super()._connect()  # type: ignore[no-any-return]
                except OSError as exc:
                    failure = exc
                finally:
                    self._address = None
            raise failure

    def _connection_arguments(self) -> Mapping[str, Any]:
        arguments = dict(super()._connection_arguments())
        if self._address is not None:
            if "ssl" in arguments:
                arguments["server_hostname"] = self.host
            arguments["host"] = self._address
        return arguments


class _ResolvedSSL(_Resolved, aioredis.SSLConnection):  # type: ignore[misc]
    pass


class _ResolvedSentinelManaged(_Resolved, AsyncSentinelConnection):  # type: ignore[misc]
    pass


class _ResolvedSentinelSSL(_Resolved, AsyncSentinelSSLConnection):  # type: ignore[misc]
    pass


#: redis-py's connection classes, by the one of ours that replaces each.
_RESOLVED: dict[type, type] = {
    aioredis.Connection: _Resolved,
    aioredis.SSLConnection: _ResolvedSSL,
    AsyncSentinelConnection: _ResolvedSentinelManaged,
    AsyncSentinelSSLConnection: _ResolvedSentinelSSL,
}


def _resolving(client: aioredis.Redis) -> aioredis.Redis:
    """``client``, its connections (and a Sentinel client's sentinels', a cluster's
    nodes') of :class:`_Resolved`. redis-py builds them of a class it picks from the URL
    or from ``ssl``, and reads it from the pool (node) at each new connection."""
    if isinstance(client, AsyncRedisCluster):
        kwargs = client.connection_kwargs  # the nodes it finds are made with these
        kwargs["connection_class"] = _RESOLVED[kwargs["connection_class"]]
        for node in client.nodes_manager.startup_nodes.values():
            node.connection_class = _RESOLVED[node.connection_class]
        return client
    pool = client.connection_pool
    pool.connection_class = _RESOLVED.get(pool.connection_class, pool.connection_class)
    if isinstance(pool, AsyncSentinelPool):
        for sentinel in pool.sentinel_manager.sentinels:
            _resolving(sentinel)
    return client


def _timeouts(timeout: float) -> dict[str, Any]:
    # No retry after a timeout: the command may have run (the caller decides what to redo).
    return {"socket_timeout": timeout, "socket_connect_timeout": timeout, "retry_on_timeout": False}


class _RunOncePipeline(ClusterPipeline):  # type: ignore[misc]
    """A cluster pipeline sent once. redis-py sends one as many times as the client's
    ``cluster_error_retry_attempts``, and with 0 (ours) not at all (it raises an
    ``UnboundLocalError``); a batch that failed is the caller's to redo, as any command."""

    async def execute(
        self, raise_on_error: bool = True, allow_redirections: bool = True
    ) -> list[Any]:
        stack: list[Any] = self._command_stack
        if not stack:
            return []
        try:
            await self._client.initialize()  # a no-op once the slots are known
            return await self._execute(  # type: ignore[no-any-return]
                self._client,
                stack,
                raise_on_error=raise_on_error,
                allow_redirections=allow_redirections,
            )
        except AttributeError as exc:
            raise lost_connection(exc) from exc
        except BaseException as exc:
            if type(exc) in self.ERRORS_ALLOW_RETRY:  # as redis-py: learn the layout again
                await self._client.aclose()
            raise
        finally:
            stack.clear()


def lost_connection(exc: AttributeError) -> RedisConnectionError:
    """redis-py 5's cluster client lets two commands share a node's connection while one
    of them drops it: the other fails inside redis-py on the dropped socket (``'NoneType'
    object has no attribute 'writelines'``, seen while a master failed over). It is a lost
    connection, and is raised as one, so every caller treats it as a Redis failure (the
    enqueue keeps the message to send again) instead of an unknown bug."""
    return RedisConnectionError(f"connection lost while in use ({type(exc).__name__})")


class _Cluster(AsyncRedisCluster):  # type: ignore[misc]
    """The asyncio cluster client, with pipelines that are sent once, redis-py's own
    failures on a dropped connection raised as the lost connection they are, and the
    nodes it starts from never running out."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._seeds = dict(self.nodes_manager.startup_nodes)
        self._lua: dict[str, str] = {}
        """Each script this client registered, by its SHA1."""

    def register_script(self, script: str | bytes) -> AsyncScript:
        found = super().register_script(script)
        self._lua[found.sha] = script if isinstance(script, str) else script.decode()
        return cast(AsyncScript, found)

    async def initialize(self) -> AsyncRedisCluster:
        if self._initialize:
            # redis-py drops a node from the nodes it starts from whenever a command to it
            # fails, and refills them only once it has found the cluster again: commands
            # failing together while a master fails over can leave none, and the client
            # then never connects again ("at least one reachable node: None", seen in CI).
            # The configured nodes and every node it knew stay candidates.
            known = self.nodes_manager.startup_nodes
            for name, node in (*self._seeds.items(), *self.nodes_manager.nodes_cache.items()):
                known.setdefault(name, node)
        return await super().initialize()

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        super().pipeline(transaction, shard_hint)  # refuses a transaction, as redis-py does
        return _RunOncePipeline(self)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self._sent(*args, **kwargs)
        except NoScriptError:
            lua = self._lua.get(str(args[1])) if str(args[0]).upper() == "EVALSHA" else None
            if lua is None:
                raise
            # A replica promoted in a failover lacks the scripts its master had, and
            # redis-py loads a missing one only on the masters it knows of, which after a
            # failover need not be the one the key moved to: the call failed again and
            # again (seen in CI: 140 messages stuck). EVAL runs it on the key's master and
            # caches it there; "no such script" means it did not run, so none runs twice.
            return await self._sent("EVAL", lua, *args[2:], **kwargs)

    async def _sent(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except AttributeError as exc:
            raise lost_connection(exc) from exc


def _cluster_kwargs(target: RedisTarget, timeout: float) -> dict[str, Any]:
    return {
        "username": target.username,
        "password": target.password,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        # Retrying is the caller's decision, as on one Redis: a command whose reply timed
        # out may have run (a script resent could claim or dead-letter twice). Redirections
        # (MOVED, ASK, TRYAGAIN) are followed all the same: a redirected command never ran.
        "cluster_error_retry_attempts": 0,
        **({"ssl": True} if target.tls else {}),
        **target.options,
    }


def _sentinel_kwargs(target: RedisTarget, timeout: float) -> dict[str, Any]:
    return {**target.sentinel_auth, **_timeouts(timeout), **({"ssl": True} if target.tls else {})}


def _master_kwargs(target: RedisTarget, timeout: float, tls_class: type) -> dict[str, Any]:
    return {
        "db": target.db,
        "username": target.username,
        "password": target.password,
        **_timeouts(timeout),
        # The pool's connections find the master themselves: TLS is their class, not a flag.
        **({"connection_class": tls_class} if target.tls else {}),
    }


def connect(
    url: str,
    *,
    timeout: float = COMMAND_SECONDS,
    client_class: type[aioredis.Redis] = aioredis.Redis,
) -> aioredis.Redis:
    """An asyncio client (connecting on its first command) of ``client_class`` (arq's
    ``ArqRedis`` for its pool). ``timeout``: seconds before any command or connection
    attempt gives up."""
    target = parse(url)
    if target.topology == "standalone":
        return _resolving(client_class.from_url(url, **_timeouts(timeout)))
    if target.topology == "cluster":
        if client_class is not aioredis.Redis:  # arq's: settings keep a cluster from it
            raise ValueError("arq cannot use a Redis Cluster (ARQ_REDIS_URL)")
        cluster = _Cluster(
            startup_nodes=[AsyncClusterNode(host, port) for host, port in target.nodes],
            connection_error_retry_attempts=0,
            **_cluster_kwargs(target, timeout),
        )
        return _resolving(cast(aioredis.Redis, cluster))
    sentinel = AsyncSentinel(list(target.nodes), sentinel_kwargs=_sentinel_kwargs(target, timeout))
    assert target.service is not None
    return _resolving(
        sentinel.master_for(
            target.service,
            redis_class=client_class,
            **_master_kwargs(target, timeout, AsyncSentinelSSLConnection),
        )
    )


def connect_sync(url: str, *, timeout: float = COMMAND_SECONDS) -> redis.Redis:
    """The same, blocking (the CLI's checks)."""
    target = parse(url)
    if target.topology == "standalone":
        return redis.Redis.from_url(url, **_timeouts(timeout))
    if target.topology == "cluster":
        cluster = redis.RedisCluster(
            startup_nodes=[redis.cluster.ClusterNode(host, port) for host, port in target.nodes],
            retry_on_timeout=False,
            **_cluster_kwargs(target, timeout),
        )
        return cast(redis.Redis, cluster)
    sentinel = Sentinel(list(target.nodes), sentinel_kwargs=_sentinel_kwargs(target, timeout))
    assert target.service is not None
    return sentinel.master_for(
        target.service, **_master_kwargs(target, timeout, SentinelManagedSSLConnection)
    )


def describe(url: str) -> str:
    """The server a URL names, for messages: never its credentials."""
    target = parse(url)
    via = ",".join(f"{host}:{port}" for host, port in target.nodes)
    if target.topology == "sentinel":
        return f"Redis (Sentinel service {target.service!r} via {via})"
    if target.topology == "cluster":
        return f"Redis Cluster (via {via})"
    where = urlsplit(url)
    if where.scheme == "unix":
        return f"Redis at {where.path}"
    return f"Redis at {where.hostname}:{where.port or 6379}"
