"""Dead letters: list them (ids and lengths, never content), replay them into their
thread's queue, or purge them. Each replay is one script: the letter leaves the dead list
only as it re-enters the queue.

A replayed message is appended at the end of its thread: on Zep a thread only grows at its
end, so a message that failed after later ones were stored cannot take its old place. It
keeps its ``reference_time`` (when it was said), which is what Zep dates memory by, and it
is reconciled first (it may have been stored after all)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from afterthought.contract import DeadLetter, MalformedPayload, QueuedMessage, letter_id
from afterthought.forget_marks import person_key
from afterthought.keys import Keys
from afterthought.queue import FORGOTTEN, GONE, REFUSED, NotReplicated, ThreadQueue
from afterthought.settings import Settings


@dataclass(frozen=True, slots=True)
class Replayed:
    replayed: int
    malformed: int
    """Letters whose item cannot be read back; only purging removes them."""
    refused: int
    """Letters a queue cap kept out, or another process took first."""
    forgotten: int = 0
    """Letters made before their user's forget: dropped, never queued again."""
    unconfirmed: int = 0
    """A letter replayed on a master whose replicas did not confirm it in time
    (``redis_wait_replicas``): a failover may put it back among the dead, so it is not
    counted replayed, and the replay stops there (each later one would wait as long).
    Replaying again is safe: a letter the master kept is not found again."""


class DeadLetters:
    """The dead letters of every shard, numbered as one list: shard by shard, each oldest
    first (in the flat layout, the one list as it is)."""

    def __init__(self, redis: aioredis.Redis, settings: Settings) -> None:
        self._redis = redis
        self._settings = settings
        self._keys = Keys.of(settings)
        self._queue = ThreadQueue(redis, settings)

    async def _counts(self) -> list[int]:
        """Letters per shard, read in one batch."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for shard in self._keys.shard_ids:
                pipe.llen(self._keys.dead(shard))
            return [int(n) for n in await pipe.execute()]

    async def listing(self, *, start: int = 0, count: int = 100) -> list[tuple[int, DeadLetter]]:
        found: list[tuple[int, DeadLetter]] = []
        offset = 0
        for shard, size in zip(self._keys.shard_ids, await self._counts(), strict=True):
            low, high = max(start, offset), min(start + count, offset + size)
            if low < high:
                raw = await self._redis.lrange(
                    self._keys.dead(shard), low - offset, high - 1 - offset
                )
                found += [(low + i, DeadLetter.parse(r)) for i, r in enumerate(raw)]
            offset += size
        return found

    async def count(self) -> int:
        return sum(await self._counts())

    async def replay(
        self, indexes: list[int] | None = None, *, ids: list[str] | None = None
    ) -> Replayed:
        """Re-queue the letters at ``indexes`` and those of ``ids`` (:attr:`DeadLetter.id`;
        all when both are None), each at its thread's end."""
        replayed = malformed = refused = forgotten = unconfirmed = 0
        for _, raw in await self._select(indexes, ids):
            letter = DeadLetter.parse(raw)
            try:
                message = QueuedMessage.decode(letter.item)
            except MalformedPayload:
                malformed += 1
                continue
            # A forget of their person (in another app or, with users shared, in another
            # deployment) counts as the worker counts it: the letter is dropped, not replayed.
            person = person_key(self._settings, app=message.app, user_id=message.user_id)
            forgot = None if person is None else await self._redis.get(person)
            try:
                result = await self._queue.replay(
                    raw,
                    message,
                    now_ms=int(time.time() * 1000),
                    person_forgot=None if forgot is None else int(forgot),
                )
            except NotReplicated:
                unconfirmed = 1
                break
            if result == FORGOTTEN:
                forgotten += 1
            elif result in REFUSED or result == GONE:
                refused += 1
            else:
                replayed += 1
        return Replayed(
            replayed=replayed,
            malformed=malformed,
            refused=refused,
            forgotten=forgotten,
            unconfirmed=unconfirmed,
        )

    async def purge(self, indexes: list[int] | None = None, *, ids: list[str] | None = None) -> int:
        """Delete the letters at ``indexes`` and those of ``ids`` (all when both are None);
        returns how many went."""
        if indexes is None and ids is None:
            purged = [self._queue.drop_dead(shard=shard) for shard in self._keys.shard_ids]
            return sum(await asyncio.gather(*purged))
        removed = 0
        for shard, raw in await self._select(indexes, ids):
            removed += int(await self._redis.lrem(self._keys.dead(shard), 1, raw))
        return removed

    async def _select(
        self, indexes: list[int] | None, ids: list[str] | None = None
    ) -> list[tuple[int | None, bytes]]:
        """The letters at ``indexes`` and of ``ids`` (all when both are None), each with its
        shard, in the order of the list."""
        everything: list[tuple[int | None, bytes]] = []
        for shard in self._keys.shard_ids:
            raw: list[bytes] = await self._redis.lrange(self._keys.dead(shard), 0, -1)
            everything += [(shard, r) for r in raw]
        if indexes is None and ids is None:
            return everything
        at, named = set(indexes or ()), set(ids or ())
        return [
            letter
            for i, letter in enumerate(everything)
            if i in at or (named and letter_id(letter[1]) in named)
        ]
