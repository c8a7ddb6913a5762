"""Forgetting: a user (everything), one fact, or the facts matching a query (dry run
unless confirmed). A forgotten user's queued and in-flight messages are dropped (the
deletion epoch), dead letters purged, stored memory, cached blocks and registry entries
deleted; a forgotten fact leaves a tombstone so synthesis cannot write it again."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from afterthought.audit import AuditLog, Entry
from afterthought.backends.base import BackendError, MemoryBackend, UserRef
from afterthought.context_cache import ContextCache
from afterthought.contract import DeadLetter
from afterthought.facts import StoredFact
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys, digest
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings

log = logging.getLogger("afterthought.worker")


@dataclass
class Forgotten:
    """What a forget did (or, in a dry run, would do)."""

    dry_run: bool = False
    users: int = 0
    facts: list[str] = field(default_factory=list)
    """Ids of the facts (to be) deleted."""
    queued: int = 0
    dead_letters: int = 0


class Forgetter:
    def __init__(self, settings: Settings, redis: aioredis.Redis, backend: MemoryBackend) -> None:
        self.settings = settings
        self.redis = redis
        self.backend = backend
        self.keys = Keys(settings.key_prefix)
        self.registry = IdentityRegistry(redis, settings)
        self.cache = ContextCache(settings)
        self.queue = ThreadQueue(redis, settings)
        self.audit = AuditLog(redis, settings)

    async def forget_user(self, *, app: str, user_id: str) -> Forgotten:
        done = Forgotten(users=1)
        await self.redis.incr(self.keys.epoch(app, user_id))  # in-flight batches drop theirs
        threads = {
            t.decode() for t in await self.redis.smembers(self.keys.user_threads(app, user_id))
        }
        for tk in threads:
            done.queued += await self.queue.purge(tk)
        for raw in await self.redis.lrange(self.keys.dead, 0, -1):
            if DeadLetter.parse(raw).thread in threads:
                done.dead_letters += await self.redis.lrem(self.keys.dead, 1, raw)
        user = await self.registry.lookup_user(app=app, user_id=user_id)
        if user is not None:
            await self.backend.delete_user(user=user)
        who = digest(app, user_id)
        stale = [
            self.keys.user(app, user_id),
            self.keys.user_threads(app, user_id),
            self.keys.context_user(app, user_id),
            self.keys.synthesized(app, user_id),
            self.keys.tombstones(app, user_id),
        ]
        for pattern in (
            f"{self.keys.prefix}:id:thread:{who}:*",
            f"{self.keys.prefix}:ctx:thread:{who}:*",
        ):
            stale += [k async for k in self.redis.scan_iter(match=pattern, count=1000)]
        await self.redis.delete(*stale)
        log.warning("forgot user=%s queued=%d dead=%d", who, done.queued, done.dead_letters)
        await self.audit.record([Entry("forget", "forget_user", who, "deleted")])
        return done

    async def forget_fact(self, *, app: str, user_id: str, fact_uuid: str) -> Forgotten:
        user = await self.registry.lookup_user(app=app, user_id=user_id)
        if user is None:
            return Forgotten()
        known = {f.uuid: f for f in await self._facts(user)}
        if fact_uuid in known:  # a tombstone, so synthesis never writes it back
            await self.redis.sadd(self.keys.tombstones(app, user_id), known[fact_uuid].signature)
        await self.backend.delete_memory(user=user, memory_uuid=fact_uuid)
        await self.cache.delete(self.redis, app=app, user_id=user_id)
        await self.audit.record(
            [Entry("forget", "delete_fact", digest(app, user_id), "deleted", key=fact_uuid)]
        )
        return Forgotten(facts=[fact_uuid])

    async def forget_matching(
        self, *, app: str, user_id: str, query: str, confirm: bool = False
    ) -> Forgotten:
        """Current facts whose text holds every word of ``query``; only listed unless
        ``confirm``."""
        user = await self.registry.lookup_user(app=app, user_id=user_id)
        if user is None:
            return Forgotten(dry_run=not confirm)
        words = query.lower().split()
        matches = [
            f.uuid
            for f in await self._facts(user)
            if f.invalid_at is None
            and words
            and all(w in f"{f.predicate.replace('_', ' ')} {f.value}".lower() for w in words)
        ]
        if confirm:
            for fact_uuid in matches:
                await self.forget_fact(app=app, user_id=user_id, fact_uuid=fact_uuid)
        return Forgotten(dry_run=not confirm, facts=matches)

    async def _facts(self, user: UserRef) -> list[StoredFact]:
        try:
            return await self.backend.list_facts(user=user)
        except BackendError:  # Zep (zep mode): its own facts, no tombstones of ours
            return []
