"""The identity registry: ADK strings -> backend UUIDs, recorded in Redis.

Zep v4 generates UUIDs and its ``create`` is not idempotent, so provisioning is serialised
per ADK user under a short Redis lock and the result recorded; every later reader (agent
or worker, any process) finds it with one round trip."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from afterthought.backends.base import BackendError, MemoryBackend, UserRef
from afterthought.context_cache import ContextCache
from afterthought.keys import LOCK_TTL_MS, MAPPED_FIELD, Keys, digest
from afterthought.settings import Settings, deployment_led, names_deployment
from afterthought.shared_store import unsaid_sharing

log = logging.getLogger("afterthought.identity")


class Confirm(Protocol):
    """Runs a registry script as a write that must survive a failover (see
    :class:`IdentityRegistry`)."""

    def __call__(
        self, script: AsyncScript, *, keys: list[str], args: list[Any]
    ) -> Awaitable[Any]: ...


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
# KEYS an entry naming a backend user (the user's, or the person's); ARGV the user's uuid.
# Deleted only while it names that user: one provisioned afresh meanwhile stays.
STALE_LUA = """
if redis.call('HGET', KEYS[1], 'user_uuid') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
#: The field of a registry entry (and a person's) that says which ``zep_user_id_template``
#: named its user, so another one in effect re-derives them (``IdentityRegistry._current``).
TEMPLATE_FIELD = "template"
#: The field of a user's entry listing the backend users a changed template re-derived
#: them away from (JSON, ``[[user_uuid, graph_uuid], ...]``, newest first): their words
#: stay there, and a forget deletes those users too. Bounded: ``MAX_FORMER`` kept.
FORMER_FIELD = "former"
MAX_FORMER = 4
# KEYS a registry entry; ARGV the template that named its user, and the default (or '')
# if that was the deployment's. Says so on an entry that does not (written by a version
# that did not), never making one: an entry gone meanwhile stays gone.
STAMP_LUA = (
    """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSETNX', KEYS[1], '"""
    + TEMPLATE_FIELD
    + """', ARGV[1])
if ARGV[2] ~= '' then redis.call('HSETNX', KEYS[1], 'default', ARGV[2]) end
return 1
"""
)
# Extends a lock its holder's token still holds.
RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

#: Templates the deployment's history keeps (``Keys.user_ids_history``), the ones in effect
#: most lately: a forget asks the backend for the user each names.
MAX_TEMPLATES = 16

# KEYS the history of templates; ARGV how many it keeps, then templates (oldest first).
# Each scored past the newest there (a count, not a clock: processes' clocks differ, and
# two in one millisecond would tie), then the ones in effect least lately go.
NOTE_LUA = """
local top = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local n = tonumber(top[2] or '0')
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], n + i - 1, ARGV[i]) end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[1]) + 1))
return 1
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
        confirm: Confirm | None = None,
    ) -> None:
        """``allow_oom``: provision at ``maxmemory`` too (the worker, on Redis 7).
        ``rebuilt``: told of each map rebuilt from the backend (whether truncated), for the
        process's metrics. ``confirm``: runs the script that records sessions' threads in
        the user's map and returns only once a failover cannot lose the write (the worker's
        ``ThreadQueue.confirmed``): a thread recorded only on an old master is wiped with
        it, and what was stored in it is then in no thread the session's map names."""
        self._rebuilt = rebuilt
        self._confirm = confirm
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
        self._stale = redis.register_script(STALE_LUA)
        self._renew = redis.register_script(RENEW_LUA)
        self._default: str | None = None
        self._noted: set[str] = set()
        """Templates this registry has put in the history (once a process is enough)."""

    async def _command(self, command: str, key: str, *args: str | int) -> object:
        if self._write is None:
            return await self._redis.execute_command(command, key, *args)
        return await self._write(keys=[key], args=[command, *args])

    async def backend_user_id(self, *, app: str, user_id: str) -> str:
        """The backend's id of the ADK user: by ``zep_user_id_template``, else by the
        deployment's default (read from Redis once, recorded if it is the first to ask)."""
        template = await self._in_effect()
        return self._settings.zep_user_id(app=app, user_id=user_id, template=template)

    async def unproven_id(self, *, app: str, user_id: str) -> str | None:
        """The backend user id the template in effect names for the ADK user, when it is
        one that proves nothing by itself: a template without ``{deployment}`` rendering it
        in the shape a ``{deployment}``-led one gives (``{user_id}``'s ``shop:ada`` is
        deployment ``shop``'s ``ada``). Only the registry ties such a backend user to them."""
        template = await self._in_effect()
        rendered = self._settings.zep_user_id(app=app, user_id=user_id, template=template)
        return rendered if not names_deployment(template) and deployment_led(rendered) else None

    async def _in_effect(self) -> str:
        """The template that names the deployment's backend users now."""
        return self._settings.zep_user_id_template or await self._default_template()

    async def _default_template(self) -> str:
        if self._default is None:
            self._default = await default_template(self._redis, self._settings)
        return self._default

    async def _current(
        self, app: str, user_id: str, named: bytes | None, default: bytes | None
    ) -> bool:
        """Whether an entry (or person) recorded as named by ``named`` (``TEMPLATE_FIELD``;
        ``default`` if the deployment's default did) is the user the template in effect
        names: an explicit template wins over what the registry recorded, and an entry of
        another backend user id is re-derived (``_ensure_user_locked``). One that says
        nothing (written by a version that did not) is taken as it is, until a worker
        stamps it (``settle_template``). Reads Redis only for an entry named otherwise than
        by the template in effect."""
        explicit = self._settings.zep_user_id_template
        if named is None or named == (explicit.encode() if explicit else default):
            return True
        now = explicit or self._default or await self._redis.get(self._keys.user_ids)
        if now is None:  # no default recorded yet: nothing named otherwise
            return True
        self._default = self._default or (None if explicit else _text(now))
        return _same_user(self._settings, app, user_id, named, _text(now))

    async def lookup(self, *, app: str, user_id: str, session_id: str) -> Identity:
        """The session's identity; the user as the app has them, else (one person in every
        app) as another app of the deployment has them."""
        field = self._keys.thread_field(app, user_id, session_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(self._keys.user(app, user_id), [*_ENTRY_FIELDS, field])
            pipe.get(self._keys.session(app, user_id, session_id))
            (user_uuid, graph_uuid, named, default, mapped), entry = await pipe.execute()
        user = _user_ref(user_uuid, graph_uuid)
        if user is not None and not await self._current(app, user_id, named, default):
            # Another backend user's, and so are the threads it maps.
            user = mapped = entry = None
        user = user or await self._person(app, user_id)
        thread = mapped or entry  # the user's map, else the session's entry of before it
        return Identity(user=user, thread_uuid=thread.decode() if thread else None)

    async def lookup_user(self, *, app: str, user_id: str) -> UserRef | None:
        """The user as the app has them, else as another app of the deployment has them
        (with a template without ``{app}``: one person in every app)."""
        return await self._registered(app, user_id) or await self._person(app, user_id)

    async def recorded_user(self, *, app: str, user_id: str) -> UserRef | None:
        """The user the registry records for the ADK user (the app's entry, else their
        person's), whichever template named them: what a forget deletes, with the one the
        template in effect names (``lookup_user``) when that is another."""
        people = [] if self._settings.apps_apart else [self._keys.person(user_id)]
        for key in (self._keys.user(app, user_id), *people):
            user = _user_ref(*await self._redis.hmget(key, ["user_uuid", "graph_uuid"]))
            if user is not None:
                return user
        return None

    async def former_users(self, *, app: str, user_id: str) -> list[UserRef]:
        """The backend users the user's entry was re-derived away from (``FORMER_FIELD``),
        newest first."""
        raw = await self._redis.hget(self._keys.user(app, user_id), FORMER_FIELD)
        try:
            return [UserRef(str(u), str(g)) for u, g in json.loads(raw or "[]")]
        except (ValueError, TypeError):
            return []  # not a list of ours: nothing to delete by it

    async def historic_users(
        self, backend: MemoryBackend, *, app: str, user_id: str
    ) -> list[UserRef]:
        """The backend users every other template of the deployment's history names for
        the ADK user, as the backend has them (a call each): their words stay there after
        the template changed, and after their entry, which recorded the old user, expired
        (``idle_ttl_seconds``). Not an id that a template without ``{deployment}`` renders
        in the shape of a ``{deployment}``-led one (``{user_id}``'s ``shop:ada``): that
        existing proves nothing, it may be deployment ``shop``'s ``ada``; the registry
        (``recorded_user``, ``former_users``) is what ties such a user to this one."""
        now = await self._in_effect()
        ids, unproven = [], 0
        for template in await templates(self._redis, self._settings):
            try:
                rendered = self._settings.zep_user_id(app=app, user_id=user_id, template=template)
            except ValueError:  # one this version refuses (a ``%`` in its text) named them
                continue
            if template == now or rendered in ids:
                continue
            if not names_deployment(template) and deployment_led(rendered):
                unproven += 1
                continue
            ids.append(rendered)
        if unproven:
            log.warning(
                "forget user=%s: %d backend user id(s) an earlier template names may be "
                "another deployment's, left (delete by hand if they are this user's)",
                digest(app, user_id),
                unproven,
            )
        found = [await backend.find_user(zep_user_id=i) for i in ids]
        return [u for u in found if u is not None]

    async def named_id(self, *, app: str, user_id: str) -> str | None:
        """The backend user id the template names the user by (it is deterministic), for a
        reader the registry has no entry for (it expired after ``idle_ttl_seconds``): the
        backend still holds their memory under it. Only by a default already recorded (a
        reader records nothing): unrecorded, nobody was named by it (None)."""
        template = self._settings.zep_user_id_template or self._default
        if template is None:
            recorded = await self._redis.get(self._keys.user_ids)
            if recorded is None:
                return None
            template = self._default = recorded.decode()
        if await unsaid_sharing(self._redis, self._settings, template) is not None:
            return None  # that backend user may be another deployment's
        return self._settings.zep_user_id(app=app, user_id=user_id, template=template)

    async def _registered(self, app: str, user_id: str) -> UserRef | None:
        """The user as the registry maps them in this app (if the template in effect
        names them)."""
        return await self._named_user(app, user_id, self._keys.user(app, user_id))

    async def _person(self, app: str, user_id: str) -> UserRef | None:
        """The person a user id names in every app, as any app registered them; None when
        the template keeps apps apart."""
        if self._settings.apps_apart:
            return None
        return await self._named_user(app, user_id, self._keys.person(user_id))

    async def _named_user(self, app: str, user_id: str, key: str) -> UserRef | None:
        user_uuid, graph_uuid, named, default = await self._redis.hmget(key, _ENTRY_FIELDS)
        user = _user_ref(user_uuid, graph_uuid)
        return user if user and await self._current(app, user_id, named, default) else None

    async def drop_stale(self, *, app: str, user_id: str, user: UserRef) -> None:
        """The registry's entries of a backend user that is gone (deleted by a forget in
        another deployment that shares users, or by hand): the user's entry (with their
        map of threads), the person's, and the sessions' of before the map, so the next
        message provisions them afresh. An entry another worker already rewrote for a new
        user stays."""
        await self._stale(keys=[self._keys.user(app, user_id)], args=[user.user_uuid])
        if not self._settings.apps_apart:  # untagged: on its own
            await self._stale(keys=[self._keys.person(user_id)], args=[user.user_uuid])
        sessions = await self.sessions(app=app, user_id=user_id)
        if sessions:
            await self._redis.delete(*sessions)

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
        user, created = await self._person(app, user_id), False
        if user is None:
            template = await self._in_effect()
            if template not in self._noted:  # before the backend can name anyone by it
                await note_templates(
                    self._redis, self._keys, [template], allow_oom=self._write is not None
                )
                self._noted.add(template)
            user, created = await backend.ensure_user(
                zep_user_id=self._settings.zep_user_id(app=app, user_id=user_id, template=template),
                first_name=first_name,
                last_name=last_name,
            )
        # A user the backend did not have has no thread anywhere: their map is whole.
        whole = (MAPPED_FIELD, await self._redis_ms()) if created else ()
        key = self._keys.user(app, user_id)
        former: tuple[str, ...] = ()
        was = await self._redis.hget(key, "user_uuid")
        if was not in (None, user.user_uuid.encode()):
            kept = [u for u in await self.former_users(app=app, user_id=user_id) if u != user]
            old = await self.recorded_user(app=app, user_id=user_id)
            moved = [old, *kept] if old is not None else kept
            pairs = [[u.user_uuid, u.graph_uuid] for u in moved[:MAX_FORMER]]
            former = (FORMER_FIELD, json.dumps(pairs))
            await self._moved(app, user_id)
        await self._entry(
            keys=[key, self._keys.user_threads(app, user_id)],
            args=[
                *(self._idle_ms, "HSET"),
                # The ADK ids too, so operations (pruning, forgetting) can walk the users.
                *("user_uuid", user.user_uuid, "graph_uuid", user.graph_uuid),
                *("app", app, "user_id", user_id, *await self._naming(), *whole, *former),
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

    async def _naming(self) -> tuple[str, ...]:
        """The fields that say what named an entry's user: the template in effect, and the
        deployment's default when it is that (a lost ``user-ids`` record is read back from
        the entries, ``default_template``, not taken for an old registry)."""
        if self._settings.zep_user_id_template:
            return (TEMPLATE_FIELD, self._settings.zep_user_id_template)
        default = await self._default_template()
        return (TEMPLATE_FIELD, default, "default", default)

    async def _moved(self, app: str, user_id: str) -> None:
        """The entry names a backend user the template in effect no longer names (it was
        changed): what it maps is that user's (threads, its sessions' entries of before the
        map, cached blocks), and goes before the entry is written again; their memory
        stays with that user in the backend (README, *Identity*)."""
        sessions = await self.sessions(app=app, user_id=user_id)
        if sessions:
            await self._redis.delete(*sessions)
        await self._redis.delete(self._keys.user(app, user_id))
        await ContextCache(self._settings).invalidate_user(self._redis, app=app, user_id=user_id)
        log.info("user re-derived by zep_user_id_template user=%s", digest(app, user_id))

    async def _forget_times(self, app: str, user_id: str) -> list[bytes | None]:
        """When the user (and their person, one in every app) was last forgotten; each key
        read on its own (the person's is untagged)."""
        from afterthought.forget_marks import person_key  # it imports the queue: late

        times = [await self._redis.get(self._keys.forgot(app, user_id))]
        person = person_key(self._settings, app=app, user_id=user_id)
        if person is not None:
            times.append(await self._redis.get(person))
        return times

    async def _keep_person(self, user_id: str, user: UserRef) -> None:
        """Records the person for every app, for ``idle_ttl_seconds`` from now: each new
        thread of theirs renews it, and each message they say (``ThreadQueue.enqueue``);
        once it has expired a lookup falls back to the backend, whose user id is the same."""
        if not self._settings.apps_apart:
            fields = itertools.chain(*_fields(user).items(), await self._naming())
            await self._entry(
                keys=[self._keys.person(user_id)], args=[self._idle_ms, "HSET", *fields]
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
            if not backend.capabilities.replays_thread_creates:
                # Looked up again even when the map was whole at once: a rebuild may have
                # recorded the session between the lookup above and that check.
                await self._rebuild(backend, app, user_id, user, held)
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
    ) -> None:
        """Rebuilds the user's map from the backend if it may be missing threads (not
        whole since Redis last went back: ``MAPPED_FIELD``), once: under the user's own
        lock, so their other sessions wait for it rather than create a thread it would have
        found; ``held`` (the session's lock) is renewed with it."""
        if await self._whole(app, user_id):
            return
        async with self._lock(f"map:{digest(app, user_id)}") as building:
            if await self._whole(app, user_id):
                return
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
        keys = [self._keys.user(app, user_id), self._keys.user_threads(app, user_id)]
        args = [self._idle_ms, user.user_uuid, "" if mapped is None else mapped, *pairs]
        if self._confirm is None:
            recorded = await self._map(keys=keys, args=args)
        else:
            recorded = await self._confirm(self._map, keys=keys, args=args)
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


async def note_templates(
    redis: aioredis.Redis, keys: Keys, named: list[str], *, allow_oom: bool = False
) -> None:
    """``named`` (oldest first) into the deployment's history of templates as in effect
    now (``Keys.user_ids_history``, :data:`NOTE_LUA`). ``allow_oom``: at ``maxmemory``
    too (a worker that provisions, on Redis 7)."""
    script = ("#!lua flags=allow-oom\n" if allow_oom else "") + NOTE_LUA
    await redis.eval(script, 1, keys.user_ids_history, MAX_TEMPLATES, *named)


async def templates(redis: aioredis.Redis, settings: Settings) -> list[str]:
    """The deployment's history of templates, the one in effect most lately first."""
    return [_text(t) for t in await redis.zrevrange(Keys.of(settings).user_ids_history, 0, -1)]


async def settle_template(redis: aioredis.Redis, settings: Settings) -> int:
    """How many registered users the template in effect names another backend user than
    the one their entry records (re-derived at their next turn: ``IdentityRegistry``);
    0 unless it is another than when a worker last did this (``Keys.user_ids_settled``).
    On the way, an entry that does not say what named its user (written by a version that
    did not) is stamped with the template in effect then. One pass over the registry, a
    page a round trip."""
    keys = Keys.of(settings)
    now = settings.zep_user_id_template or await default_template(redis, settings)
    before = await redis.get(keys.user_ids_settled)
    # In the history, the one settled before as well: it was in effect until now (and a
    # registry of a version without the history names users by it). Written only when the
    # history lacks them: a worker must start at ``maxmemory`` too.
    named = [_text(before), now] if before is not None else [now]
    history = await templates(redis, settings)
    if history[:1] != [now] or not set(named) <= set(history):
        await note_templates(redis, keys, named)
    if before == now.encode():
        return 0
    stamped = _text(before) if before is not None else now  # what older versions named by
    default = stamped if stamped == await default_template(redis, settings) else ""
    cache, moved = ContextCache(settings), 0
    # Persons too (not counted: they hold no ADK ids), or one would name the user that was
    # to an app that has not registered them yet.
    for match in (_users_pattern(keys), keys.people):
        async for page in _pages(redis, match):
            async with redis.pipeline(transaction=False) as pipe:
                for key in page:
                    pipe.hmget(key, ["app", "user_id", TEMPLATE_FIELD])
                entries = await pipe.execute()
            # One round trip a page (``EVAL``: a cluster's pipeline loads no script).
            async with redis.pipeline(transaction=False) as pipe:
                for key, (app, user_id, named) in zip(page, entries, strict=True):
                    if named is None:
                        pipe.eval(STAMP_LUA, 1, key, stamped, default)
                    if not (app and user_id):
                        continue
                    who = {"app": _text(app), "user_id": _text(user_id)}
                    if not _same_user(settings, **who, named=named or stamped.encode(), now=now):
                        moved += 1
                        # Before any agent reads it: the block cached of the user that was.
                        cache.invalidate_user_in(pipe, **who)
                await pipe.execute()
    await redis.set(keys.user_ids_settled, now)  # after the pass: one cut short is done again
    return moved


def _same_user(settings: Settings, app: str, user_id: str, named: bytes, now: str) -> bool:
    """Whether the template that named a user (``named``) and ``now`` name one backend user
    (two templates can: ``{user_id}`` set explicitly is the old default)."""
    then = _text(named)
    if then == now:
        return True
    try:
        was = settings.zep_user_id(app=app, user_id=user_id, template=then)
    except ValueError:  # a template this version refuses (a ``%`` in its text) named them
        return False
    return was == settings.zep_user_id(app=app, user_id=user_id, template=now)


async def _pages(redis: aioredis.Redis, match: str) -> AsyncIterator[list[bytes]]:
    """The keys ``match`` names, :data:`SCAN_PAGE` at a time."""
    page: list[bytes] = []
    async for key in redis.scan_iter(match=match, count=SCAN_PAGE):
        page.append(key)
        if len(page) == SCAN_PAGE:
            yield page
            page = []
    if page:
        yield page


async def _index_people(redis: aioredis.Redis, settings: Settings) -> tuple[bool, str | None]:
    """Each registered user under their person (unless apps are kept apart); whether there
    was any, and the default an entry says named it (if one does)."""
    found, named = False, None
    async for page in _pages(redis, _users_pattern(Keys.of(settings))):
        some, said = await _index_page(redis, settings, page)
        found, named = found or some, named or said
    return found, named


async def _index_page(
    redis: aioredis.Redis, settings: Settings, page: list[bytes]
) -> tuple[bool, str | None]:
    keys = Keys.of(settings)
    async with redis.pipeline(transaction=False) as pipe:
        for key in page:
            pipe.hmget(key, ["user_id", *_ENTRY_FIELDS])
        entries = await pipe.execute()
    # With what says which template named them (a person's is an entry's).
    people = [
        (user_id.decode(), {**_fields(user), **_said(template, default)})
        for user_id, user_uuid, graph_uuid, template, default in entries
        if user_id and (user := _user_ref(user_uuid, graph_uuid)) is not None
    ]
    named = next((d.decode() for *_, d in entries if d in _DEFAULTS), None)
    if people and not settings.apps_apart:
        async with redis.pipeline(transaction=False) as pipe:
            for user_id, fields in people:
                pipe.hset(keys.person(user_id), mapping=fields)
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


#: What a lookup reads of an entry (or a person): the user, and what named them.
_ENTRY_FIELDS = ("user_uuid", "graph_uuid", TEMPLATE_FIELD, "default")


def _said(template: bytes | None, default: bytes | None) -> dict[str, bytes]:
    """The fields of an entry that say what named its user, those it has."""
    return {k: v for k, v in ((TEMPLATE_FIELD, template), ("default", default)) if v}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


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
