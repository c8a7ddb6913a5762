# ruff: noqa
"""Spool replayed into a Redis at maxmemory (noeviction): stops, keeps; then drained."""

import asyncio, sqlite3, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, "tests")
import redis.asyncio as aioredis
from afterthought.contract import QueuedMessage
from afterthought.settings import Settings
from afterthought.spool import Spool, replay_into
from afterthought.queue import ThreadQueue
from afterthought.testing import RedisServer
from conftest import drain


def msg(t, n):
    return QueuedMessage.build(
        app="memtest",
        user_id=f"u{t}",
        session_id="s",
        invocation_id=f"i{n:04d}",
        role="user",
        ordinal=0,
        content=f"t{t} m{n:04d} " + "x" * 400,
    )


async def main():
    tmp = Path(tempfile.mkdtemp())
    with RedisServer() as url:
        s = Settings(
            redis_url=url,
            key_prefix="oomp",
            local_db_path=tmp / "m.sqlite3",
            spool_path=tmp / "spool",
            backend="local",
            synthesis_idle_seconds=0,
            context_settle_seconds=0,
            audit_key="k" * 20,
        )
        r = aioredis.Redis.from_url(url)
        spool = Spool.of(s)
        T, N = 10, 60
        for n in range(N):
            spool.append([msg(t, n) for t in range(T)])
        used = int((await r.info("memory"))["used_memory"])
        await r.config_set("maxmemory", str(used + 200_000))
        q = ThreadQueue(r, s)
        res = await replay_into(spool, q)
        print("at OOM:", res, "waiting", spool.waiting())
        await r.config_set("maxmemory", "0")
        res = await replay_into(spool, q)
        print("after:", res, "waiting", spool.waiting())
        await drain(s, timeout=120)
        db = sqlite3.connect(tmp / "m.sqlite3")
        rows = db.execute("select thread_uuid, content from messages order by id").fetchall()
        by = {}
        for th, c in rows:
            by.setdefault(th, []).append(c.split(" ")[1])
        tot = sum(len(v) for v in by.values())
        dup = sum(len(v) - len(set(v)) for v in by.values())
        ordered = all(v == sorted(v) for v in by.values())
        print(f"stored={tot} expected={T * N} dup={dup} threads={len(by)} in_order={ordered}")
        await r.aclose()


asyncio.run(main())
