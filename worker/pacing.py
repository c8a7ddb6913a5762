"""Pacing shared by every worker through Redis: a pause after 401/403 (a bad key must not
dead-letter the world) and a rate-limit gate after a 429."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import redis.asyncio as aioredis

from afterthought.backends.base import BackendError
from afterthought.keys import Keys

log = logging.getLogger("afterthought.worker")

# Keep the later of two deadlines: one worker's short Retry-After must not shorten another's.
HOLD_LUA = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
"""

#: A gate shorter than this is waited out in the job; a longer one defers the thread.
MAX_IN_JOB_WAIT = 2.0


class Pacing:
    def __init__(self, redis: aioredis.Redis, keys: Keys, *, pause_seconds: float) -> None:
        self._redis = redis
        self._keys = keys
        self._pause_ms = int(pause_seconds * 1000)
        self._hold = redis.register_script(HOLD_LUA)

    async def paused(self) -> bool:
        return bool(await self._redis.exists(self._keys.paused))

    async def pause(self, error: BackendError) -> None:
        reason = json.dumps({"reason": str(error), "at": int(time.time() * 1000)})
        await self._redis.set(self._keys.paused, reason, px=self._pause_ms)
        log.error(
            "consumption paused for all workers: backend refused the key (%s); retrying in %.0fs",
            error,
            self._pause_ms / 1000,
        )

    async def hold(self, seconds: float) -> None:
        """After a 429: no worker calls the backend for ``seconds``."""
        until = int((time.time() + seconds) * 1000)
        await self._hold(keys=[self._keys.rate_limit], args=[until, max(1, int(seconds * 1000))])

    async def wait(self) -> None:
        """Before a backend call: wait out a short gate; a long one defers the thread."""
        raw = await self._redis.get(self._keys.rate_limit)
        left = (int(raw) / 1000 - time.time()) if raw else 0.0
        if left <= 0:
            return
        if left > MAX_IN_JOB_WAIT:
            raise BackendError("rate_limited", code="shared limiter", retry_after=left)
        await asyncio.sleep(left)
