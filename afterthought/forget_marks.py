"""A forget's marks, kept where every process reaches them: a user being forgotten, their
epoch raised, the time of it (for the user and, with users shared across apps, their
person). The worker's forget sets them; a provisioning anywhere that raced a forget and
could not take back what it made records the forget pending again (:func:`reopen`)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis.asyncio as aioredis

from afterthought.context_cache import PENDING, ContextCache
from afterthought.keys import Keys, digest
from afterthought.queue import FORGOT_KEEP_MS
from afterthought.settings import Settings
from afterthought.shared_store import store_name

log = logging.getLogger("afterthought.worker.forget")

#: forget's marks: the user is being forgotten, and their epoch is at least the one the
#: forget recorded (raised once however often a resume repeats it, so what they said since
#: stays) — and, as it is raised, when (Redis' clock: one clock for every forgetter), so the
#: enqueue script refuses what an agent made before, however late it comes.
MARK_LUA = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[3]) then
  redis.call('SET', KEYS[2], ARGV[3])
  local now = redis.call('TIME')
  local ms = string.format('%d', now[1] * 1000 + math.floor(now[2] / 1000))
  redis.call('SET', KEYS[3], ms, 'PX', ARGV[4])
end
return redis.call('GET', KEYS[3])
"""
#: KEYS a person's forget time; ARGV a forget's time ('' for now, by Redis' clock),
#: keep_ms. The latest of the two stays.
PERSON_LUA = """
local at = ARGV[1]
if at == '' then
  local now = redis.call('TIME')
  at = string.format('%d', now[1] * 1000 + math.floor(now[2] / 1000))
end
if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(at) then
  redis.call('SET', KEYS[1], at, 'PX', ARGV[2])
end
"""
#: A forget's mark outlives a stopped process this long; a worker resumes it before then.
PENDING_MARK_MS = 24 * 3600 * 1000


async def marks(redis: aioredis.Redis, settings: Settings, record: dict[str, Any]) -> None:
    """Mark the user of a recorded forget as being forgotten, with its epoch (a record of
    an earlier version has none: its forget raised the epoch itself)."""
    app, user_id = record["app"], record["user_id"]
    k = Keys.of(settings)
    forgot = await redis.register_script(MARK_LUA)(
        keys=[k.forgetting(app, user_id), k.epoch(app, user_id), k.forgot(app, user_id)],
        args=[PENDING, PENDING_MARK_MS, int(record.get("epoch", 0)), FORGOT_KEEP_MS],
    )
    person = person_key(settings, app=app, user_id=user_id)
    if person is not None and forgot is not None:
        # Before any wait or purge: a worker of another app the registry does not map to
        # them yet (turns still queued there) drops what they said before it; and such an
        # app no longer finds them under their person (as it reads them).
        await redis.register_script(PERSON_LUA)(keys=[person], args=[forgot, FORGOT_KEEP_MS])
        await redis.delete(k.person(user_id))


async def reopen(redis: aioredis.Redis, settings: Settings, *, app: str, user_id: str) -> None:
    """A write for the user raced their forget and may have landed after its deletion (or
    what it wrote could not be taken back): the forget is pending again (under the epoch
    it raised, so what the user said since stays queued; ``status`` counts it), and a
    worker does it again (``Forgetter.resume_pending``), finding the backend user by id."""
    epoch = await ContextCache(settings).epoch(redis, app=app, user_id=user_id)
    record = {"app": app, "user_id": user_id, "since": int(time.time() * 1000), "epoch": epoch}
    await redis.hset(Keys.of(settings).forgets, digest(app, user_id), json.dumps(record))
    await marks(redis, settings, record)
    log.warning("forget reopened user=%s: a write raced it", digest(app, user_id))


def person_of(settings: Settings, *, app: str, user_id: str) -> tuple[str | None, str] | None:
    """Whom a user id names beyond its app: with a ``zep_user_id_template`` without
    ``{deployment}``, a backend user of every deployment that shares users on the store
    (the store's name, the backend user id); without ``{app}``, one person in every app of
    the deployment (None, the user id); None when the template keeps apps apart."""
    if settings.users_shared:
        assert settings.zep_user_id_template is not None  # no default shares users
        named = settings.zep_user_id(
            app=app, user_id=user_id, template=settings.zep_user_id_template
        )
        return store_name(settings), named
    return None if settings.apps_apart else (None, user_id)


async def person_pending(
    redis: aioredis.Redis, settings: Settings, *, app: str, user_id: str
) -> bool:
    """Whether a forget of the person the user id names (:func:`person_of`) is pending in
    this deployment, begun in any app: the forgetting mark is set in the apps the registry
    maps them to, and until the backend's deletion is done a reader of another app (no
    registry entry of theirs) would find them in the backend by their name."""
    person = person_of(settings, app=app, user_id=user_id)
    if person is None:
        return False
    for raw in await redis.hvals(Keys.of(settings).forgets):
        record = json.loads(raw)
        if person_of(settings, app=record["app"], user_id=record["user_id"]) == person:
            return True
    return False


def person_key(settings: Settings, *, app: str, user_id: str) -> str | None:
    """Where a forget of the user's person (:func:`person_of`) is timed: forgetting them
    in one app forgets them in all, and with users shared, in every sharing deployment
    (``Keys.forgot_shared``, by the store and the backend user id)."""
    person = person_of(settings, app=app, user_id=user_id)
    if person is None:
        return None
    store, who = person
    return Keys.of(settings).forgot_person(who) if store is None else Keys.forgot_shared(store, who)
