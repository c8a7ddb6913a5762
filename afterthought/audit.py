"""The audit log: every write and delete the worker makes, append-only and bounded (a
Redis stream with MAXLEN). Entries carry ids, keyed HMACs of the user reference and of the
content (a plain hash of a user id or a short text is guessable) and the outcome — never
the content.

The key comes from the environment (``AFTERTHOUGHT_AUDIT_KEY``), never from Redis: with
it beside the log, whoever reads Redis could tie entries to a forgotten user again. With
no key, the audit log is off (said once at start)."""

from __future__ import annotations

import hashlib
import hmac
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
    """Digest of (app, user id); the log keeps only its HMAC."""
    outcome: str
    thread: str = ""
    """Thread key; the log keeps only its HMAC."""
    key: str = ""
    """Message key or fact id."""
    content: str = ""
    """Only ever stored as its HMAC."""
    trust: str = ""


class AuditLog:
    def __init__(self, redis: aioredis.Redis, settings: Settings) -> None:
        self._redis = redis
        self._keys = Keys.of(settings)
        self._maxlen = settings.audit_max_entries
        self._secret = (
            settings.audit_key.get_secret_value().encode() if settings.audit_key else None
        )

    @property
    def enabled(self) -> bool:
        return self._secret is not None

    def _mac(self, text: str) -> str:
        assert self._secret is not None
        return hmac.new(self._secret, text.encode(), hashlib.sha256).hexdigest()

    async def record(self, entries: Sequence[Entry]) -> None:
        if not entries or self._secret is None:
            return
        now = str(int(time.time() * 1000))
        async with self._redis.pipeline(transaction=False) as pipe:
            for e in entries:
                pipe.xadd(
                    self._keys.audit,
                    {
                        "at": now,
                        "job": e.job,
                        "op": e.op,
                        "user": self._mac(e.user)[:32],
                        # A thread key is a plain digest of ids, guessable for a user's
                        # memory thread: keyed like the user.
                        "thread": self._mac(e.thread)[:24] if e.thread else "",
                        "key": e.key,
                        "hmac": self._mac(e.content) if e.content else "",
                        "trust": e.trust,
                        "outcome": e.outcome,
                    },
                    maxlen=self._maxlen,
                    approximate=True,
                )
            await pipe.execute()
