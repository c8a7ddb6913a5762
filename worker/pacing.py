"""Pacing shared by every worker through Redis: a pause after 401/403 (a bad key must not
dead-letter the world) and a rate-limit gate after a 429.

Both are read at most once per :data:`READ_SECONDS` per process (one round trip for the
two), not before every claim and every backend call: chat traffic sends a call every few
milliseconds, and the two reads were a fifth of the worker's Redis commands. What a worker
sets itself applies to it at once; a pause or hold set by *another* worker is honoured by
this one within :data:`READ_SECONDS` (a call already on its way goes on, as it always did).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable

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
#: How long a worker acts on what it last read of the pause and the gate: the bound on how
#: late it honours one another worker set.
READ_SECONDS = 0.25


class Pacing:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        *,
        pause_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``clock`` (monotonic seconds: when to read again) and ``sleep`` (a short gate's
        wait) let a test drive time."""
        self._redis = redis
        self._keys = keys
        self._pause_ms = int(pause_seconds * 1000)
        self._hold = redis.register_script(HOLD_LUA)
        self._clock = clock
        self._sleep = sleep
        self._read_at = -math.inf
        self._paused = False
        self._paused_until = -math.inf
        """This process paused: until when (on ``clock``), whatever it reads meanwhile."""
        self._gate_ms = 0
        """Wall-clock ms until which no backend call is made, as last read (0: none)."""
        self._held_ms = 0
        """... as this process set it: a read that was on its way meanwhile may miss it."""

    async def _read(self) -> None:
        """The shared state, unless read within :data:`READ_SECONDS`. Two keys of the
        deployment (in two slots on a cluster): one pipelined round trip."""
        now = self._clock()
        if now - self._read_at < READ_SECONDS:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.exists(self._keys.paused)
            pipe.get(self._keys.rate_limit)
            paused, gate = await pipe.execute()
        self._read_at = now
        self._paused = bool(paused)
        self._gate_ms = int(gate) if gate else 0

    async def paused(self) -> bool:
        if self._clock() < self._paused_until:
            return True
        await self._read()
        return self._paused

    async def pause(self, error: BackendError) -> None:
        reason = json.dumps({"reason": str(error), "at": int(time.time() * 1000)})
        await self._redis.set(self._keys.paused, reason, px=self._pause_ms)
        # Applies here at once, for as long as the shared pause lasts (the key expires).
        self._paused_until = self._clock() + self._pause_ms / 1000
        log.error(
            "consumption paused for all workers: backend refused the key (%s); retrying in %.0fs",
            error,
            self._pause_ms / 1000,
        )

    async def hold(self, seconds: float) -> None:
        """After a 429: no worker calls the backend for ``seconds``."""
        until = int((time.time() + seconds) * 1000)
        # Here at once, before (and whether or not) Redis takes it.
        self._held_ms = max(self._held_ms, until)
        await self._hold(keys=[self._keys.rate_limit], args=[until, max(1, int(seconds * 1000))])

    async def wait(self) -> bool:
        """Before a backend call: wait out a short gate (True if it slept); a long one
        defers the thread."""
        await self._read()
        gate = max(self._gate_ms, self._held_ms)
        left = (gate / 1000 - time.time()) if gate else 0.0
        if left <= 0:
            return False
        if left > MAX_IN_JOB_WAIT:
            raise BackendError("rate_limited", code="shared limiter", retry_after=left)
        await self._sleep(left)
        return True
