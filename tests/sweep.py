"""Sweeping a deployment for a user's words: every Redis key (all types, arq's job keys
included) and the bytes of the local store's files, or what the Zep fake stores; and a
pause point to interleave a worker with a forget deterministically."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import redis.asyncio as aioredis

from afterthought.settings import Settings
from afterthought.testing import ZepFake


async def redis_hits(redis: aioredis.Redis, prefix: str, words: list[str]) -> dict[str, list[str]]:
    """Every key under the prefix (its shards' included, and arq's keys naming it), all
    types, as bytes."""
    hits: dict[str, list[str]] = {}
    keys = [k async for k in redis.scan_iter(match=f"{prefix}:*", count=1000)]
    # A sharded layout's keys begin with their shard's hash tag, ``{prefix:s:x}``.
    keys += [k async for k in redis.scan_iter(match=f"{{{prefix}:*", count=1000)]
    keys += [k async for k in redis.scan_iter(match=f"arq:*{prefix}:*", count=1000)]
    for key in keys:
        kind = (await redis.type(key)).decode()
        if kind == "string":
            blobs = [await redis.get(key) or b""]
        elif kind == "list":
            blobs = await redis.lrange(key, 0, -1)
        elif kind == "set":
            blobs = list(await redis.smembers(key))
        elif kind == "zset":
            blobs = [m for m, _ in await redis.zrange(key, 0, -1, withscores=True)]
        elif kind == "hash":
            blobs = [b for kv in (await redis.hgetall(key)).items() for b in kv]
        elif kind == "stream":
            blobs = [
                b for _, fields in await redis.xrange(key) for kv in fields.items() for b in kv
            ]
        else:
            blobs = []
        blob = (b"\n".join(blobs) + key).lower()
        found = [w for w in words if w.lower().encode() in blob]
        if found:
            hits[key.decode()] = found
    return hits


def file_hits(
    settings: Settings, words: list[str], zep_fake: ZepFake | None = None
) -> dict[str, list[str]]:
    """Words in the local store's files (the database, its WAL and shared memory), or in
    what the Zep fake stores (users, threads, messages, episodes, edges; not its log of
    the requests it received)."""
    blobs: dict[str, bytes] = {}
    if zep_fake is not None:
        stored = [
            zep_fake.users(),
            zep_fake.threads(),
            zep_fake.messages(),
            zep_fake.episodes(),
            zep_fake.edges(),
        ]
        blobs["zep"] = json.dumps(stored).encode()
    else:
        base = Path(settings.local_db_path)
        for path in (base, Path(f"{base}-wal"), Path(f"{base}-shm")):
            if path.exists():
                blobs[path.name] = path.read_bytes()
    hits: dict[str, list[str]] = {}
    for name, data in blobs.items():
        found = [w for w in words if w.lower().encode() in data.lower()]
        if found:
            hits[name] = found
    return hits


class Gate:
    """A pause point: ``reached`` is set when the code arrives, it waits for ``go``."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.go = asyncio.Event()

    async def wait(self) -> None:
        self.reached.set()
        await self.go.wait()
