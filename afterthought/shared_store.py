"""Agent and worker must use one local store: a new session's block is what the worker
wrote there. A relative path, another working directory or another machine silently
gives the agent an empty store of its own. So each worker announces its store in Redis
(the file's id and path), and an agent compares its own once and warns when it is not
among them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from redis.asyncio import Redis
from redis.exceptions import RedisError

from afterthought.backends.base import MemoryBackend
from afterthought.keys import Keys
from afterthought.settings import Settings

if TYPE_CHECKING:
    from afterthought.backends.local import LocalBackend

log = logging.getLogger("afterthought.store")

#: A running worker announces its store this often...
ANNOUNCE_EVERY_SECONDS = 60.0
#: ...and an announcement counts this long: a store no worker has used lately is not one
#: an agent should be reading (an old file left behind by last week's deployment).
ANNOUNCED_SECONDS = 3 * ANNOUNCE_EVERY_SECONDS


def announced_stores(entries: Mapping[bytes, bytes], *, now: float) -> dict[str, str]:
    """Store id -> path, of the stores workers announced lately (an entry a worker)."""
    found = {}
    for raw in entries.values():
        try:
            entry = json.loads(raw)
            if now - float(entry["at"]) <= ANNOUNCED_SECONDS:
                found[str(entry["store"])] = str(entry["path"])
        except (ValueError, KeyError, TypeError):
            continue  # not an announcement of ours: nothing to compare with
    return found


async def announce(
    redis: Redis, settings: Settings, backend: MemoryBackend, *, worker: str
) -> None:
    """The worker's side: its store joins the deployment's list, with the time; an error
    in the log while another worker of the deployment announced another store (its users'
    turns land in two files, and each agent reads one)."""
    from afterthought.backends.local import LocalBackend  # the local adapter, when used

    if not isinstance(backend, LocalBackend):
        return
    key = Keys.of(settings).stores
    store = await backend.store_id()
    entry = json.dumps({"store": store, "path": str(backend.path), "at": time.time()})
    try:
        others = announced_stores(await redis.hgetall(key), now=time.time())
        # Not a transaction (a cluster client refuses one): a stop between the two leaves
        # the list without its expiry until the next announcement, and a stale entry in it
        # counts for nothing (``announced_stores`` reads its time).
        async with redis.pipeline(transaction=False) as pipe:
            pipe.hset(key, worker, entry)
            pipe.expire(key, int(ANNOUNCED_SECONDS))
            await pipe.execute()
    except RedisError as exc:  # a full Redis must not keep a worker from draining it
        log.warning("local store not announced path=%s error=%s", backend.path, type(exc).__name__)
        return
    others.pop(store, None)
    if others:
        log.error(
            "workers of this deployment use different local stores: this=%s others=%s; give"
            " every worker and agent the same absolute AFTERTHOUGHT_LOCAL_DB_PATH",
            backend.path,
            ",".join(sorted(others.values())),
        )
    log.debug("local store id=%s path=%s", store, backend.path)


async def announce_forever(
    redis: Redis, settings: Settings, backend: MemoryBackend, *, worker: str
) -> None:
    """A running worker's store stays announced as long as it runs."""
    while True:
        await asyncio.sleep(ANNOUNCE_EVERY_SECONDS)
        await announce(redis, settings, backend, worker=worker)


async def withdraw(redis: Redis, settings: Settings, *, worker: str) -> None:
    """A worker that stops takes its announcement back (one that is killed leaves it to
    expire), so a store nobody writes any more stops counting at once."""
    with contextlib.suppress(RedisError):
        await redis.hdel(Keys.of(settings).stores, worker)


async def elsewhere(redis: Redis, settings: Settings, backend: LocalBackend) -> list[str] | None:
    """The paths of the stores workers announced lately when this process's store is not
    one of them (an empty list when it is; None when none was announced). A file that is
    not there is not created to find out."""
    # First: a store awaiting an upgrade says so here.
    mine = await backend.store_id() if backend.path.exists() else None
    stored = await redis.hgetall(Keys.of(settings).stores)
    announced = announced_stores(stored, now=time.time())
    if not announced:
        return None
    return [] if mine in announced else sorted(announced.values())


async def matches(redis: Redis, settings: Settings, backend: LocalBackend) -> bool | None:
    """The agent's side: False (and a warning) when workers announced stores lately and
    this process's is not one of them; True when it is; None when none was announced
    (nothing to compare with yet)."""
    others = await elsewhere(redis, settings, backend)
    if others is None:
        return None
    if others:
        log.warning(
            "agent and worker use different local stores: agent=%s worker=%s; give both the"
            " same absolute AFTERTHOUGHT_LOCAL_DB_PATH",
            backend.path,
            ",".join(others),
        )
    return not others
