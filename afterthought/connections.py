"""Redis clients, for every process, from one URL: the only place one is built.

- ``redis://``, ``rediss://`` (TLS), ``unix://``: one Redis, as redis-py reads the URL.
- ``redis+sentinel://[[user]:password@]host:port[,host:port...]/SERVICE[/DB]`` (TLS:
  ``rediss+sentinel://``): the master of ``SERVICE`` as the sentinels name it, found again
  after a failover. The password is the data nodes'; sentinels that want one of their own
  take ``?sentinel_password=...`` (and ``sentinel_username``).

Redis Cluster URLs are recognised and refused with a reason: the queue's keys do not yet
share hash slots (W10). arq's own Redis may be another one (``ARQ_REDIS_URL``), standalone
or Sentinel. Building a client connects nothing, so it cannot fail a turn; every error
it may raise later is one of :data:`FAILURES`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelManagedSSLConnection as AsyncSentinelSSLConnection
from redis.exceptions import RedisClusterException, RedisError
from redis.sentinel import Sentinel, SentinelManagedSSLConnection

#: What a Redis call may raise when Redis is unreachable, failing over or refusing: the
#: turn path treats all of them alike (Sentinel's ``MasterNotFoundError`` is a
#: ``ConnectionError``; a cluster client's errors are not all ``RedisError``).
FAILURES: tuple[type[Exception], ...] = (RedisError, RedisClusterException, OSError, TimeoutError)

SENTINEL_PORT = 26379
#: What a process waits for one Redis command when it has no tighter budget (workers, the
#: CLI): long enough for any script of ours, short enough that a client stuck on a
#: partitioned master gives up and finds the one the sentinels promoted.
COMMAND_SECONDS = 10.0
_STANDALONE = {"redis", "rediss", "unix"}
_SENTINEL = {"redis+sentinel": False, "rediss+sentinel": True}
_CLUSTER = {"redis+cluster", "rediss+cluster"}


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """What a Redis URL names. Its repr holds no credentials."""

    topology: Literal["standalone", "sentinel"]
    nodes: tuple[tuple[str, int], ...] = ()
    """The sentinels (Sentinel only)."""
    service: str | None = None
    db: int = 0
    tls: bool = False
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    sentinel_auth: dict[str, str] = field(default_factory=dict, repr=False)


def parse(url: str) -> RedisTarget:
    """The target of a URL; ``ValueError`` (never quoting the URL, which may hold a
    password) when it names none."""
    parts = urlsplit(url)
    scheme = parts.scheme
    if scheme in _CLUSTER:
        raise ValueError(
            "Redis Cluster is not supported yet: the queue's keys do not share hash slots; "
            "use one Redis or Sentinel"
        )
    if scheme not in _STANDALONE and scheme not in _SENTINEL:
        raise ValueError(
            "the Redis URL must start with redis://, rediss://, unix://, redis+sentinel:// "
            "or rediss+sentinel://"
        )
    if scheme in _STANDALONE:
        database = parts.path.strip("/")
        if scheme != "unix" and database and not database.isdigit():
            raise ValueError("the Redis URL's database (its path) must be a number")
        try:
            parts.port  # noqa: B018 - raises on a port out of range
        except ValueError:
            raise ValueError("the Redis URL's port must be a number 0-65535") from None
        return RedisTarget("standalone")
    service, _, database = parts.path.strip("/").partition("/")
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
        nodes=tuple(_hosts(parts.netloc.rpartition("@")[2])),
        service=unquote(service),
        db=int(database or 0),
        tls=_SENTINEL[scheme],
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        sentinel_auth={k.removeprefix("sentinel_"): v for k, v in query.items()},
    )


def _hosts(netloc: str) -> list[tuple[str, int]]:
    hosts = []
    for node in netloc.split(","):
        host, port = node, str(SENTINEL_PORT)
        if ":" in node.rpartition("]")[2]:  # a port given (an IPv6 host is in brackets)
            host, _, port = node.rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("a Sentinel URL lists its sentinels as host:port,host:port")
        hosts.append((host, int(port)))
    return hosts


def _timeouts(timeout: float) -> dict[str, Any]:
    # No retry after a timeout: the command may have run (the caller decides what to redo).
    return {"socket_timeout": timeout, "socket_connect_timeout": timeout, "retry_on_timeout": False}


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
        return client_class.from_url(url, **_timeouts(timeout))
    sentinel = AsyncSentinel(list(target.nodes), sentinel_kwargs=_sentinel_kwargs(target, timeout))
    assert target.service is not None
    return sentinel.master_for(
        target.service,
        redis_class=client_class,
        **_master_kwargs(target, timeout, AsyncSentinelSSLConnection),
    )


def connect_sync(url: str, *, timeout: float = COMMAND_SECONDS) -> redis.Redis:
    """The same, blocking (the CLI's checks)."""
    target = parse(url)
    if target.topology == "standalone":
        return redis.Redis.from_url(url, **_timeouts(timeout))
    sentinel = Sentinel(list(target.nodes), sentinel_kwargs=_sentinel_kwargs(target, timeout))
    assert target.service is not None
    return sentinel.master_for(
        target.service, **_master_kwargs(target, timeout, SentinelManagedSSLConnection)
    )


def describe(url: str) -> str:
    """The server a URL names, for messages: never its credentials."""
    target = parse(url)
    if target.topology == "sentinel":
        via = ",".join(f"{host}:{port}" for host, port in target.nodes)
        return f"Redis (Sentinel service {target.service!r} via {via})"
    where = urlsplit(url)
    if where.scheme == "unix":
        return f"Redis at {where.path}"
    return f"Redis at {where.hostname}:{where.port or 6379}"
