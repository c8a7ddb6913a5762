"""Forgetting: a user (everything), one fact, or the facts matching a query (dry run
unless confirmed). A forgotten fact leaves a tombstone so synthesis cannot write it again.

Forgetting a user is complete and confirmed, in this order:
1. record the forget as pending (durable, deployment-wide), then mark the user as being
   forgotten and raise their deletion epoch (one script in the user's slot): queued and
   in-flight messages from before are dropped, what they say from now on waits, and no
   cached block is served or written;
2. wait until no worker holds one of their threads or synthesizes their facts: a lease
   or a synthesis mark is renewed as long as its job runs, and every write of the job is
   fenced by the epoch and that hold (``afterthought.fence``), so once the hold is gone —
   let go, or expired with its job stopped — nothing more is written, and a backend write
   that raced the forget has it done again (``reopen``);
3. purge their queues, dead letters and quarantined proposals;
4. delete them from the backend and wait until it is done (Zep deletes asynchronously);
5. drop every cache entry and registry record of them;
6. end the mark with a short cool-down (a block read before step 4 finished must not be
   cached after it). Until then the forget is *pending*: ``status`` shows it, and workers
   resume it (``resume_pending``) if the process doing it stops or the backend is slow."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from afterthought.audit import AuditLog, Entry
from afterthought.backends.base import (
    BackendError,
    HistoryMessage,
    MemoryBackend,
    UserRef,
    synthesizes,
)
from afterthought.backends.retrieval import query_stems
from afterthought.context_cache import COOLING, PENDING, ContextCache
from afterthought.contract import DeadLetter, MalformedPayload, QueuedMessage
from afterthought.facts import StoredFact, statement
from afterthought.fence import Fence
from afterthought.forget_marks import PERSON_LUA, marks, person_key, reopen
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys, digest
from afterthought.quarantine import Quarantine
from afterthought.queue import FORGOT_KEEP_MS, ThreadQueue
from afterthought.search import SearchRequest
from afterthought.settings import Settings
from afterthought.shared_store import sharing_prefixes
from afterthought.tombstones import Tombstones
from afterthought.worker.extract import default_extractor

log = logging.getLogger("afterthought.worker")

#: KEYS the user's forgetting mark; ARGV pending, cooling, ms. A cool-down mark, unless a
#: forget of the user holds the mark (it must stay pending).
COOL_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
"""
#: KEYS the user's forgetting mark, epoch, forget time; ARGV pending, ms, epoch, keep_ms. The
#: KEYS the pending forgets; ARGV the user's digest, the record the forget began with. A
#: forget is done only if nobody recorded it again meanwhile (a write that raced it).
DONE_LUA = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) end
"""
#: KEYS the user's epoch and forget time; ARGV keep_ms. A forget this deployment did not
#: run, found now: what was queued before is dropped (the epoch), and so is what an agent
#: made before and sends later (the time). Returns the time (Redis' clock).
DELETED_LUA = """
redis.call('INCR', KEYS[1])
local now = redis.call('TIME')
local ms = string.format('%d', now[1] * 1000 + math.floor(now[2] / 1000))
redis.call('SET', KEYS[2], ms, 'PX', ARGV[1])
return ms
"""
#: A query without a word is refused (facts are matched by the stems of its words).
WORD = re.compile(r"\w+")
#: Statements searched for one that says a forgotten fact again.
RESTATEMENTS = 50
#: How much of a fact's text a dry run shows.
SHOWN_CHARS = 80
#: A dry run of forgetting a user counts their facts and statements, and shows this many
#: of each (the rest would flood a terminal).
SAMPLE = 5
#: Statements read from the backend per call while counting them.
COUNT_PAGE = 1000
#: After a forget, cache writes stay refused this long: a block read from the backend
#: before the deletion finished may still be on its way to the cache.
COOL_DOWN_MS = 60_000


@dataclass
class Forgotten:
    """What a forget did (or, in a dry run, would do)."""

    dry_run: bool = False
    users: int = 0
    """Users the registry knew (0: the id named nobody who had been stored)."""
    former_users: int = 0
    """Backend users of theirs other than the one the ``zep_user_id_template`` in effect
    names (named by a template the deployment used before), deleted too."""
    facts: list[str] = field(default_factory=list)
    """Ids of the facts (to be) deleted."""
    texts: list[str] = field(default_factory=list)
    """Each fact's text, shortened, in the order of ``facts``: what the operator confirms."""
    statements: list[str] = field(default_factory=list)
    """The user's past statements that say one of the facts again (deleted with it), each
    shortened."""
    queued: int = 0
    dead_letters: int = 0
    quarantined: int = 0
    pending: bool = False
    """The backend has not confirmed the deletion yet; a worker finishes it."""
    fact_count: int | None = None
    """Forgetting a user (a dry run, or the command's report after one): how many facts the
    backend holds of them (superseded ones included), of which ``facts`` and ``texts`` show
    the first ``SAMPLE``. None elsewhere: every fact is listed."""
    left: list[str] = field(default_factory=list)
    """Backend user ids the template in effect names for them that the backend holds and
    the forget left: ids that may be another deployment's user
    (``IdentityRegistry.unproven_id``), which the registry does not record as theirs."""
    statement_count: int | None = None
    """Forgetting a user, the same: how many messages the backend holds of their
    conversations (their statements and the replies), of which ``statements`` shows the
    first ``SAMPLE``. None elsewhere."""


class Forgetter:
    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        backend: MemoryBackend,
        *,
        poll_seconds: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``poll_seconds``: how often a forget looks again for a worker holding the user.
        ``clock`` (monotonic seconds) and ``sleep`` (those looks' waits) let a test drive
        the wait of two leases."""
        self.settings = settings
        self.redis = redis
        self.backend = backend
        self.keys = Keys.of(settings)
        self.registry = IdentityRegistry(redis, settings)
        self._cool = redis.register_script(COOL_LUA)
        self._done = redis.register_script(DONE_LUA)
        self._person = redis.register_script(PERSON_LUA)
        self._deleted = redis.register_script(DELETED_LUA)
        self.cache = ContextCache(settings)
        self.queue = ThreadQueue(redis, settings)
        self.audit = AuditLog(redis, settings)
        self.tombstones = Tombstones(settings, redis, backend)
        self._poll = poll_seconds
        self._clock = clock
        self._sleep = sleep
        self.extractor = default_extractor(settings)

    async def forget_user(self, *, app: str, user_id: str) -> Forgotten:
        """Forget everything of the user, in every app that shares their backend user;
        ``pending`` if the backend is not done yet."""
        person = person_key(self.settings, app=app, user_id=user_id)
        if person is not None:
            # Before the registry is walked: an app provisioning them meanwhile, not walked,
            # sees the person's forget time move and takes back what it wrote
            # (``IdentityRegistry.ensure_user``).
            await self._person(keys=[person], args=["", FORGOT_KEEP_MS])
        try:
            aliases, known = await self.aliases(app, user_id)
        except BackendError:  # the backend is asked again when the forget completes
            aliases, known = [(app, user_id)], False
        since = int(time.time() * 1000)
        for a, u in aliases:
            # Messages queued up to now carry at most this epoch; the forget raises it past.
            epoch = await self.cache.epoch(self.redis, app=a, user_id=u) + 1
            record = {"app": a, "user_id": u, "since": since, "epoch": epoch}
            # The durable entry first: a stop before the marks leaves a forget a worker
            # resumes (and marks), never marks that no worker knows to finish.
            await self.redis.hset(self.keys.forgets, digest(a, u), json.dumps(record))
            await marks(self.redis, self.settings, record)
        done = Forgotten(users=len(aliases) if known else 0)
        for a, u in aliases:
            step = await self._complete(a, u)
            done.queued += step.queued
            done.dead_letters += step.dead_letters
            done.quarantined += step.quarantined
            done.former_users += step.former_users
            done.pending = done.pending or step.pending
        if not done.pending:
            done.left = await self._left(app, user_id)
        return done

    async def preview_user(self, app: str, user_id: str) -> Forgotten | None:
        """The dry run of :meth:`forget_user_reported`: what :meth:`held` finds, ``users``
        counting the (app, user) pairs the forget covers (0: none the backend holds); None
        when nothing names the user (not in the backend, nothing queued or kept)."""
        aliases, known = await self.aliases(app, user_id)
        held = await self.held(app, user_id)
        held.left = await self._left(app, user_id)
        if not (known or held.queued or held.dead_letters or held.quarantined or held.left):
            return None
        held.users = len(aliases) if known else 0
        return held

    async def forget_user_reported(self, app: str, user_id: str) -> Forgotten:
        """Forget the user, reported as :meth:`preview_user` lists it: what the backend
        held of them (counted, the first facts' ids) before it was deleted."""
        try:
            had = await self.held(app, user_id)
        except BackendError:  # the forget goes on (pending): the backend cannot say what it held
            had = Forgotten()
        done = await self.forget_user(app=app, user_id=user_id)
        done.facts = had.facts
        done.fact_count, done.statement_count = had.fact_count, had.statement_count
        return done

    async def aliases(self, app: str, user_id: str) -> tuple[list[tuple[str, str]], bool]:
        """The user and every (app, user id) the registry maps to the same backend user:
        with a ``zep_user_id_template`` without ``{app}`` (the default), one user id names
        one person in every app, and deleting them deletes them for all. And whether the
        registry knew the user (one not known may still have turns queued). Raises the
        backend's error when it cannot say."""
        found = [(app, user_id)]
        users = {u.user_uuid for u in await self.backend_users(app, user_id)}
        if not users:
            return found, False
        async for other in self.registry.users():
            alias = (other.app, other.user_id)
            if other.user.user_uuid in users and alias != (app, user_id):
                found.append(alias)
        return found, True

    async def held(self, app: str, user_id: str) -> Forgotten:
        """What a forget of the user would drop (a dry run): in the backend, their facts
        and statements, counted, with a sample of each; in Redis, their queued messages,
        dead letters and quarantined entries."""
        threads = [  # thread references: their keys are in the user's slot
            t.decode() for t in await self.redis.smembers(self.keys.user_threads(app, user_id))
        ]
        queued = [await self.redis.llen(self.keys.pending(ref)) for ref in threads]
        # As the forget drops them: with one person in every app, theirs in any app.
        every_app = not self.settings.apps_apart
        shards = self.keys.shard_ids if every_app else [self.keys.shard_of(app, user_id)]
        dead = [
            DeadLetter.parse(raw)
            for key in {self.keys.dead(shard) for shard in shards}
            for raw in await self.redis.lrange(key, 0, -1)
        ]
        whose = None if every_app else app
        quarantine = Quarantine(self.redis, self.settings)
        done = Forgotten(
            dry_run=True,
            queued=sum(queued),
            dead_letters=sum(_theirs(d, set(threads), app=whose, user_id=user_id) for d in dead),
            quarantined=len(await quarantine.entries(app=whose, user_id=user_id)),
            fact_count=0,
            statement_count=0,
        )
        facts_counted = statements_counted = 0
        for user in await self.backend_users(app, user_id):  # each is deleted: each is counted
            facts = await self.backend.list_facts(user=user)
            facts_counted += len(facts)
            done.facts += [f.uuid for f in facts[: SAMPLE - len(done.facts)]]
            done.texts += [_shown(f) for f in facts[: SAMPLE - len(done.texts)]]
            statements_counted += await self._count_statements(user, done)
        done.fact_count, done.statement_count = facts_counted, statements_counted
        return done

    async def _count_statements(self, user: UserRef, done: Forgotten) -> int:
        """How many messages the backend holds of the user; the first into ``done``'s
        sample."""
        counted, after = 0, None
        while True:
            page, after = await self.backend.user_messages(user=user, after=after, limit=COUNT_PAGE)
            counted += len(page)
            done.statements += _said(page[: SAMPLE - len(done.statements)])
            if len(page) < COUNT_PAGE or after is None:
                return counted

    async def _user(self, app: str, user_id: str) -> UserRef | None:
        """The user in the backend: as the registry records them (under whichever
        template), else as the backend itself finds them by their id (Redis may have lost
        the registry's record)."""
        return await self.registry.recorded_user(app=app, user_id=user_id) or await self._named(
            app, user_id
        )

    async def _named(self, app: str, user_id: str) -> UserRef | None:
        """The user the template in effect names, as the registry or the backend has them."""
        user = await self.registry.lookup_user(app=app, user_id=user_id)
        if user is None and await self.registry.unproven_id(app=app, user_id=user_id) is None:
            user = await self.backend.find_user(
                zep_user_id=await self.registry.backend_user_id(app=app, user_id=user_id)
            )
        return user

    async def _left(self, app: str, user_id: str) -> list[str]:
        """The id :attr:`Forgotten.left` names, if the backend holds a user by it."""
        unproven = await self.registry.unproven_id(app=app, user_id=user_id)
        if unproven is None or await self.backend.find_user(zep_user_id=unproven) is None:
            return []
        return [unproven]

    async def backend_users(self, app: str, user_id: str) -> list[UserRef]:
        """Every backend user of theirs: the registry's, (a ``zep_user_id_template``
        changed since and they have not been back) the one the template names now,
        (they came back after it changed) those their entry was re-derived away from, and
        those every other template the deployment used names (their entry, which recorded
        the others, expires ``idle_ttl_seconds`` after their last turn)."""
        recorded = await self.registry.recorded_user(app=app, user_id=user_id)
        named = await self._named(app, user_id)
        former = await self.registry.former_users(app=app, user_id=user_id)
        historic = await self.registry.historic_users(self.backend, app=app, user_id=user_id)
        found = (recorded, named, *former, *historic)
        return list(dict.fromkeys(u for u in found if u is not None))

    async def resume_pending(self) -> list[Forgotten]:
        """Finish every forget still pending (a stopped process, a slow backend)."""
        done = []
        for raw in (await self.redis.hgetall(self.keys.forgets)).values():
            record = json.loads(raw)
            await marks(self.redis, self.settings, record)
            done.append(await self._complete(record["app"], record["user_id"]))
        return done

    async def reopen(self, *, app: str, user_id: str) -> None:
        """The user's forget done again (:func:`afterthought.forget_marks.reopen`)."""
        await reopen(self.redis, self.settings, app=app, user_id=user_id)

    async def raced(self, fence: Fence, *, app: str, user_id: str) -> bool:
        """After a backend write a job made under ``fence``: whether the user's forget
        began since the job read their epoch (then it writes nothing more). If the job's
        hold is gone too, the forget no longer waited for it and may have deleted before
        the write landed: it is done again; so too after a forget of their person
        elsewhere, which waits for no hold of this deployment."""
        forgotten, held = await fence.read(self.redis)
        if forgotten and (not held or await fence.person_moved(self.redis)):
            await self.reopen(app=app, user_id=user_id)
        return forgotten

    async def _complete(self, app: str, user_id: str) -> Forgotten:
        done = Forgotten(users=1)
        who = digest(app, user_id)
        began = await self.redis.hget(self.keys.forgets, who)
        await self._drop_cached(app, user_id)
        threads = {
            t.decode() for t in await self.redis.smembers(self.keys.user_threads(app, user_id))
        }
        holders = [self.keys.lease(ref) for ref in threads]
        if not await self._gone([*holders, self.keys.synthesizing(app, user_id)]):
            done.pending = True
            log.warning("forget pending user=%s: a worker still works on them", who)
            return done
        epoch = await self.cache.epoch(self.redis, app=app, user_id=user_id)
        for ref in threads:  # what they say from now on waits, and stays
            done.queued += await self.queue.purge(ref, before_epoch=epoch)
        # With one person in every app, what waits for an operator in another app goes too:
        # its registry entry, which would name that app here, may have idled out.
        every_app = not self.settings.apps_apart
        done.dead_letters = await self._drop_dead(app, user_id, threads, every_app=every_app)
        done.quarantined = await Quarantine(self.redis, self.settings).drop_user(
            app=app, user_id=user_id, every_app=every_app
        )
        try:
            users = await self.backend_users(app, user_id)
            named = await self._named(app, user_id)
            for user in users:
                await self.backend.delete_user(user=user)
            done.former_users = len([u for u in users if u != named])
        except BackendError as exc:
            done.pending = True
            log.warning("forget pending user=%s error=%s", who, exc.kind)
            return done
        await self.cache.invalidate_user(self.redis, app=app, user_id=user_id)
        for user in users:
            await self.cache.invalidate_graph(self.redis, graph_uuid=user.graph_uuid)
        await self._sweep_sharing(users)
        stale = [  # all in the user's slot
            self.keys.user(app, user_id),
            self.keys.user_threads(app, user_id),
            self.keys.synthesized(app, user_id),
            self.keys.tombstones(app, user_id),
            *(self.keys.seen(ref) for ref in threads),
            *await self.registry.sessions(app=app, user_id=user_id),
        ]
        # The durable entry goes last: every step before it may run again, so a stop on
        # the way leaves the forget to be resumed, never a forget said done with keys left.
        await self.redis.delete(*stale)
        # Untagged: on its own. Again, as a worker may have provisioned them meanwhile.
        await self.redis.delete(self.keys.person(user_id))
        await self.tombstones.drop_person(app=app, user_id=user_id)
        await self.redis.set(self.keys.forgetting(app, user_id), COOLING, px=COOL_DOWN_MS)
        await self.cache.forgot(self.redis, app=app, user_id=user_id)
        await self._done(keys=[self.keys.forgets], args=[who, began or b""])
        log.info("forgot user=%s queued=%d dead=%d", who, done.queued, done.dead_letters)
        await self.audit.record([Entry("forget", "forget_user", who, "deleted")])
        return done

    async def _drop_cached(self, app: str, user_id: str) -> None:
        """The blocks cached of the user's graphs, in any app, before the forget waits for
        anything (it may stay pending, to be resumed): an app the registry does not map
        them to has no forgetting mark, and would serve its block of them until then."""
        try:
            users = await self.backend_users(app, user_id)
        except BackendError:  # the registry's, at least
            recorded = await self.registry.recorded_user(app=app, user_id=user_id)
            users = [] if recorded is None else [recorded]
        for user in users:
            await self.cache.invalidate_graph(self.redis, graph_uuid=user.graph_uuid)

    async def _drop_dead(
        self,
        app: str,
        user_id: str,
        threads: set[str],
        *,
        said_before: int | None = None,
        every_app: bool = False,
    ) -> int:
        """Delete the user's dead letters (only those said before ``said_before``, ms by
        Redis' clock, plus the clock margin, when given), and with ``every_app`` those of
        their user id in any app, whichever shard holds them; how many."""
        shards = self.keys.shard_ids if every_app else [self.keys.shard_of(app, user_id)]
        margin, dropped = int(self.settings.forget_clock_margin_seconds * 1000), 0
        for dead in {self.keys.dead(shard) for shard in shards}:
            for raw in await self.redis.lrange(dead, 0, -1):
                letter = DeadLetter.parse(raw)
                if _theirs(letter, threads, app=None if every_app else app, user_id=user_id) and (
                    said_before is None or _said_before(letter, said_before + margin)
                ):
                    dropped += await self.redis.lrem(dead, 1, raw)
        return dropped

    async def deleted_elsewhere(self, *, app: str, user_id: str, stale: UserRef) -> None:
        """The backend user the registry maps the user to (``stale``) is gone: a forget of
        the person in another deployment that shares users deleted them (or someone did by
        hand). A forget of the person, which this deployment did not run: what it holds of
        that user goes — registry entries (so the next message provisions them afresh),
        cached blocks, the synthesis watermark and tombstones, quarantined proposals — and
        what they said before it is dropped, not written back: by the forget's time where a
        sharing deployment recorded it (``forget_marks.person_key``, read before each batch),
        else from now (their epoch raised and the time recorded, as a forget does). What
        they say after it stays queued. Once per deletion: a worker that finds the registry
        no longer naming ``stale`` (another one of the user's threads met it first) leaves
        it to that one."""
        if await self.registry.lookup_user(app=app, user_id=user_id) != stale:
            return
        person = person_key(self.settings, app=app, user_id=user_id)
        raw = await self.redis.get(person) if person is not None else None
        forgot = int(raw) if raw is not None else None
        if forgot is None:
            forgot = int(
                await self._deleted(
                    keys=[self.keys.epoch(app, user_id), self.keys.forgot(app, user_id)],
                    args=[FORGOT_KEEP_MS],
                )
            )
        threads = {
            t.decode() for t in await self.redis.smembers(self.keys.user_threads(app, user_id))
        }
        await self.registry.drop_stale(app=app, user_id=user_id, user=stale)
        await self.cache.invalidate_user(self.redis, app=app, user_id=user_id)
        await self.cache.invalidate_graph(self.redis, graph_uuid=stale.graph_uuid)
        await self.redis.delete(
            self.keys.synthesized(app, user_id), self.keys.tombstones(app, user_id)
        )
        await self.tombstones.drop_person(app=app, user_id=user_id)
        await Quarantine(self.redis, self.settings).drop_user(app=app, user_id=user_id)
        dead = await self._drop_dead(app, user_id, threads, said_before=forgot)
        who = digest(app, user_id)
        log.warning("backend user gone user=%s: provisioned afresh dead=%d", who, dead)
        await self.audit.record([Entry("forget", "deleted_elsewhere", who, "dropped")])

    async def _sweep_sharing(self, users: list[UserRef]) -> None:
        """The deleted backend users are those of every deployment that shares users on
        this store (``shared_store.sharing_prefixes``): what each holds of them in Redis
        (registry entries, cached blocks, dead letters, quarantine) goes now, as its own
        worker would do on meeting the deletion (:meth:`deleted_elsewhere`), which may
        never come (a person who does not speak there again). One registry walk each; and
        its blocks cached of their graphs go whether or not its registry still lists them
        (an entry idles out after ``idle_ttl_seconds``, a block lives
        ``context_ttl_seconds``): by the graph's index, which lives as long as they do."""
        if not users:
            return
        for other in await self._sharing():
            theirs = [r async for r in other.registry.users() if r.user in users]
            for found in theirs:
                await other.deleted_elsewhere(
                    app=found.app, user_id=found.user_id, stale=found.user
                )
            for user in users:
                await other.cache.invalidate_graph(self.redis, graph_uuid=user.graph_uuid)

    async def _sharing(self) -> list[Forgetter]:
        """A forgetter of each other deployment that shares users on this store
        (``shared_store.sharing_prefixes``); none unless users are shared."""
        if not self.settings.users_shared:
            return []
        return [
            Forgetter(self.settings.model_copy(update={"key_prefix": p}), self.redis, self.backend)
            for p in await sharing_prefixes(self.redis, self.settings)
        ]

    async def _fact_gone_elsewhere(
        self, user: UserRef, *, app: str, user_id: str, signature: str
    ) -> None:
        """What each deployment that shares the user holds of their forgotten fact: its
        blocks cached of their graph (and, as here, none read before now is cached after)
        and the fact's proposals in its quarantine. Its synthesis reads the shared
        tombstone (``Tombstones.person``)."""
        for other in await self._sharing():
            async for found in other.registry.users():
                if found.user == user:
                    await other.cache.forgot(self.redis, app=found.app, user_id=found.user_id)
            await other.cache.invalidate_graph(self.redis, graph_uuid=user.graph_uuid)
            await Quarantine(self.redis, other.settings).drop_fact(
                app=app,
                user_id=user_id,
                signature=signature,
                every_app=not other.settings.apps_apart,
            )

    async def _gone(self, marks: list[str]) -> bool:
        """Wait until no worker holds one of the user's threads or synthesizes them (False
        if one still does after two leases: the forget stays pending, and is resumed). A
        mark ends when its holder lets go, or expires if the holder stopped renewing it; a
        holder that goes on after that writes nothing more (its writes are fenced by its
        hold), and one whose backend write raced this has the forget done again."""
        deadline = self._clock() + self.settings.lease_seconds * 2
        while await self.redis.exists(*marks):
            if self._clock() > deadline:
                return False
            await self._sleep(self._poll)
        return True

    async def forget_fact(
        self, *, app: str, user_id: str, fact_uuid: str, confirm: bool = True
    ) -> Forgotten:
        """One fact of the user; only described unless ``confirm``. ``facts`` is empty
        when the id names no fact of theirs."""
        user = await self._user(app, user_id)
        if user is None:
            return Forgotten(dry_run=not confirm)
        known = {f.uuid: f for f in await self.backend.list_facts(user=user)}
        if not confirm:
            found = known.get(fact_uuid)
            if found is None:
                return Forgotten(dry_run=True)
            return Forgotten(
                dry_run=True,
                facts=[fact_uuid],
                texts=[_shown(found)],
                statements=_said(await self._restatements(user, found)),
            )
        if fact_uuid in known:  # a tombstone, so synthesis never writes it back
            signature = known[fact_uuid].signature
            await self.tombstones.add(app=app, user_id=user_id, fact=known[fact_uuid])
            # Its refused proposals hold its words, and a release would write it back.
            await Quarantine(self.redis, self.settings).drop_fact(
                app=app,
                user_id=user_id,
                signature=signature,
                every_app=not self.settings.apps_apart,
            )
        # Blocks read before the deletion must not be cached after the invalidation below:
        # the cool-down mark refuses cache writes (a forget of the user keeps its own mark).
        await self._cool(
            keys=[self.keys.forgetting(app, user_id)], args=[PENDING, COOLING, COOL_DOWN_MS]
        )
        # Found before the fact goes: the statement it came from is listed too (as the dry
        # run listed it), though deleting the fact takes that one with it.
        restated = await self._restatements(user, known[fact_uuid]) if fact_uuid in known else []
        deleted = await self.backend.delete_memory(user=user, memory_uuid=fact_uuid)
        if deleted:
            for message in restated:
                await self.backend.delete_memory(user=user, memory_uuid=message.key)
        # A block read before the deletion ended may hold the fact, however late it comes:
        # in any app of the person (each reads their one backend user).
        for a, u in (await self.aliases(app, user_id))[0]:
            await self.cache.forgot(self.redis, app=a, user_id=u)
        await self.cache.invalidate(
            self.redis, app=app, user_id=user_id, graph_uuid=user.graph_uuid
        )
        if fact_uuid in known:
            await self._fact_gone_elsewhere(
                user, app=app, user_id=user_id, signature=known[fact_uuid].signature
            )
        if not deleted:  # not the user's, or not there: nothing was forgotten
            return Forgotten()
        await self.audit.record(
            [Entry("forget", "delete_fact", digest(app, user_id), "deleted", key=fact_uuid)]
        )
        return Forgotten(
            facts=[fact_uuid],
            texts=[_shown(known[fact_uuid])] if fact_uuid in known else [],
            statements=_said(restated),
        )

    async def _restatements(self, user: UserRef, fact: StoredFact) -> list[HistoryMessage]:
        """The user's other statements that say the fact (said again later, a duplicate
        synthesis never linked to it): the block would still quote them, so they go with
        it. Said, as the extractor reads it — not merely sharing a word with it ("I run a
        bakery" does not say "likes: running")."""
        if not synthesizes(self.settings, self.backend):
            return []  # Zep extracted the fact; it deleted the episodes it came from
        hits = await self.backend.search(
            graph_uuid=user.graph_uuid,
            request=SearchRequest(query=fact.value, scope="episodes", limit=RESTATEMENTS),
            timeout=self.settings.backend_timeout,
        )
        said = {h.uuid: HistoryMessage(h.uuid, "user", h.text, h.created_at or "") for h in hits}
        keys = {
            key
            for proposed in await self.extractor.extract(list(said.values()))
            if proposed.signature == fact.signature
            for key in proposed.source_keys
        }
        return [message for key, message in said.items() if key in keys]

    async def forget_matching(
        self, *, app: str, user_id: str, query: str, confirm: bool = False
    ) -> Forgotten:
        """Current facts whose text holds every word of ``query``, by stem as search finds
        them ("peanut" holds for "allergic to: peanuts"); only listed unless ``confirm``."""
        user = await self._user(app, user_id)
        if user is None:
            return Forgotten(dry_run=not confirm)
        wanted = query_stems(query)
        matches = [
            f
            for f in await self.backend.list_facts(user=user)
            if f.invalid_at is None
            and wanted
            # Whole words: "cat" must not forget "lives in: Catalonia".
            and wanted <= query_stems(f"{f.predicate.replace('_', ' ')} {f.value}")
        ]
        done = Forgotten(
            dry_run=not confirm, facts=[f.uuid for f in matches], texts=list(map(_shown, matches))
        )
        for fact in matches:
            if confirm:
                step = await self.forget_fact(app=app, user_id=user_id, fact_uuid=fact.uuid)
                done.statements += step.statements
            else:
                done.statements += _said(await self._restatements(user, fact))
        return done


def _theirs(letter: DeadLetter, threads: set[str], *, app: str | None, user_id: str) -> bool:
    """Whether a dead letter is the user's: on one of their threads, or saying it is theirs
    (their thread set may have idled out while the letter waits for an operator); with
    ``app`` None, their user id's in any app."""
    if letter.thread in threads:
        return True
    try:
        message = QueuedMessage.decode(letter.item)
    except MalformedPayload:
        return False
    return message.user_id == user_id and app in (None, message.app)


def _said_before(letter: DeadLetter, ms: int) -> bool:
    """Whether a dead letter's message was said before ``ms`` (on Redis' clock); one that
    does not say when (an older version's, or unreadable) counts as before."""
    try:
        message = QueuedMessage.decode(letter.item)
    except MalformedPayload:
        return True
    return message.said_ms is None or message.said_ms - message.skew_ms < ms


def _shown(fact: StoredFact) -> str:
    """A fact as an operator confirms it: its statement, shortened (a terminal, not a log)."""
    return _cut(statement(fact.subject, fact.predicate, fact.value))


def _said(messages: list[HistoryMessage]) -> list[str]:
    """Statements as an operator confirms them: shortened."""
    return [_cut(m.content) for m in messages]


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"
