"""The write half of the turn path: one Lua script, one Redis round trip, never raises."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from afterthought.contract import QueuedMessage
from afterthought.keys import Keys
from afterthought.loops import PerLoop, redis_client
from afterthought.settings import Settings

log = logging.getLogger("afterthought.enqueue")

# Appends each payload with the thread's next sequence number and marks the thread ready.
# ZADD NX keeps the score of a claimed or deferred thread: its lease holder re-checks the
# pending list on release, so nothing waits behind a claim.
ENQUEUE_LUA = """
local seq = tonumber(redis.call('HGET', KEYS[2], 'seq') or '0')
for i = 3, #ARGV do
  seq = seq + 1
  redis.call('RPUSH', KEYS[1], '{"seq":' .. seq .. ',' .. string.sub(ARGV[i], 2))
end
redis.call('HSET', KEYS[2], 'seq', seq)
redis.call('ZADD', KEYS[3], 'NX', ARGV[2], ARGV[1])
return seq
"""


class Enqueuer:
    """Queues messages for the worker; a failure is logged (ids, counts) and reported."""

    def __init__(self, settings: Settings, *, redis: aioredis.Redis | None = None) -> None:
        """``redis``: a client to use instead of one per event loop made from the settings."""
        self._settings = settings
        self._keys = Keys(settings.key_prefix)
        self._given = redis
        self._client = PerLoop(self._connect)

    def _connect(self) -> tuple[aioredis.Redis, AsyncScript]:
        client = self._given or redis_client(
            self._settings.redis_url, timeout=self._settings.enqueue_timeout
        )
        return client, client.register_script(ENQUEUE_LUA)

    def redis(self) -> aioredis.Redis:
        """The running loop's client (the turn path's registry reads share it)."""
        return self._client.get()[0]

    async def enqueue(self, messages: Sequence[QueuedMessage]) -> bool:
        """Queue messages of one thread in order; True once Redis holds them."""
        if not messages:
            return True
        thread = messages[0].thread_key
        if any(m.thread_key != thread for m in messages):
            raise ValueError("enqueue takes messages of one thread at a time")
        too_long = [m for m in messages if len(m.content) > self._settings.max_queued_chars]
        if too_long:
            log.warning(
                "enqueue rejected thread=%s oversized=%d max_chars=%d",
                thread,
                len(too_long),
                self._settings.max_queued_chars,
            )
            return False
        _, script = self._client.get()
        try:
            async with asyncio.timeout(self._settings.enqueue_timeout):
                await script(
                    keys=[self._keys.pending(thread), self._keys.thread(thread), self._keys.ready],
                    args=[thread, int(time.time() * 1000), *(m.encode() for m in messages)],
                )
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning(
                "enqueue failed thread=%s messages=%d error=%s",
                thread,
                len(messages),
                type(exc).__name__,
            )
            return False
        return True

    async def aclose(self) -> None:
        held = self._client.pop_current()
        if held is not None and self._given is None:
            await held[0].aclose()
