"""Forget a user with `afterthought forget --yes`, then scan Redis (every key of the
private Redis), the store's files (-wal/-shm), the PostgreSQL schema, the spool and the
logs for the user's words; then a new turn of the same agent process must get no memory.

    python probes/break22/p01_forget_scan.py [local|postgres]
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common

backend = sys.argv[1] if len(sys.argv) > 1 else "local"
extra = {}
if backend == "postgres":
    extra = {
        "AFTERTHOUGHT_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/test",
        "AFTERTHOUGHT_DATABASE_SCHEMA": "break22_p01",
        "AFTERTHOUGHT_BACKEND": "postgres",
    }
env = common.deployment(f"p01{backend}", **extra)
run = Path(env["BREAK22_RUN"])
APP, USER = "shopapp", "ada"
MARKERS = [b"quetzalwobble", b"zorbatown", b"brindleshank"]
TEXTS = [
    "hey, big news: we moved to Zorbatown last week, my quetzalwobble collection came too",
    "I'm allergic to brindleshank, so nothing with brindleshank please",
    "my sister Quetzalwobble Jones lives in Zorbatown as well",
]

common.apply(env)
worker = common.spawn_worker(env)
try:

    async def session_one() -> None:
        runner, memory = common.make_runner(APP)
        print("replies:", [r[:80] for r in await common.talk(runner, APP, USER, *TEXTS)])
        await memory.aclose()

    asyncio.run(session_one())
    assert common.wait_settled(env, 60), "not settled"
    import time

    time.sleep(3)  # synthesis, block caching
    assert common.wait_settled(env, 60)

    # Second session: the block quotes the user; the stand-in repeats it in its reply.
    async def session_two() -> list[str]:
        runner, memory = common.make_runner(APP)
        replies = await common.talk(runner, APP, USER, "what do you remember about me?")
        await memory.aclose()
        return replies

    print("session 2:", [r[:200] for r in asyncio.run(session_two())])
    assert common.wait_settled(env, 60)
    time.sleep(2)
    pre = common.redis_hits(MARKERS)
    print("before forget, redis keys holding markers:", len(pre))
    dry = common.cli(env, "forget", "--app", APP, "--user", USER)
    print("dry run rc", dry.returncode, dry.stdout.strip()[:400])
    done = common.cli(env, "forget", "--app", APP, "--user", USER, "--yes")
    print("forget rc", done.returncode, done.stdout.strip()[:400], done.stderr.strip()[:300])
    time.sleep(2)
    print("AFTER FORGET")
    print(" redis:", common.redis_hits(MARKERS, f"*{env['AFTERTHOUGHT_KEY_PREFIX']}*"))
    print(" files:", [h for h in common.file_hits(MARKERS, run) if not h[0].endswith("cli.log")])
    if backend == "postgres":
        import asyncpg

        async def pg() -> None:
            db = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/test")
            for table in (
                "messages",
                "facts",
                "users",
                "threads",
                "idempotency",
                "templates",
                "meta",
            ):
                rows = await db.fetch(f"SELECT * FROM break22_p01.{table}")
                hits = [
                    r for r in rows if any(m.decode() in str(tuple(r)).lower() for m in MARKERS)
                ]
                print(f" pg {table}: rows={len(rows)} holding markers={len(hits)}")
            await db.close()

        asyncio.run(pg())

    async def session_three() -> list[str]:
        runner, memory = common.make_runner(APP)
        replies = await common.talk(runner, APP, USER, "zorbatown quetzalwobble?")
        await memory.aclose()
        return replies

    print("session 3 after forget:", [r[:300] for r in asyncio.run(session_three())])
finally:
    common.stop(worker)
print("run dir", run)
