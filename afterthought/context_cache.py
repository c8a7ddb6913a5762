"""The context-block cache (R2): per user, with a per-session overlay, in Redis.

The turn path reads both with one MGET; the worker writes them from
``add_messages(return_context=True)``; the agent reads through on a miss and refreshes a
stale block in the background. Writes are versioned: an older block never replaces a
newer one, whichever process writes last."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from afterthought.keys import Keys
from afterthought.settings import Settings

# KEYS the entries; ARGV version, written_ms, block, ttl_ms. Keeps the newest version.
WRITE_LUA = """
for i, key in ipairs(KEYS) do
  local current = redis.call('GET', key)
  local version = current and tonumber(string.match(current, '^(%d+)\\n'))
  if not version or version < tonumber(ARGV[1]) then
    redis.call('SET', key, ARGV[1] .. '\\n' .. ARGV[2] .. '\\n' .. ARGV[3], 'PX', ARGV[4])
  end
end
return 1
"""


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


def now_version() -> int:
    """Versions are microseconds: a later write wins, even within the same millisecond."""
    return time.time_ns() // 1000


class ContextCache:
    def __init__(self, settings: Settings) -> None:
        self._keys = Keys(settings.key_prefix)
        self._ttl_ms = int(settings.context_ttl_seconds * 1000)

    async def read(
        self, redis: aioredis.Redis, *, app: str, user_id: str, session_id: str
    ) -> CachedBlock | None:
        """The session's overlay if there is one (it is about this conversation), else the
        user's block — so a new session starts from what is known of the user."""
        overlay, user = await redis.mget(
            self._keys.context_thread(app, user_id, session_id),
            self._keys.context_user(app, user_id),
        )
        raw = overlay or user
        return CachedBlock.parse(raw) if raw else None

    async def write(
        self,
        redis: aioredis.Redis,
        *,
        app: str,
        user_id: str,
        session_id: str | None,
        block: str,
        version: int,
    ) -> None:
        keys = [self._keys.context_user(app, user_id)]
        if session_id is not None:
            keys.append(self._keys.context_thread(app, user_id, session_id))
        await redis.eval(
            WRITE_LUA, len(keys), *keys, version, int(time.time() * 1000), block, self._ttl_ms
        )

    async def delete(self, redis: aioredis.Redis, *, app: str, user_id: str) -> None:
        await redis.delete(self._keys.context_user(app, user_id))
