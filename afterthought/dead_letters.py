"""Dead letters: list them (ids and lengths, never content), replay them into their
thread's queue, or purge them. Each replay is one script: the letter leaves the dead list
only as it re-enters the queue."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from afterthought.contract import DeadLetter, MalformedPayload, QueuedMessage
from afterthought.enqueue import APPEND_LUA, REFUSED
from afterthought.keys import Keys
from afterthought.settings import Settings

# KEYS pending, thread, ready, depth, dead, epoch, user threads; ARGV tk, now, thread_cap,
# global_cap, letter, item
REPLAY_LUA = (
    APPEND_LUA
    + """
local full = room(KEYS[1], KEYS[4], 1, tonumber(ARGV[3]), tonumber(ARGV[4]))
if full < 0 then return full end
if redis.call('LREM', KEYS[5], 1, ARGV[5]) == 0 then return -3 end
return push(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], 6, KEYS[6], KEYS[7])
"""
)


@dataclass(frozen=True, slots=True)
class Replayed:
    replayed: int
    malformed: int
    """Letters whose item cannot be read back; only purging removes them."""
    refused: int
    """Letters a queue cap kept out, or another process took first."""


class DeadLetters:
    def __init__(self, redis: aioredis.Redis, settings: Settings) -> None:
        self._redis = redis
        self._settings = settings
        self._keys = Keys(settings.key_prefix)
        self._replay = redis.register_script(REPLAY_LUA)

    async def listing(self, *, start: int = 0, count: int = 100) -> list[tuple[int, DeadLetter]]:
        raw = await self._redis.lrange(self._keys.dead, start, start + count - 1)
        return [(start + i, DeadLetter.parse(r)) for i, r in enumerate(raw)]

    async def count(self) -> int:
        return int(await self._redis.llen(self._keys.dead))

    async def replay(self, indexes: list[int] | None = None) -> Replayed:
        """Re-queue the letters at ``indexes`` (all when None), each at its thread's end."""
        raw_letters = await self._select(indexes)
        replayed = malformed = refused = 0
        for raw in raw_letters:
            letter = DeadLetter.parse(raw)
            try:
                message = QueuedMessage.decode(letter.item)
            except MalformedPayload:
                malformed += 1
                continue
            result = await self._replay(
                keys=[
                    self._keys.pending(letter.thread),
                    self._keys.thread(letter.thread),
                    self._keys.ready,
                    self._keys.depth,
                    self._keys.dead,
                    self._keys.epoch(message.app, message.user_id),
                    self._keys.user_threads(message.app, message.user_id),
                ],
                args=[
                    letter.thread,
                    int(time.time() * 1000),
                    self._settings.thread_queue_cap,
                    self._settings.queue_cap,
                    raw,
                    message.encode(),
                ],
            )
            if result in REFUSED or result == -3:
                refused += 1
            else:
                replayed += 1
        return Replayed(replayed=replayed, malformed=malformed, refused=refused)

    async def purge(self, indexes: list[int] | None = None) -> int:
        """Delete the letters at ``indexes`` (all when None); returns how many went."""
        if indexes is None:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.llen(self._keys.dead)
                pipe.delete(self._keys.dead)
                total, _ = await pipe.execute()
            return int(total)
        removed = 0
        for raw in await self._select(indexes):
            removed += int(await self._redis.lrem(self._keys.dead, 1, raw))
        return removed

    async def _select(self, indexes: list[int] | None) -> list[bytes]:
        everything: list[bytes] = await self._redis.lrange(self._keys.dead, 0, -1)
        if indexes is None:
            return everything
        return [everything[i] for i in sorted(set(indexes)) if 0 <= i < len(everything)]
