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

Members made before tombstones were keyed (the bare signature), or under a key used before
(``tombstone_previous_keys``), still count: their fact cannot be digested again (it is
deleted), so each is replaced by its form under the key in use only when synthesis proposes
the fact again (the person's, in the flat layout only).

A key that changes without the one before in ``tombstone_previous_keys`` (a rotated Zep key,
a store copied without its ``meta``) leaves the old tombstones matching nothing: so every
worker records a fingerprint of its key (``Keys.tombstone_keys``), and a worker and
``afterthought status`` (``tombstone_key_changed``) say when a key used before is no longer
checked."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Iterable, Mapping

import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError

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
#: What a key's fingerprint digests: the fingerprint tells keys apart and reveals none.
FINGERPRINT_LABEL = b"afterthought tombstone key fingerprint v1"

log = logging.getLogger("afterthought.worker")
#: The unchecked keys a process has warned of (deployment, fingerprints): said once.
_warned: set[tuple[str, tuple[str, ...]]] = set()

# KEYS the key records; ARGV the fingerprint in use, the JSON list of those it covers. Redis'
# clock says which key was used last (by the worker that started last).
RECORD_LUA = """
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], '{"used":' .. ms .. ',"covers":' .. ARGV[2] .. '}')
return redis.call('HGETALL', KEYS[1])
"""

#: KEYS[4] the tombstone set; ARGV[4..] pairs (stale, current): each stale member (bare, or
#: under a key used before) replaced by its form under the key in use, while the run may
#: still write for the user (:data:`~afterthought.fence.GUARD`).
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


def fingerprint(key: bytes) -> str:
    return hmac.new(key, FINGERPRINT_LABEL, hashlib.sha256).hexdigest()[:32]


def unchecked(records: Mapping[bytes, bytes]) -> list[str]:
    """The fingerprints of keys used before that the key used last does not check (its
    ``covers``): their tombstones block nothing now."""
    used = {fp.decode(): json.loads(record) for fp, record in records.items()}
    if not used:
        return []
    last = max(used, key=lambda fp: int(used[fp]["used"]))
    covered = {last, *used[last]["covers"]}
    return sorted(fp for fp in used if fp not in covered)


def _marked(key: bytes, app: str, user_id: str, signature: str) -> str:
    message = json.dumps([app, user_id, signature], ensure_ascii=True).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


class Tombstones:
    def __init__(self, settings: Settings, redis: aioredis.Redis, backend: MemoryBackend) -> None:
        self.settings = settings
        self.redis = redis
        self.backend = backend
        self.keys = Keys.of(settings)
        self._key: bytes | None = None
        self._previous = [
            derive(p.get_secret_value().encode()) for p in settings.tombstone_previous_keys
        ]
        self._rekey = redis.register_script(REKEY_LUA)
        self._record = redis.register_script(RECORD_LUA)

    async def key(self) -> bytes:
        if self._key is None:
            key = await self._find_key()
            await self._check(key)
            self._key = key
        return self._key

    async def _check(self, key: bytes) -> None:
        """Record the key in use and say, once, when a key used before is not checked by
        this worker (``status`` judges by the key the workers last started with)."""
        checked = [fingerprint(key), *(fingerprint(k) for k in self._previous)]
        try:
            listed = await self._record(
                keys=[self.keys.tombstone_keys], args=[checked[0], json.dumps(checked[1:])]
            )
            used = listed[::2]
        except OutOfMemoryError:
            # At maxmemory a worker starts all the same; its key is recorded at its next start.
            used = await self.redis.hkeys(self.keys.tombstone_keys)
        lost = sorted({fp.decode() for fp in used} - set(checked))
        if lost and (self.keys.prefix, tuple(lost)) not in _warned:
            _warned.add((self.keys.prefix, tuple(lost)))
            log.warning(
                "tombstone key changed: the tombstones of %d key(s) used before keep nothing"
                " forgotten; set tombstone_previous_keys to the key(s) used before (README,"
                " Forgetting)",
                len(lost),
            )

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
        return _marked(await self.key(), app, user_id, signature)

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
        reading (or, for a tombstone made before readings were, signature) has a tombstone
        under the key in use, under a key used before (``tombstone_previous_keys``), or
        bare. A member met in a form but the key in use's is replaced by that form (under
        ``fence``: never after a forget of the user); in the person's set only in the flat
        layout (in a sharded one it is in another slot than the fence's keys: its members
        made under a key used before keep counting as they are)."""
        held = {t.decode() for t in await self.redis.smembers(self.keys.tombstones(app, user_id))}
        person = self.person(app, user_id)
        theirs = {t.decode() for t in await self.redis.smembers(person[0])} if person else set()
        if not (held or theirs):
            return set()
        found: set[str] = set()
        stale: list[str] = []
        stale_person: list[str] = []
        for fact in {f.signature: f for f in facts}.values():
            signature, read = fact.signature, reads_as(fact)
            mark = await self.mark(app=app, user_id=user_id, signature=read)
            current = {mark, await self.mark(app=app, user_id=user_id, signature=signature)}
            if person is not None:
                ours = await self.mark(app="", user_id=person[1], signature=read)
                current.add(ours)
                before = [_marked(k, "", person[1], read) for k in self._previous]
                if not current & (held | theirs) and (old := set(before) & theirs):
                    found.add(signature)
                    stale_person += [old.pop(), ours]
                    continue
            if current & (held | theirs):
                found.add(signature)
                continue
            older = [
                signature,
                *(_marked(k, app, user_id, s) for k in self._previous for s in (signature, read)),
            ]
            for member in older:
                if member in held:
                    found.add(signature)
                    stale += [member, mark]
                    break
        if stale and fence is not None:
            await fence.write(self.redis, self._rekey, [self.keys.tombstones(app, user_id)], stale)
        # In one script with the fence's keys only where no slots part them (the flat layout).
        if stale_person and person is not None and fence is not None and not self.keys.shards:
            await fence.write(self.redis, self._rekey, [person[0]], stale_person)
        return found

    async def drop_person(self, *, app: str, user_id: str) -> None:
        """The person's set goes with the person (their forget, or their backend user
        deleted elsewhere); the user's own set goes with the user's other keys."""
        person = self.person(app, user_id)
        if person is not None:
            await self.redis.delete(person[0])
