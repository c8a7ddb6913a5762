# ruff: noqa
"""Redis crashes (SIGKILL) and comes back from an older RDB snapshot: messages queued (A: not
yet stored; B: stored) after the snapshot are gone from Redis. Are the new messages queued
afterwards stored (not skipped as seen), and is the loss reported?"""

import asyncio, sqlite3, sys, tempfile, time, uuid
from pathlib import Path

sys.path.insert(0, "tests")
import redis.asyncio as aioredis
from conftest import drain

from afterthought.contract import QueuedMessage
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings
from afterthought.testing import RedisServer


def msg(n):
    return QueuedMessage.build(
        app="app",
        user_id="alice",
        session_id="s1",
        invocation_id=f"inv-{n:03d}",
        role="user",
        ordinal=0,
        content=f"m{n:03d}",
    )


from afterthought.queue import HandedOut

HANDED = [None]


async def enq(s, ns):
    r = aioredis.Redis.from_url(s.redis_url)
    HANDED[0] = HANDED[0] or HandedOut.of(s)
    res = await ThreadQueue(r, s, handed_out=HANDED[0] if "shared" in sys.argv else None).enqueue(
        [msg(n) for n in ns], now_ms=int(time.time() * 1000)
    )
    await r.aclose()
    return res


async def main(variant):
    tmp = Path(tempfile.mkdtemp())
    srv = RedisServer()
    url = srv.start()
    s = Settings(
        redis_url=url,
        key_prefix="snap",
        local_db_path=tmp / "m.sqlite3",
        spool_path=tmp / "spool",
        backend="local",
        synthesis_idle_seconds=0,
        context_settle_seconds=0,
        audit_key="k" * 20,
    )
    print("enq0", await enq(s, range(10)))
    await drain(s)
    r = aioredis.Redis.from_url(url)
    await r.save()
    await r.aclose()
    print("enq1", await enq(s, range(10, 15)))
    if variant == "B":
        await drain(s)
    srv._proc.kill()
    srv._proc.wait()
    srv.start()
    print("enq2", await enq(s, range(15, 20)))
    await drain(s)
    db = sqlite3.connect(tmp / "m.sqlite3")
    rows = [c for (c,) in db.execute("select content from messages order by id")]
    want = [f"m{n:03d}" for n in range(20)]
    print(variant, "stored", rows)
    print(variant, f"lost={sorted(set(want) - set(rows))} dup={len(rows) - len(set(rows))}")
    from afterthought import status as st

    r = aioredis.Redis.from_url(url)
    try:
        snap = await st.snapshot(r, s)
        print("status", {k: v for k, v in vars(snap).items() if "lost" in k or "problem" in k})
    except Exception as e:
        print("status err", type(e).__name__, e)
    await r.aclose()
    srv.close()


asyncio.run(main(sys.argv[1]))
