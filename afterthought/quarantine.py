"""The quarantine: proposed memories that validation refused, kept for an operator to see
and decide (``afterthought quarantine list / release / drop``). Never written to memory
unless released.

A Redis LIST per shard (``Keys.quarantine``, in its users' slot) of JSON entries, newest
last, trimmed to a bound; a job adds its user's entries in a script that checks the job
still may write for them (:mod:`afterthought.fence`). Each
entry: ``id``, ``app``, ``user_id``, ``user`` (the digest of app and user id that the rest
of the system uses to refer to a user), ``reason``, ``trust``, ``text`` (the fact as it
would be stored), ``at`` (ms), ``key`` (the message or source keys), and — for a synthesis
proposal — ``fact``, its structured form. The entry holds the user's words: forgetting a
user drops their entries (:meth:`Quarantine.drop_user`)."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis.asyncio as aioredis

from afterthought.contract import MEMORY_SESSION, QueuedMessage
from afterthought.facts import fact_signature
from afterthought.fence import GUARD, Fence
from afterthought.keys import Keys, digest
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings
from afterthought.validation import OPERATOR

#: Entries kept for review (per shard); older ones are trimmed.
QUARANTINE_MAX = 10_000

# KEYS the fence's (see GUARD), the user's shard's list; ARGV the fence's, the bound, then
# the entries. 1, or -1 when the job may no longer write.
ADD_LUA = (
    GUARD
    + """
redis.call('RPUSH', KEYS[4], unpack(ARGV, 5))
redis.call('LTRIM', KEYS[4], -tonumber(ARGV[4]), -1)
return 1
"""
)


#: The reason listed for a quarantine entry that cannot be read.
UNREADABLE_ENTRY = "unreadable entry"


@dataclass(frozen=True)
class Entry:
    """One refused proposal."""

    app: str
    user_id: str
    text: str
    reason: str
    trust: str
    key: str = ""
    """Message key of a queued fact, or the source message keys of a synthesis proposal."""
    fact: dict[str, Any] | None = None
    """A synthesis proposal's structured form (subject, predicate, value...)."""
    zep_user_uuid: str | None = None
    """Identity the application pinned on a queued fact: a release writes there too."""
    zep_graph_uuid: str | None = None
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    at: int = field(default_factory=lambda: int(time.time() * 1000))

    @property
    def user(self) -> str:
        return digest(self.app, self.user_id)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "user": self.user})

    @classmethod
    def parse(cls, raw: bytes | str) -> Entry:
        """Never raises: an entry that cannot be read is listed as of nobody, with
        :data:`UNREADABLE_ENTRY` as its reason and an id of its bytes (to drop it by), so
        one cannot stop a listing or a forget."""
        try:
            return cls._parse(raw)
        except (ValueError, TypeError, AttributeError):  # not JSON, not an object, bad fields
            data = raw.encode() if isinstance(raw, str) else raw
            unreadable = hashlib.sha256(data).hexdigest()[:16]
            return cls(
                app="", user_id="", text="", reason=UNREADABLE_ENTRY, trust="", id=unreadable, at=0
            )

    @classmethod
    def _parse(cls, raw: bytes | str) -> Entry:
        data = json.loads(raw)
        fact = data.get("fact")
        return cls(
            app=data.get("app", ""),
            user_id=data.get("user_id", ""),
            # Entries of earlier versions carried only the proposal.
            text=data.get("text") or (fact or {}).get("value", ""),
            reason=data.get("reason", ""),
            trust=data.get("trust") or (fact or {}).get("trust", ""),
            key=data.get("key", ""),
            fact=fact,
            zep_user_uuid=data.get("zep_user_uuid"),
            zep_graph_uuid=data.get("zep_graph_uuid"),
            id=data.get("id", ""),
            at=int(data.get("at", 0)),
        )


class Quarantine:
    def __init__(self, redis: aioredis.Redis, settings: Settings) -> None:
        self._redis = redis
        self._settings = settings
        self._keys = Keys.of(settings)
        self._add = redis.register_script(ADD_LUA)

    def _lists(self, shards: Sequence[int | None]) -> list[str]:
        """The lists of ``shards``; in a sharded layout the flat one too (entries from
        before the quarantine was per shard)."""
        k = self._keys
        return [k.quarantine(s) for s in shards] + ([k.quarantine(None)] if k.shards else [])

    async def add(self, entries: Sequence[Entry], *, fence: Fence) -> bool:
        """Record refused proposals of one user (and trim the oldest past the bound), if the
        job that found them still may write for the user; whether they were."""
        if not entries:
            return True
        (shard,) = {self._keys.shard_of(e.app, e.user_id) for e in entries}
        return await fence.write(
            self._redis,
            self._add,
            [self._keys.quarantine(shard)],
            [QUARANTINE_MAX, *(e.to_json() for e in entries)],
        )

    async def _raw(self) -> list[tuple[str, bytes, Entry]]:
        """Every entry, with its list, oldest first."""
        found = [
            (key, raw, Entry.parse(raw))
            for key in self._lists(self._keys.shard_ids)
            for raw in await self._redis.lrange(key, 0, -1)
        ]
        return sorted(found, key=lambda item: item[2].at)

    async def entries(
        self, *, app: str | None = None, user_id: str | None = None, limit: int | None = None
    ) -> list[Entry]:
        """Entries, oldest first (the newest ``limit`` of them); of one user with both
        ``app`` and ``user_id``."""
        found = [
            e
            for _, _, e in await self._raw()
            if (app is None or e.app == app) and (user_id is None or e.user_id == user_id)
        ]
        return found[-limit:] if limit else found

    async def get(self, entry_id: str) -> Entry | None:
        return next((e for _, _, e in await self._raw() if e.id == entry_id), None)

    async def release(self, entry_id: str) -> Entry | None:
        """Queue the entry's text as a ``fact`` of trust ``operator``, which the worker
        stores without validation (an operator read it and decided), then remove the
        entry. None if no such entry. Releasing twice queues it once: the queued fact's
        key is derived from the entry's id."""
        for key, raw, entry in await self._raw():
            if entry.id != entry_id:
                continue
            message = QueuedMessage.build(
                app=entry.app,
                user_id=entry.user_id,
                session_id=MEMORY_SESSION,
                invocation_id=f"fact:quarantine:{entry.id}",
                role="user",
                ordinal=0,
                content=entry.text,
                kind="fact",
                trust=OPERATOR,
                zep_user_uuid=entry.zep_user_uuid,
                zep_graph_uuid=entry.zep_graph_uuid,
            )
            queued = await ThreadQueue(self._redis, self._settings).enqueue(
                [message], now_ms=int(time.time() * 1000)
            )
            if queued < 0:
                raise RuntimeError(f"the queue refused the released fact (code {queued})")
            await self._redis.lrem(key, 1, raw)
            return entry
        return None

    async def drop(self, entry_id: str) -> bool:
        """Delete one entry for good; False if there was none."""
        for key, raw, entry in await self._raw():
            if entry.id == entry_id:
                return bool(await self._redis.lrem(key, 1, raw))
        return False

    async def drop_user(self, *, app: str, user_id: str, every_app: bool = False) -> int:
        """Delete every entry of one user (forgetting a user calls this), and with
        ``every_app`` every entry of their user id in any app (their person: a template
        without ``{app}``), whichever shard it is in; how many."""
        return await self._drop(app, user_id, every_app, lambda found: True)

    async def drop_fact(
        self, *, app: str, user_id: str, signature: str, every_app: bool = False
    ) -> int:
        """Delete the user's entries (with ``every_app``, their person's) that propose the
        fact of ``signature`` (forgetting that fact calls this); how many."""

        def proposes(found: dict[str, Any]) -> bool:
            fact = found.get("fact")
            return isinstance(fact, dict) and signature == fact_signature(
                str(fact.get("subject", "")),
                str(fact.get("predicate", "")),
                str(fact.get("value", "")),
            )

        return await self._drop(app, user_id, every_app, proposes)

    async def _drop(
        self, app: str, user_id: str, every_app: bool, chosen: Callable[[dict[str, Any]], bool]
    ) -> int:
        who = digest(app, user_id)
        shards = self._keys.shard_ids if every_app else [self._keys.shard_of(app, user_id)]
        dropped = 0
        for key in self._lists(shards):
            for raw in await self._redis.lrange(key, 0, -1):
                try:
                    found = json.loads(raw)
                except ValueError:  # unreadable: nobody's (listed for an operator to drop)
                    continue
                if not isinstance(found, dict):
                    continue
                # ``user``: entries of every version carry it; ``user_id`` this one's.
                theirs = found.get("user") == who or (every_app and found.get("user_id") == user_id)
                if theirs and chosen(found):
                    dropped += await self._redis.lrem(key, 1, raw)
        return dropped
