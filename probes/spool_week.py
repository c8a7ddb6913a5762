# ruff: noqa
"""A turn spooled, its machine away from Redis for 8 days (clocks right, no forget): replayed?"""

import asyncio, sys, tempfile, time
from pathlib import Path

import redis.asyncio as aioredis

from afterthought.contract import QueuedMessage
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings
from afterthought.spool import Spool, replay_into


async def main():
    tmp = Path(tempfile.mkdtemp())
    s = Settings(
        redis_url="redis://127.0.0.1:6379/0",
        key_prefix="r21dweek",
        local_db_path=tmp / "m",
        spool_path=tmp / "spool",
        backend="local",
        audit_key="k" * 20,
    )
    m = QueuedMessage.build(
        app="a",
        user_id="u",
        session_id="s",
        invocation_id="i",
        role="user",
        ordinal=0,
        content="hello",
    )
    for days in (6.9, 7.1):
        old = m.model_copy(
            update={
                "said_ms": int((time.time() - days * 86400) * 1000),
                "invocation_id": f"i{days}",
                "key": m.key + str(days),
            }
        )
        sp = Spool.of(s)
        sp.append([old])
        r = aioredis.Redis.from_url(s.redis_url)
        print(days, "days:", await replay_into(sp, ThreadQueue(r, s)))
        async for k in r.scan_iter(match="r21dweek*"):
            await r.delete(k)
        await r.aclose()


asyncio.run(main())
