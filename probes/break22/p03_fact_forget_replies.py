"""Forget one fact (`afterthought forget --query WORD --yes`) after the assistant has
repeated it (the stand-in model quotes its memory block): the README says the assistant's
stored replies that repeat the fact go too; PostgreSQL claims the local store's behaviour.
Prints, per store, the stored messages that still hold the fact's value.

    python probes/break22/p03_fact_forget_replies.py [local|postgres]
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common

backend = sys.argv[1] if len(sys.argv) > 1 else "local"
schema = f"break22_p03_{int(time.time()) % 100000}"
extra = {}
if backend == "postgres":
    extra = {
        "AFTERTHOUGHT_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/test",
        "AFTERTHOUGHT_DATABASE_SCHEMA": schema,
        "AFTERTHOUGHT_BACKEND": "postgres",
    }
env = common.deployment(f"p03{backend}", **extra)
run = Path(env["BREAK22_RUN"])
APP, USER, VALUE = "shopapp", "ada", "brindleshank"
common.apply(env)
worker = common.spawn_worker(env)


def rows() -> list[tuple[str, str]]:
    if backend == "postgres":
        import asyncpg

        async def get() -> list[tuple[str, str]]:
            db = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/test")
            found = await db.fetch(f"SELECT role, content FROM {schema}.messages ORDER BY id")
            await db.close()
            return [(r[0], r[1]) for r in found]

        return asyncio.run(get())
    db = sqlite3.connect(run / "memory.sqlite3")
    return list(db.execute("SELECT role, content FROM messages ORDER BY id"))


try:

    async def session(*texts: str) -> list[str]:
        runner, memory = common.make_runner(APP)
        replies = await common.talk(runner, APP, USER, *texts)
        await memory.aclose()
        return replies

    asyncio.run(session(f"I'm allergic to {VALUE}, so nothing with {VALUE} please"))
    assert common.wait_settled(env, 60)
    time.sleep(3)
    assert common.wait_settled(env, 60)
    print("session 2 reply:", asyncio.run(session("what should I avoid eating?"))[0][:160])
    assert common.wait_settled(env, 60)
    time.sleep(1)
    before = [(r, c[:90]) for r, c in rows() if VALUE in c.lower()]
    print("holding the value before:", len(before))
    for r in before:
        print("   ", r)
    done = common.cli(env, "forget", "--app", APP, "--user", USER, "--query", VALUE, "--yes")
    print("forget rc", done.returncode, done.stdout.strip()[:300], done.stderr.strip()[:200])
    after = [(r, c[:90]) for r, c in rows() if VALUE in c.lower()]
    print(f"{backend}: holding the value after the fact's forget:", len(after))
    for r in after:
        print("   ", r)
finally:
    common.stop(worker)
