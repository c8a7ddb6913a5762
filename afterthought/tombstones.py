"""What a forgotten fact leaves so synthesis never writes it again: a keyed digest of the
fact's signature (:func:`~afterthought.facts.fact_signature`) in the set of whom the fact
is of — the person a user id names in every app (``Keys.tombstones_person``) or, with
users shared, in every sharing deployment (``Keys.tombstones_shared``): each app's
synthesis reads the person's messages of every app. The user's own set
(``Keys.tombstones``) where apps keep users apart, and read always (tombstones written
before the person's set).

Keyed, because the signature itself is a plain hash of the fact: whoever reads Redis could
hash a guess ("ada allergic_to peanuts") and find it in the set. The key is never in Redis:

- ``tombstone_key`` when set (every worker of a deployment sets the same);
- else a random key the store keeps with the memory (the local and PostgreSQL stores: a
  reader of the store reads the facts themselves, so it learns nothing more there);
- else (Zep) one derived from ``zep_api_key``, which every worker holds anyway (deployments
  that share users on Zep with keys of their own set the same ``tombstone_key``).

Members made before tombstones were keyed (the bare signature) still count: their fact
cannot be digested again (it is deleted), so each is replaced by its keyed form only when
synthesis proposes the fact again."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable

import redis.asyncio as aioredis

from afterthought.backends.base import MemoryBackend
from afterthought.facts import Fact, StoredFact, fact_signature
from afterthought.fence import GUARD, Fence
from afterthought.forget_marks import person_of
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.validation import normalise

#: The label a key is derived under: a key given for another use (the Zep key) never
#: digests tombstones itself.
LABEL = b"afterthought tombstones v1"
#: Where the local and PostgreSQL stores keep their key (their ``meta`` table).
STORE_SECRET = "tombstone_key"

#: KEYS[4] the tombstone set; ARGV[4..] pairs (bare, keyed): each bare member replaced by
#: its keyed form, while the run may still write for the user (:data:`~afterthought.fence.GUARD`).
REKEY_LUA = (
    GUARD
    + """
for i = 4, #ARGV, 2 do
  if redis.call('SREM', KEYS[4], ARGV[i]) == 1 then
    redis.call('SADD', KEYS[4], ARGV[i + 1])
  end
end
return 0
"""
)


def reads_as(fact: Fact | StoredFact) -> str:
    """What the fact reads as: its signature over what a reader sees of its subject and
    value (:func:`~afterthought.validation.normalise`: no zero-width characters, look-alikes
    and diacritics folded), so "crème fraîche" said again as "creme fraiche" (or with a
    zero-width space, or a Cyrillic letter for a Latin one) is the forgotten fact."""
    return fact_signature(normalise(fact.subject), fact.predicate, normalise(fact.value))


class NoTombstoneKey(RuntimeError):
    """No key can be had: no ``tombstone_key``, a store that keeps none, and no Zep key."""


def derive(secret: bytes) -> bytes:
    return hmac.new(secret, LABEL, hashlib.sha256).digest()


class Tombstones:
    def __init__(self, settings: Settings, redis: aioredis.Redis, backend: MemoryBackend) -> None:
        self.settings = settings
        self.redis = redis
        self.backend = backend
        self.keys = Keys.of(settings)
        self._key: bytes | None = None
        self._rekey = redis.register_script(REKEY_LUA)

    async def key(self) -> bytes:
        if self._key is None:
            self._key = await self._find_key()
        return self._key

    async def _find_key(self) -> bytes:
        if self.settings.tombstone_key is not None:
            return derive(self.settings.tombstone_key.get_secret_value().encode())
        kept = await self.backend.kept_secret(STORE_SECRET)
        if kept is not None:
            return derive(kept.encode())
        if self.settings.zep_api_key is not None:
            return derive(self.settings.zep_api_key.get_secret_value().encode())
        raise NoTombstoneKey("set tombstone_key (AFTERTHOUGHT_TOMBSTONE_KEY)")

    async def mark(self, *, app: str, user_id: str, signature: str) -> str:
        """The member a fact of this signature leaves in the user's set: per user, so one
        fact forgotten by two users leaves two members no one can tell are the same."""
        message = json.dumps([app, user_id, signature], ensure_ascii=True).encode()
        return hmac.new(await self.key(), message, hashlib.sha256).hexdigest()

    def person(self, app: str, user_id: str) -> tuple[str, str] | None:
        """The set of the user's person (:func:`~afterthought.forget_marks.person_of`) and
        whom its marks are made of; None where apps keep users apart."""
        person = person_of(self.settings, app=app, user_id=user_id)
        if person is None:
            return None
        store, who = person
        if store is None:
            return self.keys.tombstones_person(who), who
        return Keys.tombstones_shared(store, who), who

    async def add(self, *, app: str, user_id: str, fact: Fact | StoredFact) -> None:
        """The fact's tombstone: of what it reads as (:func:`reads_as`)."""
        signature = reads_as(fact)
        person = self.person(app, user_id)
        if person is None:
            mark = await self.mark(app=app, user_id=user_id, signature=signature)
            await self.redis.sadd(self.keys.tombstones(app, user_id), mark)
        else:
            key, who = person
            await self.redis.sadd(key, await self.mark(app="", user_id=who, signature=signature))

    async def forgotten(
        self, *, app: str, user_id: str, facts: Iterable[Fact], fence: Fence | None = None
    ) -> set[str]:
        """The signatures of those of ``facts`` the user (or their person) forgot: whose
        reading, or (a tombstone made before readings were) signature, has a tombstone. A
        bare member met is replaced by its keyed form (under ``fence``: never after a
        forget of the user)."""
        held = {t.decode() for t in await self.redis.smembers(self.keys.tombstones(app, user_id))}
        person = self.person(app, user_id)
        theirs = {t.decode() for t in await self.redis.smembers(person[0])} if person else set()
        if not (held or theirs):
            return set()
        found: set[str] = set()
        bare: list[str] = []
        for fact in {f.signature: f for f in facts}.values():
            signature, read = fact.signature, reads_as(fact)
            mark = await self.mark(app=app, user_id=user_id, signature=signature)
            marks = {mark, await self.mark(app=app, user_id=user_id, signature=read)}
            if person is not None:
                marks |= {await self.mark(app="", user_id=person[1], signature=read)}
            if marks & (held | theirs):
                found.add(signature)
            elif signature in held:
                found.add(signature)
                bare += [signature, mark]
        if bare and fence is not None:
            await fence.write(self.redis, self._rekey, [self.keys.tombstones(app, user_id)], bare)
        return found

    async def drop_person(self, *, app: str, user_id: str) -> None:
        """The person's set goes with the person (their forget, or their backend user
        deleted elsewhere); the user's own set goes with the user's other keys."""
        person = self.person(app, user_id)
        if person is not None:
            await self.redis.delete(person[0])
