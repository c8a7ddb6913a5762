"""The identity registry: ADK strings -> backend UUIDs, recorded in Redis.

Zep v4 generates UUIDs and its ``create`` is not idempotent, so provisioning is serialised
per ADK user under a short Redis lock and the result recorded; every later reader (agent
or worker, any process) finds it with one round trip."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass

import redis.asyncio as aioredis

from afterthought.backends.base import MemoryBackend, UserRef
from afterthought.keys import LOCK_TTL_MS, Keys, digest
from afterthought.settings import Settings

# Compare-and-delete: only the holder's token releases the lock.
RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# One command on one key, flagged allow-oom (Redis 7): at maxmemory the worker must still
# provision new threads, or their queues could never drain and free memory.
WRITE_LUA = "#!lua flags=allow-oom\nreturn redis.call(ARGV[1], KEYS[1], unpack(ARGV, 2))"
# KEYS the entry, its guard (the session's pending list; the user's thread set); ARGV
# idle_ms, a command and its arguments. A registry write and the entry's lifetime in one
# step: none while the guard exists with no expiry (messages of theirs wait, and the queue
# scripts' ``keep`` holds it so), else ``idle_ms`` (docs/DESIGN.md, "Key lifetimes").
ENTRY_LUA = """
redis.call(ARGV[2], KEYS[1], unpack(ARGV, 3))
if redis.call('PTTL', KEYS[2]) == -1 then
  redis.call('PERSIST', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return 1
"""


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
        self, redis: aioredis.Redis, settings: Settings, *, allow_oom: bool = False
    ) -> None:
        """``allow_oom``: provision at ``maxmemory`` too (the worker, on Redis 7)."""
        self._redis = redis
        self._settings = settings
        self._keys = Keys.of(settings)
        self._write = redis.register_script(WRITE_LUA) if allow_oom else None
        self._entry = redis.register_script(
            ("#!lua flags=allow-oom" if allow_oom else "") + ENTRY_LUA
        )
        self._idle_ms = int(settings.idle_ttl_seconds * 1000)
        self._release = redis.register_script(RELEASE_LUA)

    async def _command(self, command: str, key: str, *args: str | int) -> object:
        if self._write is None:
            return await self._redis.execute_command(command, key, *args)
        return await self._write(keys=[key], args=[command, *args])

    async def lookup(self, *, app: str, user_id: str, session_id: str) -> Identity:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(self._keys.user(app, user_id), ["user_uuid", "graph_uuid"])
            pipe.get(self._keys.session(app, user_id, session_id))
            (user_uuid, graph_uuid), thread = await pipe.execute()
        return Identity(
            user=_user_ref(user_uuid, graph_uuid), thread_uuid=thread.decode() if thread else None
        )

    async def lookup_user(self, *, app: str, user_id: str) -> UserRef | None:
        user_uuid, graph_uuid = await self._redis.hmget(
            self._keys.user(app, user_id), ["user_uuid", "graph_uuid"]
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
        user = await self.lookup_user(app=app, user_id=user_id)
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
        user = await self.lookup_user(app=app, user_id=user_id)
        if user is not None:
            return user, False
        user, created = await backend.ensure_user(
            zep_user_id=self._settings.zep_user_id(app=app, user_id=user_id),
            first_name=first_name,
            last_name=last_name,
        )
        await self._entry(
            keys=[self._keys.user(app, user_id), self._keys.user_threads(app, user_id)],
            args=[
                *(self._idle_ms, "HSET"),
                # The ADK ids too, so operations (pruning, forgetting) can walk the users.
                *("user_uuid", user.user_uuid, "graph_uuid", user.graph_uuid),
                *("app", app, "user_id", user_id),
            ],
        )
        return user, created

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
        user = (
            known.user
            or (
                await self.ensure_user(
                    backend, app=app, user_id=user_id, first_name=first_name, last_name=last_name
                )
            )[0]
        )
        # Locked per session, not per user: a user's new sessions are provisioned in parallel.
        async with self._lock(digest(app, user_id, session_id)):
            known = await self.lookup(app=app, user_id=user_id, session_id=session_id)
            if known.thread_uuid is not None:
                return user, known.thread_uuid, False
            # Scoped by the user: two users who pick the same session id get two threads.
            thread_uuid = await backend.create_thread(
                user=user, idempotency_key=f"thread:{digest(app, user_id, session_id)}"
            )
            pending = self._keys.pending(self._keys.thread_ref(app, user_id, session_id))
            await self._entry(
                keys=[self._keys.session(app, user_id, session_id), pending],
                args=[self._idle_ms, "SET", thread_uuid],
            )
            return user, thread_uuid, True

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
        forgetting a person in every app). One SCAN pattern covers every shard's tag
        (``{prefix:s:x}``; a prefix holds no ``:``, so no other deployment's keys match),
        and a cluster client scans each master."""
        k = self._keys
        pattern = f"{{{k.prefix}:*}}:id:user:*" if k.shards else f"{k.prefix}:id:user:*"
        async for key in self._redis.scan_iter(match=pattern, count=1000):
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


def _user_ref(user_uuid: bytes | None, graph_uuid: bytes | None) -> UserRef | None:
    return UserRef(user_uuid.decode(), graph_uuid.decode()) if user_uuid and graph_uuid else None


class _Lock:
    """A short Redis lock (token + expiry, compare-and-delete) that waits its turn."""

    def __init__(self, registry: IdentityRegistry, key: str) -> None:
        self._registry = registry
        self._key = key
        self._token = secrets.token_hex(8)

    async def __aenter__(self) -> None:
        async with asyncio.timeout(LOCK_TTL_MS / 1000 * 2):
            while not await self._registry._command(
                "SET", self._key, self._token, "NX", "PX", LOCK_TTL_MS
            ):
                await asyncio.sleep(0.02)

    async def __aexit__(self, *exc: object) -> None:
        await self._registry._release(keys=[self._key], args=[self._token])
