# ruff: noqa
"""Probe: a reshard 8 -> 16 where the two layouts share a shard tag keeps every key."""

import asyncio
from afterthought.connections import connect
from afterthought.keys import Keys, shard_tags
from afterthought.layout import carry


async def main():
    prefix = next(
        f"tb22d{n}"
        for n in range(1000)
        if set(shard_tags(f"tb22d{n}", 8)) & set(shard_tags(f"tb22d{n}", 16))
    )
    r = connect("redis://127.0.0.1:6379/0")
    old, new = Keys(prefix, 8), Keys(prefix, 16)
    users = [("app", f"u{i}") for i in range(300)]
    for a, u in users:
        await r.set(old.synthesized(a, u), "42")
        await r.sadd(old.tombstones(a, u), "m")
        await r.set(old.forgot(a, u), "1", px=600000)
    moved = await carry(r, old, new)
    ok = sum(
        [
            await r.get(new.synthesized(a, u)) == b"42"
            and await r.scard(new.tombstones(a, u)) == 1
            and 0 < await r.pttl(new.forgot(a, u))
            for a, u in users
        ]
    )
    print("prefix", prefix, "moved", moved, "users intact", ok, "of", len(users))
    async for k in r.scan_iter(match=f"*{prefix}*"):
        await r.delete(k)
    await r.aclose()


asyncio.run(main())
