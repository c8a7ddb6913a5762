"""The audit log: every write and delete the worker makes, append-only and bounded (a
Redis stream with MAXLEN). Entries carry ids, a keyed HMAC of the content (a plain hash of
a short text is guessable) and the outcome — never the content."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from afterthought.keys import Keys
from afterthought.settings import Settings


@dataclass(frozen=True, slots=True)
class Entry:
    job: str
    """flush, synthesize, forget..."""
    op: str
    """add_message, write_fact, invalidate_fact, quarantine, delete_fact, forget_user..."""
    user: str
    """Digest of (app, user id)."""
    outcome: str
    thread: str = ""
    key: str = ""
    """Message key or fact id."""
    content: str = ""
    """Only ever stored as its HMAC."""
    trust: str = ""


class AuditLog:
    def __init__(self, redis: aioredis.Redis, settings: Settings) -> None:
        self._redis = redis
        self._keys = Keys(settings.key_prefix)
        self._maxlen = settings.audit_max_entries
        self._secret = (
            settings.audit_key.get_secret_value().encode() if settings.audit_key else None
        )

    async def _key(self) -> bytes:
        """``audit_key`` from the settings; without one, a random key kept in Redis (set
        ``AFTERTHOUGHT_AUDIT_KEY`` in production, so the key is not beside the log)."""
        if self._secret is None:
            await self._redis.set(self._keys.audit_key, secrets.token_hex(32), nx=True)
            self._secret = (await self._redis.get(self._keys.audit_key)) or b""
        return self._secret

    async def record(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        key = await self._key()
        now = str(int(time.time() * 1000))
        async with self._redis.pipeline(transaction=False) as pipe:
            for e in entries:
                mac = (
                    hmac.new(key, e.content.encode(), hashlib.sha256).hexdigest()
                    if e.content
                    else ""
                )
                pipe.xadd(
                    self._keys.audit,
                    {
                        "at": now,
                        "job": e.job,
                        "op": e.op,
                        "user": e.user,
                        "thread": e.thread,
                        "key": e.key,
                        "hmac": mac,
                        "trust": e.trust,
                        "outcome": e.outcome,
                    },
                    maxlen=self._maxlen,
                    approximate=True,
                )
            await pipe.execute()
