"""The context-block cache (R2): per user, with a per-session overlay, in Redis. The one
owner of cache policy: what is served, what may be written, what is invalidated.

The turn path reads both with one MGET; the worker writes them from
``add_messages(return_context=True)``; the agent reads through on a miss and refreshes a
stale block in the background. Writes are versioned: an older block never replaces a
newer one, whichever process writes last. A block is built from one user's memory, so
every entry is the user's: forgetting them drops all of it at once (the overlay index),
and while a forget runs nothing is served or written (a block read from the backend then
may still hold what is being deleted)."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.crc import key_slot

from afterthought.backends.base import MemoryBackend, UserRef
from afterthought.keys import Keys
from afterthought.settings import Settings

#: The user's ``forgetting`` mark while a forget runs: their messages wait, nothing of
#: theirs is served or cached.
PENDING = "pending"
#: The mark for a short while after: blocks read before the deletion ended are not cached.
COOLING = "cooling"
#: What a write does to the user's block: ``write`` it (with any overlay), ``drop`` it (a
#: backend that ingests asynchronously returned a block that may lack the latest batch),
#: or ``keep`` it (the block is about one session: only its overlay is written).
UserBlock = Literal["write", "drop", "keep"]

# KEYS epoch, forgetting, user index, the user's latest forget time, the user's block, then
# overlays (all in the user's slot); ARGV epoch, version, written_ms, block, ttl_ms, what
# to do with the user's block ("write" it, "drop" it, or "keep" it as it is: overlays
# only), margin_ms. Refused (0) if the user was forgotten since the writer read the
# epoch, or is being forgotten, or if the block's read began (``version``, the writer's
# clock, put on Redis' by how far ``written_ms`` is off Redis' now) before the user's
# latest forget of anything ended, plus the margin. Keeps the newest version of each
# entry; overlays join the user's index.
WRITE_LUA = """
if tonumber(redis.call('GET', KEYS[1]) or '0') ~= tonumber(ARGV[1])
   or redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local forgot = tonumber(redis.call('GET', KEYS[4]) or '')
if forgot then
  local now = redis.call('TIME')
  local skew = tonumber(ARGV[3]) - (now[1] * 1000 + math.floor(now[2] / 1000))
  if tonumber(ARGV[2]) / 1000 - skew < forgot + tonumber(ARGV[7]) then return 0 end
end
local first = 5
if ARGV[6] ~= 'write' then
  if ARGV[6] == 'drop' then redis.call('DEL', KEYS[5]) end
  first = 6
end
for i = first, #KEYS do
  local current = redis.call('GET', KEYS[i])
  local version = current and tonumber(string.match(current, '^(%d+)\\n'))
  if not version or version < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[i], ARGV[2] .. '\\n' .. ARGV[3] .. '\\n' .. ARGV[4], 'PX', ARGV[5])
  end
  if i > 5 then redis.call('SADD', KEYS[3], KEYS[i]) end
end
redis.call('PEXPIRE', KEYS[3], ARGV[5])
return 1
"""

# KEYS the user's latest forget time; ARGV ttl_ms. Now (Redis' clock): a forget ended.
FORGOT_LUA = """
local now = redis.call('TIME')
redis.call('SET', KEYS[1], string.format('%d', now[1] * 1000 + math.floor(now[2] / 1000)),
  'PX', ARGV[1])
return 1
"""

# KEYS the user's index, then the user's block; the index's members (the user's overlays,
# in the same slot) go too. Returns how many entries went.
INVALIDATE_LUA = """
local gone = 0
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do gone = gone + redis.call('DEL', key) end
for i = 2, #KEYS do gone = gone + redis.call('DEL', KEYS[i]) end
redis.call('DEL', KEYS[1])
return gone
"""
# KEYS the graph's index; ARGV ttl_ms, then the entries. They join the index, which lives
# as long as its newest entry: one command where SADD and PEXPIRE were two.
INDEX_LUA = """
redis.call('SADD', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""
#: Entries of a graph's index taken per round trip when it is invalidated.
GRAPH_BATCH = 1000


@dataclass(frozen=True, slots=True)
class CachedBlock:
    block: str
    version: int
    written_ms: int

    @property
    def age(self) -> float:
        return time.time() - self.written_ms / 1000

    @classmethod
    def parse(cls, raw: bytes) -> CachedBlock:
        version, written, block = raw.decode().split("\n", 2)
        return cls(block=block, version=int(version), written_ms=int(written))


@dataclass(frozen=True, slots=True)
class CacheRead:
    """What one cache read found."""

    block: CachedBlock | None
    """The session's overlay, else the user's block; None on a miss."""
    epoch: int
    """The user's deletion epoch at the read: a block fetched after it is written with it."""
    forgetting: bool
    """The user is being forgotten: serve nothing, fetch nothing."""


def now_version() -> int:
    """Versions are microseconds, taken as the block's read begins: a later read wins, even
    within the same millisecond, and one begun before a forget ended is not cached."""
    return time.time_ns() // 1000


class ContextCache:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._keys = Keys.of(settings)
        self._ttl_ms = int(settings.context_ttl_seconds * 1000)
        self._margin_ms = int(settings.forget_clock_margin_seconds * 1000)

    async def read(
        self, redis: aioredis.Redis, *, app: str, user_id: str, session_id: str
    ) -> CacheRead:
        """The session's overlay if it holds anything (it is about this conversation), else
        the user's block — so a new session starts from what is known of the user."""
        k = self._keys
        overlay, user, epoch, forgetting = await redis.mget(
            k.context_thread(app, user_id, session_id),
            k.context_user(app, user_id),
            k.epoch(app, user_id),
            k.forgetting(app, user_id),
        )
        pending = forgetting == PENDING.encode()
        found = [CachedBlock.parse(raw) for raw in (overlay, user) if raw and not pending]
        # An empty overlay (nothing of the user matched the session's batch yet) does not
        # hide what the user's block knows.
        block = next((b for b in found if b.block), found[0] if found else None)
        return CacheRead(block=block, epoch=int(epoch or 0), forgetting=pending)

    async def forgot(self, redis: aioredis.Redis, *, app: str, user_id: str) -> None:
        """A forget of the user (of a fact, or of them) ended now: no block whose read began
        before is cached, however late its write comes (a cool-down alone ends)."""
        await redis.register_script(FORGOT_LUA)(
            keys=[self._keys.forgot_cache(app, user_id)], args=[self._ttl_ms]
        )

    async def epoch(self, redis: aioredis.Redis, *, app: str, user_id: str) -> int:
        """The user's deletion epoch, to read before fetching a block to write."""
        return int(await redis.get(self._keys.epoch(app, user_id)) or 0)

    async def write(
        self,
        redis: aioredis.Redis,
        *,
        app: str,
        user_id: str,
        session_id: str | None,
        graph_uuid: str,
        block: str,
        version: int,
        epoch: int,
        user_block: UserBlock = "write",
    ) -> bool:
        """Cache the block, built from ``graph_uuid``, for the user (and the session's
        overlay); refused (False) when the user was forgotten after ``epoch`` was read, or
        is being forgotten, or when its read began (``version``: :func:`now_version` taken
        before the read) before a forget of theirs ended. ``user_block`` says what becomes
        of the user's block: a block read right after a write to a backend that ingests
        asynchronously may lack what was just said, so it serves the session it came from
        (whose model sees the conversation anyway) and the user's block is dropped, for the
        next session to read through; a block retrieved for one session's latest batch
        keeps the user's."""
        k = self._keys
        entries = [k.context_user(app, user_id)]
        if session_id is not None:
            entries.append(k.context_thread(app, user_id, session_id))
        written_entries = entries if user_block == "write" else entries[1:]
        # The graph's index is shared by its readers, in another slot than the user's keys:
        # the entries join it before they are written, so an invalidation of the graph
        # never misses one (at worst it drops an entry not written yet, or never written).
        await self._index(redis, graph_uuid, written_entries)
        keys = [
            k.epoch(app, user_id),
            k.forgetting(app, user_id),
            k.context_index(app, user_id),
            k.forgot_cache(app, user_id),
        ]
        written = await redis.register_script(WRITE_LUA)(
            keys=[*keys, *entries],
            args=[
                *(epoch, version, int(time.time() * 1000), block, self._ttl_ms, user_block),
                self._margin_ms,
            ],
        )
        if written:
            # Again after: an invalidation of the graph between the two steps took the
            # entries out of its index before this write put them back.
            await self._index(redis, graph_uuid, written_entries)
        return bool(written)

    async def _index(self, redis: aioredis.Redis, graph_uuid: str, entries: list[str]) -> None:
        """The entries join the graph's index, which lives as long as its newest entry."""
        if not entries:
            return
        await redis.register_script(INDEX_LUA)(
            keys=[self._keys.context_graph(graph_uuid)], args=[self._ttl_ms, *entries]
        )

    async def refresh_user(
        self,
        redis: aioredis.Redis,
        backend: MemoryBackend,
        *,
        app: str,
        user_id: str,
        user: UserRef,
        epoch: int,
    ) -> bool:
        """Cache the block a new session of the user starts from: what the backend knows
        of them, retrieved for no query in particular. Versioned as of before the read, so
        a block read before another writer's never wins over it; refused as ``write``."""
        version = now_version()
        block = await backend.get_context(
            user=user,
            query="",
            max_chars=self._settings.context_max_chars,
            timeout=self._settings.backend_timeout,
            template_uuid=self._settings.context_template_uuid,
        )
        return await self.write(
            redis,
            app=app,
            user_id=user_id,
            session_id=None,
            graph_uuid=user.graph_uuid,
            block=block,
            version=version,
            epoch=epoch,
        )

    async def invalidate_user(self, redis: aioredis.Redis, *, app: str, user_id: str) -> int:
        """Drop every entry built from the user's memory (their block and every session
        overlay): after a fact is written or forgotten, a prune, or forgetting the user."""
        keys = self._user_entries(app, user_id)
        return int(await redis.register_script(INVALIDATE_LUA)(keys=keys))

    def invalidate_user_in(self, pipe: Any, *, app: str, user_id: str) -> None:
        """:meth:`invalidate_user` queued on a pipeline (a pass over many users; ``EVAL``,
        as a cluster's pipeline loads no script)."""
        keys = self._user_entries(app, user_id)
        pipe.eval(INVALIDATE_LUA, len(keys), *keys)

    def _user_entries(self, app: str, user_id: str) -> list[str]:
        """The user's index of overlays first, then their block."""
        return [self._keys.context_index(app, user_id), self._keys.context_user(app, user_id)]

    async def invalidate_graph(self, redis: aioredis.Redis, *, graph_uuid: str) -> int:
        """Drop every entry built from the graph, whoever it was cached for: after a fact
        in it is written, forgotten or pruned (a shared graph is read by many users)."""
        graph, gone = self._keys.context_graph(graph_uuid), 0
        # The entries are many users', in as many slots: taken off the index a batch at a
        # time (SPOP: an entry a writer adds meanwhile stays indexed for the next
        # invalidation), then deleted one slot at a time.
        while taken := await redis.spop(graph, GRAPH_BATCH):
            by_slot: dict[int, list[bytes]] = defaultdict(list)
            for entry in taken:
                by_slot[key_slot(entry)].append(entry)
            async with redis.pipeline(transaction=False) as pipe:
                for entries in by_slot.values():
                    pipe.delete(*entries)
                gone += sum(await pipe.execute())
        return gone

    async def invalidate(
        self, redis: aioredis.Redis, *, app: str, user_id: str, graph_uuid: str
    ) -> None:
        """After the user's memory in ``graph_uuid`` changed: their entries and the graph's."""
        await self.invalidate_user(redis, app=app, user_id=user_id)
        await self.invalidate_graph(redis, graph_uuid=graph_uuid)
