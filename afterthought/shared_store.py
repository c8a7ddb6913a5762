"""Agents and workers of a deployment must use one store: a new session's block is what
the worker wrote there. A relative path, another working directory or another machine
silently gives the agent an empty local store of its own; an agent without the workers'
ZEP_API_KEY reads a local store while they write to Zep. So each worker announces its
store in Redis (an id and a description), and an agent compares its own and warns when it
is not among them."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.exceptions import OutOfMemoryError, RedisError

from afterthought.backends.base import MemoryBackend
from afterthought.keys import Keys
from afterthought.settings import Settings, database_address, names_deployment

log = logging.getLogger("afterthought.store")

#: A running worker announces its store this often (a heartbeat)...
ANNOUNCE_EVERY_SECONDS = 10.0
#: ...and an announcement counts this long (three beats: a slow one is not a death), the
#: list expiring with it: a store no worker has used lately is not one an agent should be
#: reading (an old file left behind by last week's deployment), and an agent that checks
#: every ``STORE_RECHECK_SECONDS`` (30 s) warns within a minute of a worker being killed.
ANNOUNCED_SECONDS = 3 * ANNOUNCE_EVERY_SECONDS
#: A deployment that shares users stays in its store's ``Keys.sharing`` set this long after
#: its workers' last heartbeat: what it holds of a person (cached blocks: 7 days; dead
#: letters, quarantine) outlives a week's stop, so a forget elsewhere still sweeps it.
SHARING_SECONDS = 30 * 24 * 3600
#: What to do about two stores, for every message that finds them.
ONE_STORE = (
    "give every worker and agent the same ZEP_API_KEY and ZEP_BASE_URL (Zep), or the same"
    " absolute AFTERTHOUGHT_LOCAL_DB_PATH (local store)"
)


def announced_stores(entries: Mapping[bytes, bytes], *, now: float) -> dict[str, str]:
    """Store id -> description, of the stores workers announced lately (an entry a
    worker)."""
    found = {}
    for raw in entries.values():
        try:
            entry = json.loads(raw)
            if now - float(entry["at"]) <= ANNOUNCED_SECONDS:
                found[str(entry["store"])] = str(entry["path"])
        except (ValueError, KeyError, TypeError):
            continue  # not an announcement of ours: nothing to compare with
    return found


async def store_of(
    settings: Settings, backend: MemoryBackend, *, create: bool = False
) -> tuple[str | None, str] | None:
    """This process's store: its id and a description; None for a backend the application
    built. A local file not there yet has no id (None) unless ``create`` (a worker's); a
    Zep project is told by its URL and a digest of its key (never the key)."""
    from afterthought.backends.local import LocalBackend  # the local adapter, when used
    from afterthought.backends.postgres import PostgresBackend
    from afterthought.backends.zep import ZepBackend

    if isinstance(backend, PostgresBackend):
        return await backend.store_id(), backend.where
    if isinstance(backend, LocalBackend):
        mine = await backend.store_id() if create or backend.path.exists() else None
        return mine, str(backend.path)
    if isinstance(backend, ZepBackend):
        where = zep_address(settings.zep_base_url)
        return _zep_project(settings), f"Zep at {urlsplit(where).hostname}"
    return None


def store_name(settings: Settings) -> str:
    """The store deployments that share users share, from the settings alone (no file is
    opened): what names their shared state (``Keys.forgot_shared``, ``Keys.sharing``).
    ``shared_store`` when set; else a Zep project by its address alone — Zep's API reports
    no project id, and one project has many API keys (one per deployment, a rotation), so
    deployments on one address that share users on one Redis are taken for one project
    (two projects there need a ``shared_store`` each); else a local store by its path,
    symlinks resolved. :func:`announce` tells when two sharing deployments on one store
    name it differently."""
    if settings.shared_store is not None:
        return f"named:{settings.shared_store}"
    if settings.resolved_backend == "zep":
        return f"zep:{zep_address(settings.zep_base_url)}"
    if settings.resolved_backend == "postgres" and settings.database_url is not None:
        # Host and port as they always were, then the path as given (the names of their
        # shared state must not change under deployments that share users).
        url = settings.database_url.get_secret_value()
        hosts = database_address(url).hosts
        where = ",".join(f"{host}:{port}" for host, port in hosts) + urlsplit(url).path
        return f"postgres:{where}/{settings.database_schema}"
    return f"local:{_resolved(settings.local_db_path)}"


@functools.cache
def _resolved(path: Path) -> Path:
    # Once per path and process: the flush names it for every batch of a sharing user.
    return path.resolve()


def _zep_project(settings: Settings) -> str:
    key = settings.zep_api_key
    secret = key.get_secret_value() if key else ""
    where = zep_address(settings.zep_base_url)
    project = hashlib.sha256(f"{where}\0{secret}".encode()).hexdigest()[:16]
    return f"zep:{project}"


def zep_address(base_url: str | None) -> str:
    """Zep's API address as every spelling of it compares: unset is the SDK's default,
    scheme and host in lower case, a default port and a trailing slash dropped, no
    credentials. An agent that leaves ``ZEP_BASE_URL`` unset and a worker that spells the
    default out use one store."""
    from zep_cloud.environment import ZepEnvironment

    parts = urlsplit(base_url or ZepEnvironment.DEFAULT.value)
    scheme = parts.scheme.lower()
    port = "" if parts.port in (None, {"http": 80, "https": 443}.get(scheme)) else f":{parts.port}"
    host = (parts.hostname or "").lower()
    host = f"[{host}]" if ":" in host else host  # an IPv6 address, bracketed as it was
    return f"{scheme}://{host}{port}{parts.path.rstrip('/')}"


async def announce(
    redis: Redis, settings: Settings, backend: MemoryBackend, *, worker: str
) -> None:
    """The worker's side: its store joins the deployment's list, with the time; an error
    in the log while another worker of the deployment announced another store (its users'
    turns land in two stores, and each agent reads one)."""
    found = await store_of(settings, backend, create=True)
    if found is None:
        return
    store, description = found
    assert store is not None  # created
    key = Keys.of(settings).stores
    entry = json.dumps({"store": store, "path": description, "at": time.time()})
    try:
        others = announced_stores(await redis.hgetall(key), now=time.time())
        # Not a transaction (a cluster client refuses one): a stop between the two leaves
        # the list without its expiry until the next announcement, and a stale entry in it
        # counts for nothing (``announced_stores`` reads its time).
        async with redis.pipeline(transaction=False) as pipe:
            pipe.hset(key, worker, entry)
            pipe.expire(key, int(ANNOUNCED_SECONDS))
            if settings.users_shared:
                sharing = Keys.sharing(store_name(settings))
                pipe.zadd(sharing, {settings.key_prefix: int(time.time() * 1000)})
                pipe.expire(sharing, SHARING_SECONDS)
            await pipe.execute()
        if settings.users_shared:
            await _compare_names(redis, settings, backend, store)
        await _register(redis, settings)  # its own entry lives on (a refusal is said at start)
    except RedisError as exc:  # a full Redis must not keep a worker from draining it
        log.warning("store not announced store=%s error=%s", description, type(exc).__name__)
        return
    others.pop(store, None)
    if others:
        log.error(
            "workers of this deployment use different stores: this=%s others=%s; %s",
            description,
            ",".join(sorted(others.values())),
            ONE_STORE,
        )
    log.debug("store id=%s description=%s", store, description)


async def _compare_names(
    redis: Redis, settings: Settings, backend: MemoryBackend, store: str
) -> None:
    """The store name this deployment shares users under joins the list of the store as
    workers see it (a local store by the id in its file, a Zep project by its address), and
    an error is logged while another sharing deployment there names it differently: a
    forget in one of them would miss what the other holds of the person. Two Zep projects
    at one address, each named by ``shared_store``, are two stores: not an error."""
    from afterthought.backends.zep import ZepBackend

    zep = isinstance(backend, ZepBackend)
    where = f"zep:{zep_address(settings.zep_base_url)}" if zep else store
    key, name, now = Keys.sharing_names(where), store_name(settings), time.time()
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hset(key, settings.key_prefix, json.dumps({"store": name, "at": now}))
        pipe.expire(key, int(ANNOUNCED_SECONDS))
        pipe.hgetall(key)
        *_, entries = await pipe.execute()
    differ = set()
    for prefix, raw in entries.items():
        try:
            entry = json.loads(raw)
            other, at = str(entry["store"]), float(entry["at"])
        except (ValueError, KeyError, TypeError):
            continue  # not an entry of ours
        named = settings.shared_store is not None and other.startswith("named:")
        if other != name and now - at <= ANNOUNCED_SECONDS and not (zep and named):
            differ.add(prefix.decode())
    if differ:
        log.error(
            "deployments that share users on one store name it differently: this=%s (%s) "
            "others=%s; a forget in one misses what the others hold of the person: give each "
            "of them the same AFTERTHOUGHT_SHARED_STORE",
            settings.key_prefix,
            name,
            ",".join(sorted(differ)),
        )


class UnsaidSharing(ValueError):
    """This deployment's default names its backend users as another deployment on its store
    names theirs: they would share users, and neither setting says so."""


#: The refusals a process has logged (said once: a heartbeat or a read finds them again).
_refused: set[str] = set()
# KEYS the store's list of deployments whose user ids name none; ARGV the prefix, said (1 or
# 0), now (ms), the list's lifetime (s). An entry keeps when it was first made: the
# deployment that came first keeps its users.
REGISTER_LUA = """
local since = tonumber(ARGV[3])
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local ok, entry = pcall(cjson.decode, old)
  if ok and type(entry) == 'table' and tonumber(entry.since) then since = tonumber(entry.since) end
end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({said = ARGV[2] == '1', since = since,
  at = tonumber(ARGV[3])}))
redis.call('EXPIRE', KEYS[1], ARGV[4])
return redis.call('HGETALL', KEYS[1])
"""


async def check_sharing(redis: Redis, settings: Settings) -> None:
    """A worker's start: its deployment joins its store's list of deployments whose backend
    user ids name no deployment (``Keys.user_id_sharers``), or leaves it; and is refused
    (:class:`UnsaidSharing`, one line) when its template so is its default — a deployment
    from before the default was ``{deployment}:{user_id}`` — while another deployment that
    came there first (seen within ``SHARING_SECONDS``) names its users so too: its ``ada``
    would be theirs."""
    refusal = await _register(redis, settings)
    if refusal is not None:
        raise UnsaidSharing(refusal)


async def _register(redis: Redis, settings: Settings) -> str | None:
    """:func:`check_sharing`'s registration; the refusal, if any, in words."""
    from afterthought.identity import default_template

    said = settings.zep_user_id_template is not None
    template = settings.zep_user_id_template or await default_template(redis, settings)
    key, mine = Keys.user_id_sharers(store_name(settings)), settings.key_prefix
    if names_deployment(template):
        await redis.hdel(key, mine)
        return None
    now = int(time.time() * 1000)
    try:
        listed = await redis.eval(REGISTER_LUA, 1, key, mine, int(said), now, SHARING_SECONDS)
        entries = dict(zip(listed[::2], listed[1::2], strict=True))
    except OutOfMemoryError:
        entries = await redis.hgetall(key)  # at maxmemory a worker starts all the same
    return None if said else _refusal(entries, mine, template, now)


async def unsaid_sharing(redis: Redis, settings: Settings, template: str) -> str | None:
    """For a reader (an agent) of a deployment named by ``template``: the refusal of
    :func:`check_sharing`, logged once, if its workers are (or would be) refused; a reader
    records nothing."""
    if settings.zep_user_id_template is not None or names_deployment(template):
        return None
    entries = await redis.hgetall(Keys.user_id_sharers(store_name(settings)))
    refusal = _refusal(entries, settings.key_prefix, template, int(time.time() * 1000))
    if refusal is not None and refusal not in _refused:
        _refused.add(refusal)
        log.error(refusal)
    return refusal


def _refusal(entries: Mapping[bytes, bytes], mine: str, template: str, now: int) -> str | None:
    """Why the deployment ``mine``, whose default ``template`` names no deployment, may
    not name its users: the deployments there before it (by when each was first listed;
    one not listed came last) that name theirs so too, seen within ``SHARING_SECONDS``."""
    listed: dict[str, tuple[int, int]] = {}
    for prefix, raw in entries.items():
        try:
            entry = json.loads(raw)
            listed[prefix.decode()] = (int(entry["since"]), int(entry["at"]))
        except (ValueError, KeyError, TypeError):
            continue  # not an entry of ours
    since = listed.get(mine, (now, now))[0]
    first = sorted(
        prefix
        for prefix, (their_since, at) in listed.items()
        if prefix != mine
        and now - at <= SHARING_SECONDS * 1000
        and (their_since, prefix) < (since, mine)
    )
    if not first:
        return None
    return (
        f"deployment {mine} names its backend users {template} by its default (it had users "
        f"before deployments were told apart), as deployment(s) {','.join(first)} on the "
        "same store do: they would share users without saying so; set "
        f"AFTERTHOUGHT_ZEP_USER_ID_TEMPLATE={template} to share them, or "
        "{deployment}:{user_id} to part this one (README, Identity)"
    )


async def sharing_prefixes(redis: Redis, settings: Settings) -> list[str]:
    """The other deployments that share users with this one on its store, as their workers
    announced them within ``SHARING_SECONDS``."""
    since = int((time.time() - SHARING_SECONDS) * 1000)
    found = await redis.zrangebyscore(Keys.sharing(store_name(settings)), since, "+inf")
    return [p.decode() for p in found if p.decode() != settings.key_prefix]


async def announce_forever(
    redis: Redis, settings: Settings, backend: MemoryBackend, *, worker: str
) -> None:
    """A running worker's store stays announced as long as it runs."""
    while True:
        await asyncio.sleep(ANNOUNCE_EVERY_SECONDS)
        await announce(redis, settings, backend, worker=worker)


async def withdraw(redis: Redis, settings: Settings, *, worker: str) -> None:
    """A worker that stops takes its announcement back (one that is killed leaves it to
    expire), so a store nobody writes any more stops counting at once."""
    with contextlib.suppress(RedisError):
        await redis.hdel(Keys.of(settings).stores, worker)


async def elsewhere(redis: Redis, settings: Settings, backend: MemoryBackend) -> list[str] | None:
    """The descriptions of the stores workers announced lately when this process's store
    is not one of them (an empty list when it is, or for a backend the application built;
    None when none was announced)."""
    # First: a local store awaiting an upgrade says so here.
    found = await store_of(settings, backend)
    stored = await redis.hgetall(Keys.of(settings).stores)
    announced = announced_stores(stored, now=time.time())
    if not announced:
        return None
    if found is None or found[0] in announced:
        return []
    return sorted(announced.values())


def cannot_tell(description: str | None) -> str:
    """What a forget (a prune) says where no worker announced a store lately
    (:func:`elsewhere` None): it deletes from its own, which may not be theirs."""
    return (
        f"no worker announced its store in the last {ANNOUNCED_SECONDS:.0f} s, so whether"
        f" this one ({description or 'the backend opened'}) is the one they write cannot be"
        " told: start a worker with these settings and look again"
    )


#: Deployments this process said no worker of (until it sees one): one line a process,
#: however many watch (the callbacks and a memory service are two ``TurnMemory``).
_no_workers_said: set[str] = set()


class StoreWatch:
    """The agent's side, checked now and then for as long as it runs: a warning (and a
    metric) when no worker announced lately — its messages queue and nothing stores them
    — and when the workers use another store than this process. Each is said once, and
    again only after it changed (a worker came, then went); that no worker announced, once
    a process, and only once this watch is ``ANNOUNCED_SECONDS`` old: a worker started
    with the agent may not have announced yet. ``clock``: monotonic seconds."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._found: tuple[str, ...] | None = ("",)  # nothing checked yet
        self._clock = clock
        self._born = clock()

    async def check(self, redis: Redis, settings: Settings, backend: MemoryBackend) -> bool | None:
        """True when the workers use this process's store, False when another, None when no
        worker announced one lately."""
        from afterthought.telemetry import store_problems

        others = await elsewhere(redis, settings, backend)
        found = None if others is None else tuple(others)
        if found is None and self._clock() - self._born < ANNOUNCED_SECONDS:
            return None  # too soon to tell: a worker may not have announced yet
        if found != self._found:
            self._found = found
            if others is not None:
                _no_workers_said.discard(settings.key_prefix)
            if others is None and settings.key_prefix not in _no_workers_said:
                _no_workers_said.add(settings.key_prefix)
                store_problems.add(1, {"problem": "no_workers"})
                log.warning(
                    "no worker of deployment %s announced in the last %d s: its messages "
                    "queue in Redis and nothing stores them; start `afterthought worker` "
                    "with the agent's settings",
                    settings.key_prefix,
                    ANNOUNCED_SECONDS,
                )
            elif others:
                mine = await store_of(settings, backend)
                store_problems.add(1, {"problem": "other_store"})
                log.warning(
                    "agent and worker use different stores: agent=%s worker=%s; %s",
                    mine[1] if mine else "?",
                    ",".join(others),
                    ONE_STORE,
                )
        return None if others is None else not others
