"""The deployment's key layout, recorded in Redis: every process that touches the queue
must lay its keys out the same way (``redis_shards``), or messages would be queued where no
worker looks, and a flat layout cannot run on a cluster at all.

The first process to need it records its number of shards (``SET NX``, durable); every
process compares its own with the recorded one before it touches the queue."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from afterthought.connections import is_cluster
from afterthought.keys import Keys
from afterthought.settings import Settings


class LayoutMismatch(ValueError):
    """This process may not touch the deployment's queue; the message says what to set."""


async def check_layout(redis: aioredis.Redis, settings: Settings) -> None:
    """Record the layout if none is, else raise :class:`LayoutMismatch` unless it is ours;
    also when a ``redis://`` URL names a node of a cluster (its commands would fail one by
    one with MOVED or CROSSSLOT, which reads like an outage). Redis failures propagate."""
    keys = Keys.of(settings)
    if not is_cluster(redis):
        try:
            clustered = (await redis.info("cluster")).get("cluster_enabled")
        except ResponseError:  # INFO refused (an ACL, a stand-in server): cannot tell
            clustered = None
        if clustered:
            raise LayoutMismatch(
                "REDIS_URL names a node of a Redis Cluster: use redis+cluster://host:port,... "
                "with AFTERTHOUGHT_REDIS_SHARDS (and ARQ_REDIS_URL for arq's jobs)"
            )
    # Read first: at maxmemory a SET is refused even when it would write nothing, and a
    # worker must start there to drain (W9).
    recorded = await redis.get(keys.layout)
    if recorded is None and settings.redis_shards:
        await _no_flat_queue(redis, settings)
    if recorded is None:
        recorded = await redis.set(keys.layout, settings.redis_shards, nx=True, get=True)
    if recorded is not None and int(recorded) != settings.redis_shards:
        raise LayoutMismatch(
            f"the deployment's queue is laid out in {int(recorded)} shards, this process in "
            f"{settings.redis_shards}: set AFTERTHOUGHT_REDIS_SHARDS={int(recorded)}"
        )


async def _no_flat_queue(redis: aioredis.Redis, settings: Settings) -> None:
    """A deployment from before the layout was recorded has none, and its queue is flat:
    sharded processes would queue where its workers never look, and its messages would
    wait for good (and a session's new ones pass its old ones). One key at a time: on a
    cluster the three are in three slots."""
    flat = Keys(settings.key_prefix)
    held = (
        await redis.zcard(flat.ready())
        or int(await redis.get(flat.depth()) or 0)
        or await redis.llen(flat.dead())
    )
    if held:
        raise LayoutMismatch(
            "the deployment's queue holds messages in the flat layout (AFTERTHOUGHT_REDIS_SHARDS"
            "=0): stop the agents, let workers with 0 drain it, then run `afterthought reshard "
            "--to N` with 0 and start every process with N"
        )


async def carry(redis: aioredis.Redis, old: Keys, new: Keys) -> int:
    """Move the per-user keys a reshard keeps (``keys.RESHARDED``) from ``old``'s layout to
    ``new``'s, each with its lifetime; how many. One key at a time: on a cluster the two
    names are in two slots (the processes are stopped, so none writes meanwhile)."""
    moved = 0
    for pattern in old.resharded():
        async for raw in redis.scan_iter(match=pattern, count=1000):
            name = raw.decode()
            target = old.in_layout(name, new)
            # Two layouts may name a shard by the same tag: such a key stays where it is.
            if target is None or target == name:
                continue
            dumped, ttl = await redis.dump(name), await redis.pttl(name)
            if dumped is None or ttl == -2:  # expired meanwhile
                continue
            await redis.restore(target, max(ttl, 0), dumped, replace=True)
            await redis.delete(name)
            moved += 1
    return moved
