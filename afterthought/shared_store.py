"""Agent and worker must use one local store: a new session's block is what the worker
wrote there. A relative path, another working directory or another machine silently
gives the agent an empty store of its own. So each worker announces its store in Redis
(the file's id and path), and an agent compares its own once and warns when it is not
among them."""

from __future__ import annotations

import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError

from afterthought.backends.base import MemoryBackend
from afterthought.backends.local import LocalBackend
from afterthought.keys import Keys
from afterthought.settings import Settings

log = logging.getLogger("afterthought.store")

#: An announcement outlives a worker by this much (a restart renews it).
ANNOUNCED_SECONDS = 7 * 86400


async def announce(redis: Redis, settings: Settings, backend: MemoryBackend) -> None:
    """The worker's side: its store joins the deployment's list."""
    if not isinstance(backend, LocalBackend):
        return
    key = Keys(settings.key_prefix).stores
    store = await backend.store_id()
    try:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, store, str(backend.path))
            pipe.expire(key, ANNOUNCED_SECONDS)
            await pipe.execute()
    except RedisError as exc:  # a full Redis must not keep a worker from draining it
        log.warning("local store not announced path=%s error=%s", backend.path, type(exc).__name__)
        return
    log.info("local store id=%s path=%s", store, backend.path)


async def matches(redis: Redis, settings: Settings, backend: LocalBackend) -> bool:
    """The agent's side: False (and a warning) when workers announced stores and this
    process's is not one of them; True when it is, or when no worker announced any."""
    announced = {
        k.decode(): v.decode()
        for k, v in (await redis.hgetall(Keys(settings.key_prefix).stores)).items()
    }
    if not announced or await backend.store_id() in announced:
        return True
    log.warning(
        "agent and worker use different local stores: agent=%s worker=%s; give both the"
        " same absolute AFTERTHOUGHT_LOCAL_DB_PATH",
        backend.path,
        ",".join(sorted(announced.values())),
    )
    return False
