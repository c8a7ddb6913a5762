"""The identity registry: ADK strings -> backend UUIDs, recorded in Redis.

Zep v4 generates UUIDs and its ``create`` is not idempotent, so provisioning is serialised
per ADK user under a short Redis lock and the result recorded; every later reader (agent
or worker, any process) finds it with one round trip."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

from afterthought.backends.base import BackendError, MemoryBackend, UserRef
from afterthought.keys import LOCK_TTL_MS, MAPPED_FIELD, Keys, digest
from afterthought.settings import Settings

log = logging.getLogger("afterthought.identity")

# Compare-and-delete: only the holder's token releases the lock.
RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# One command on one key, flagged allow-oom (Redis 7): at maxmemory the worker must still
# provision new threads, or their queues could never drain and free memory.
WRITE_LUA = "#!lua flags=allow-oom\nreturn redis.call(ARGV[1], KEYS[1], unpack(ARGV, 2))"
# KEYS the entry and its guard (the session's pending list; the user's thread set; none
# for the person); ARGV idle_ms, a command and its arguments. A registry write and the
# entry's lifetime in one step: none while the guard exists with no expiry (messages of
# theirs wait, and the queue scripts' ``keep`` holds it so), else ``idle_ms``
# (docs/DESIGN.md, "Key lifetimes").
_LIFETIME_LUA = """
if KEYS[2] and redis.call('PTTL', KEYS[2]) == -1 then
  redis.call('PERSIST', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return 1
"""
ENTRY_LUA = "\nredis.call(ARGV[2], KEYS[1], unpack(ARGV, 3))" + _LIFETIME_LUA
# KEYS the user's entry and thread set (the guard); ARGV idle_ms, the user's uuid, the
# map's ``mapped`` time ('' leaves it), then field, thread uuid pairs. Sessions into the
# user's map, with the entry's lifetime as ENTRY_LUA gives it, only while the entry is that
# user's: a forget (or an expiry) meanwhile must leave no map without its user, which the
# next user of those ids would take for theirs. A field there stays (a create under the
# session's lock wrote it). 0 when the entry is not the user's.
MAP_LUA = (
    """
if redis.call('HGET', KEYS[1], 'user_uuid') ~= ARGV[2] then return 0 end
for i = 4, #ARGV, 2 do redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], '"""
    + MAPPED_FIELD
    + """', ARGV[3]) end"""
    + _LIFETIME_LUA
)
# Extends a lock its holder's token still holds.
RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

#: The default backend user id of a deployment that had no users when it was recorded: no
#: other deployment (another ``key_prefix``) on the same Zep project or store names one so.
DEPLOYMENT_TEMPLATE = "{deployment}:{user_id}"
#: The default of a deployment that had users before the default was recorded: theirs.
LEGACY_TEMPLATE = "{user_id}"
#: What an entry may say named it (anything else is not a default).
_DEFAULTS = {DEPLOYMENT_TEMPLATE.encode(), LEGACY_TEMPLATE.encode()}
#: Registry entries read per round trip when a deployment's default is first recorded.
SCAN_PAGE = 1000
#: The most threads of one user a rebuild of their map reads (newest first), at a backend
#: call each: a session of an older one goes on in a new thread (logged as truncated).
MAP_REBUILD_THREADS = 500
#: Threads read between two renewals of the locks a rebuild holds.
RENEW_EVERY = 10


@dataclass(frozen=True, slots=True)
class Registered:
    """A user the registry knows: the ADK ids and the backend's."""

    app: str
    user_id: str
    user: UserRef


@dataclass(frozen=True, slots=True)
class Identity:
    """What the registry knows of one ADK session; ``None`` parts are not provisioned yet."""

    user: UserRef | None
    thread_uuid: str | None


class IdentityRegistry:
    def __init__(
        self,
        redis: aioredis.Redis,
        settings: Settings,
        *,
        allow_oom: bool = False,
        rebuilt: Callable[[bool], None] | None = None,
    ) -> None:
        """``allow_oom``: provision at ``maxmemory`` too (the worker, on Redis 7).
        ``rebuilt``: told of each map rebuilt from the backend (whether truncated), for the
        process's metrics."""
        self._rebuilt = rebuilt
        self._redis = redis
        self._settings = settings
        self._keys = Keys.of(settings)
        self._write = redis.register_script(WRITE_LUA) if allow_oom else None
        self._entry = redis.register_script(
            ("#!lua flags=allow-oom" if allow_oom else "") + ENTRY_LUA
        )
        self._idle_ms = int(settings.idle_ttl_seconds * 1000)
        self._map = redis.register_script(("#!lua flags=allow-oom" if allow_oom else "") + MAP_LUA)
        self._release = redis.register_script(RELEASE_LUA)
        self._renew = redis.register_script(RENEW_LUA)
        self._default: str | None = None

    async def _command(self, command: str, key: str, *args: str | int) -> object:
        if self._write is None:
            return await self._redis.execute_command(command, key, *args)
        return await self._write(keys=[key], args=[command, *args])

    async def backend_user_id(self, *, app: str, user_id: str) -> str:
        """The backend's id of the ADK user: by ``zep_user_id_template``, else by the
        deployment's default (read from Redis once, recorded if it is the first to ask)."""
        template = self._settings.zep_user_id_template or await self._default_template()
        return self._settings.zep_user_id(app=app, user_id=user_id, template=template)

    async def _default_template(self) -> str:
        if self._default is None:
            self._default = await default_template(self._redis, self._settings)
        return self._default

    async def lookup(self, *, app: str, user_id: str, session_id: str) -> Identity:
        """The session's identity; the user as the app has them, else (one person in every
        app) as another app of the deployment has them."""
        field = self._keys.thread_field(app, user_id, session_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(self._keys.user(app, user_id), ["user_uuid", "graph_uuid", field])
            pipe.get(self._keys.session(app, user_id, session_id))
            (user_uuid, graph_uuid, mapped), entry = await pipe.execute()
        user = _user_ref(user_uuid, graph_uuid) or await self._person(user_id)
        thread = mapped or entry  # the user's map, else the session's entry of before it
        return Identity(user=user, thread_uuid=thread.decode() if thread else None)

    async def lookup_user(self, *, app: str, user_id: str) -> UserRef | None:
        """The user as the app has them, else as another app of the deployment has them
        (with a template without ``{app}``: one person in every app)."""
        return await self._registered(app, user_id) or await self._person(user_id)

    async def _registered(self, app: str, user_id: str) -> UserRef | None:
        """The user as the registry maps them in this app."""
        user_uuid, graph_uuid = await self._redis.hmget(
            self._keys.user(app, user_id), ["user_uuid", "graph_uuid"]
        )
        return _user_ref(user_uuid, graph_uuid)

    async def _person(self, user_id: str) -> UserRef | None:
        """The person a user id names in every app, as any app registered them; None when
        the template keeps apps apart."""
        if self._settings.apps_apart:
            return None
        user_uuid, graph_uuid = await self._redis.hmget(
            self._keys.person(user_id), ["user_uuid", "graph_uuid"]
        )
        return _user_ref(user_uuid, graph_uuid)

    async def ensure_user(
        self,
        backend: MemoryBackend,
        *,
        app: str,
        user_id: str,
        first_name: str | None = None,
        last_name: str | None = None,
    ) -> tuple[UserRef, bool]:
        """The user, created once across processes; True if this call created it."""
        user = await self._registered(app, user_id)
        if user is not None:
            return user, False
        async with self._lock(digest(app, user_id)):
            return await self._ensure_user_locked(backend, app, user_id, first_name, last_name)

    async def _ensure_user_locked(
        self,
        backend: MemoryBackend,
        app: str,
        user_id: str,
        first_name: str | None,
        last_name: str | None,
    ) -> tuple[UserRef, bool]:
        user = await self._registered(app, user_id)
        if user is not None:
            return user, False
        # A forget that begins while the backend is asked deletes the user it answers with,
        # and may have walked the registry before this app's entry is in it: its forget
        # times, read before and after the writes, say whether one began.
        began = await self._forget_times(app, user_id)
        # Another app's registration of the person saves the backend a call; either way
        # this app records them, so what walks the registry (a forget) finds this app too.
        user, created = await self._person(user_id), False
        if user is None:
            user, created = await backend.ensure_user(
                zep_user_id=await self.backend_user_id(app=app, user_id=user_id),
                first_name=first_name,
                last_name=last_name,
            )
        # The deployment's default too, when it names them: a lost ``user-ids`` record is
        # read back from the entries (``default_template``), not taken for an old registry.
        named = (
            ()
            if self._settings.zep_user_id_template
            else ("default", await self._default_template())
        )
        # A user the backend did not have has no thread anywhere: their map is whole.
        whole = (MAPPED_FIELD, await self._redis_ms()) if created else ()
        await self._entry(
            keys=[self._keys.user(app, user_id), self._keys.user_threads(app, user_id)],
            args=[
                *(self._idle_ms, "HSET"),
                # The ADK ids too, so operations (pruning, forgetting) can walk the users.
                *("user_uuid", user.user_uuid, "graph_uuid", user.graph_uuid),
                *("app", app, "user_id", user_id, *named, *whole),
            ],
        )
        await self._keep_person(user_id, user)
        if await self._forget_times(app, user_id) != began:
            await self._redis.delete(self._keys.user(app, user_id))
            await self._redis.delete(self._keys.person(user_id))  # untagged: on its own
            # The backend's answer is the forgotten user, or them made again after the
            # forget deleted them (the backend has no fence): gone either way.
            try:
                await backend.delete_user(user=user)
            except BackendError:
                # Left in the backend: the forget is recorded pending again, so a worker's
                # sweep deletes them by their backend user id, and ``status`` counts it.
                from afterthought.forget_marks import reopen  # it imports the queue: late

                await reopen(self._redis, self._settings, app=app, user_id=user_id)
            # Transient: a retry provisions whoever speaks after the forget afresh.
            raise BackendError("unavailable", code="forgotten_meanwhile")
        return user, created

    async def _forget_times(self, app: str, user_id: str) -> list[bytes | None]:
        """When the user (and their person, one in every app) was last forgotten; each key
        read on its own (the person's is untagged)."""
        times = [await self._redis.get(self._keys.forgot(app, user_id))]
        if not self._settings.apps_apart:
            times.append(await self._redis.get(self._keys.forgot_person(user_id)))
        return times

    async def _keep_person(self, user_id: str, user: UserRef) -> None:
        """Records the person for every app, for ``idle_ttl_seconds`` from now: each new
        thread of theirs renews it, and once it has expired a lookup falls back to the
        backend, whose user id is the same."""
        if not self._settings.apps_apart:
            await self._entry(
                keys=[self._keys.person(user_id)],
                args=[self._idle_ms, "HSET", *itertools.chain(*_fields(user).items())],
            )

    async def ensure_thread(
        self,
        backend: MemoryBackend,
        *,
        app: str,
        user_id: str,
        session_id: str,
        first_name: str | None = None,
        last_name: str | None = None,
    ) -> tuple[UserRef, str, bool]:
        """The session's thread (and its user), created once across processes; True if
        this call created the thread. Threads are created with a stable idempotency key
        too, for a retry after a lost reply."""
        known = await self.lookup(app=app, user_id=user_id, session_id=session_id)
        if known.user and known.thread_uuid:
            return known.user, known.thread_uuid, False
        # Not ``known.user``: one found under their person is recorded in this app first.
        user, _ = await self.ensure_user(
            backend, app=app, user_id=user_id, first_name=first_name, last_name=last_name
        )
        # Locked per session, not per user: a user's new sessions are provisioned in parallel.
        async with self._lock(digest(app, user_id, session_id)) as held:
            known = await self.lookup(app=app, user_id=user_id, session_id=session_id)
            if known.thread_uuid is not None:
                return user, known.thread_uuid, False
            if not backend.capabilities.replays_thread_creates and await self._rebuild(
                backend, app, user_id, user, held
            ):
                known = await self.lookup(app=app, user_id=user_id, session_id=session_id)
                if known.thread_uuid is not None:
                    return user, known.thread_uuid, False
            # Scoped by the deployment and the user: two users who pick the same session id
            # get two threads, and so do two deployments on one store (whose keys are not
            # scoped by the backend's user, unlike Zep's).
            thread_uuid = await backend.create_thread(
                user=user,
                idempotency_key=f"thread:{digest(self._keys.prefix, app, user_id, session_id)}",
            )
            await self._record_threads(
                app, user_id, user, {self._keys.session_tag(app, user_id, session_id): thread_uuid}
            )
            await self._keep_person(user_id, user)
            return user, thread_uuid, True

    async def _rebuild(
        self, backend: MemoryBackend, app: str, user_id: str, user: UserRef, held: _Lock
    ) -> bool:
        """Rebuilds the user's map from the backend if it may be missing threads (not
        whole since Redis last went back: ``MAPPED_FIELD``), once: under the user's own
        lock, so their other sessions wait for it rather than create a thread it would have
        found; ``held`` (the session's lock) is renewed with it. True if it ran (by this
        call or another's meanwhile)."""
        if await self._whole(app, user_id):
            return False
        async with self._lock(f"map:{digest(app, user_id)}") as building:
            if await self._whole(app, user_id):
                return True
            since = await self._redis_ms()  # before the read: what is made after it is new
            found: dict[str, str] = {}
            read, truncated = 0, False
            async with contextlib.aclosing(backend.session_threads(user=user)) as threads:
                async for thread_uuid, tag in threads:
                    if read == MAP_REBUILD_THREADS:
                        truncated = True
                        break
                    read += 1
                    if tag is not None:
                        found[tag] = thread_uuid  # newest first: a session's first thread wins
                    if read % RENEW_EVERY == 0:
                        await held.renew()
                        await building.renew()
            await self._record_threads(app, user_id, user, found, mapped=since)
        if self._rebuilt is not None:
            self._rebuilt(truncated)
        log.warning(
            "thread map rebuilt user=%s threads=%d sessions=%d truncated=%s",
            digest(app, user_id),
            read,
            len(found),
            truncated,
        )
        return True

    async def _whole(self, app: str, user_id: str) -> bool:
        """Whether the user's map holds every thread of theirs: whole since it was made
        (``MAPPED_FIELD``), and Redis has not gone back (``served-by``) since."""
        mapped = await self._redis.hget(self._keys.user(app, user_id), MAPPED_FIELD)
        if mapped is None:
            return False
        served_by = self._keys.served_by(self._keys.shard_of(app, user_id))  # the user's shard
        since = await self._redis.hget(served_by, "since")
        return int(since or 0) <= int(mapped)

    async def _record_threads(
        self,
        app: str,
        user_id: str,
        user: UserRef,
        threads: dict[str, str],
        *,
        mapped: int | None = None,
    ) -> None:
        """Sessions (by tag) and their threads into the user's map (``MAP_LUA``)."""
        pairs = itertools.chain.from_iterable(
            (Keys.tag_field(tag), thread_uuid) for tag, thread_uuid in threads.items()
        )
        recorded = await self._map(
            keys=[self._keys.user(app, user_id), self._keys.user_threads(app, user_id)],
            args=[self._idle_ms, user.user_uuid, "" if mapped is None else mapped, *pairs],
        )
        if not recorded:
            # Forgotten (or expired) since the user was read: a retry provisions afresh.
            raise BackendError("unavailable", code="registry_changed")

    async def _redis_ms(self) -> int:
        """Now by Redis' clock (``served-by``'s ``since`` is by it too)."""
        seconds, micros = await self._redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def ensure(
        self, backend: MemoryBackend, *, app: str, user_id: str, session_id: str
    ) -> tuple[UserRef, str]:
        """What the worker needs before it can send: the user and the session's thread."""
        user, thread_uuid, _ = await self.ensure_thread(
            backend, app=app, user_id=user_id, session_id=session_id
        )
        return user, thread_uuid

    async def users(self) -> AsyncIterator[Registered]:
        """Every user the registry knows, for what walks them all (pruning, synthesis,
        forgetting a person in every app); a cluster client scans each master."""
        async for key in self._redis.scan_iter(match=_users_pattern(self._keys), count=SCAN_PAGE):
            app, user_id, user_uuid, graph_uuid = await self._redis.hmget(
                key, ["app", "user_id", "user_uuid", "graph_uuid"]
            )
            user = _user_ref(user_uuid, graph_uuid)
            if app and user_id and user is not None:
                yield Registered(app.decode(), user_id.decode(), user)

    async def sessions(self, *, app: str, user_id: str) -> list[bytes]:
        """The keys of every session the registry recorded for the user (in the user's
        slot, so a forget deletes them with one command)."""
        head = self._keys.session(app, user_id, "").rpartition(":")[0]
        return [k async for k in self._redis.scan_iter(match=f"{head}:*", count=1000)]

    def _lock(self, name: str) -> _Lock:
        return _Lock(self, self._keys.lock(name))


async def default_template(redis: aioredis.Redis, settings: Settings) -> str:
    """The deployment's default ``zep_user_id_template``, as recorded in Redis; recorded by
    the first process to ask (``SET NX``: every process reads the same): ``{user_id}`` if
    the registry holds users already (a deployment from before the default was recorded
    keeps them), else ``{deployment}:{user_id}``. Recording it indexes those users by
    person too (``Keys.person``), so their other apps read their memory from the first
    turn: one pass over the registry, a page a round trip, once per deployment."""
    keys = Keys.of(settings)
    recorded = await redis.get(keys.user_ids)  # read first: at maxmemory a SET is refused
    if recorded is None:
        had_users, named = await _index_people(redis, settings)
        # Entries that say the default named them: the record was lost, not never written.
        chosen = named or (LEGACY_TEMPLATE if had_users else DEPLOYMENT_TEMPLATE)
        recorded = await redis.set(keys.user_ids, chosen, nx=True, get=True) or chosen.encode()
    return str(recorded.decode())


async def _index_people(redis: aioredis.Redis, settings: Settings) -> tuple[bool, str | None]:
    """Each registered user under their person (unless apps are kept apart); whether there
    was any, and the default an entry says named it (if one does)."""
    keys, found, named = Keys.of(settings), False, None
    page: list[bytes] = []
    async for key in redis.scan_iter(match=_users_pattern(keys), count=SCAN_PAGE):
        page.append(key)
        if len(page) == SCAN_PAGE:
            some, said = await _index_page(redis, settings, page)
            found, named, page = found or some, named or said, []
    if page:
        some, said = await _index_page(redis, settings, page)
        found, named = found or some, named or said
    return found, named


async def _index_page(
    redis: aioredis.Redis, settings: Settings, page: list[bytes]
) -> tuple[bool, str | None]:
    keys = Keys.of(settings)
    async with redis.pipeline(transaction=False) as pipe:
        for key in page:
            pipe.hmget(key, ["user_id", "user_uuid", "graph_uuid", "default"])
        entries = await pipe.execute()
    people = [
        (user_id.decode(), user)
        for user_id, user_uuid, graph_uuid, _ in entries
        if user_id and (user := _user_ref(user_uuid, graph_uuid)) is not None
    ]
    named = next((d.decode() for *_, d in entries if d in _DEFAULTS), None)
    if people and not settings.apps_apart:
        async with redis.pipeline(transaction=False) as pipe:
            for user_id, user in people:
                pipe.hset(keys.person(user_id), mapping=_fields(user))
                pipe.pexpire(keys.person(user_id), int(settings.idle_ttl_seconds * 1000))
            await pipe.execute()
    return bool(people), named


def _users_pattern(keys: Keys) -> str:
    """Every user entry of the deployment: one SCAN pattern covers every shard's tag
    (``{prefix:s:x}``; a prefix holds no ``:``, so no other deployment's keys match)."""
    return f"{{{keys.prefix}:*}}:id:user:*" if keys.shards else f"{keys.prefix}:id:user:*"


def _fields(user: UserRef) -> dict[str, str]:
    """A person's entry."""
    return {"user_uuid": user.user_uuid, "graph_uuid": user.graph_uuid}


def _user_ref(user_uuid: bytes | None, graph_uuid: bytes | None) -> UserRef | None:
    return UserRef(user_uuid.decode(), graph_uuid.decode()) if user_uuid and graph_uuid else None


class _Lock:
    """A short Redis lock (token + expiry, compare-and-delete) that waits its turn."""

    def __init__(self, registry: IdentityRegistry, key: str) -> None:
        self._registry = registry
        self._key = key
        self._token = secrets.token_hex(8)

    async def __aenter__(self) -> _Lock:
        async with asyncio.timeout(LOCK_TTL_MS / 1000 * 2):
            while not await self._registry._command(
                "SET", self._key, self._token, "NX", "PX", LOCK_TTL_MS
            ):
                await asyncio.sleep(0.02)
        return self

    async def renew(self) -> None:
        """Another lifetime, for a holder whose work outlasts one."""
        await self._registry._renew(keys=[self._key], args=[self._token, LOCK_TTL_MS])

    async def __aexit__(self, *exc: object) -> None:
        await self._registry._release(keys=[self._key], args=[self._token])
