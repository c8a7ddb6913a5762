"""A worker SIGSTOPped at a random moment while it flushes or synthesizes a user's turns,
the user forgotten (`afterthought forget --yes`, which waits out the stopped worker's
lease), then SIGCONT: nothing of the user may come back into the store or Redis.

    python probes/break22/p07_sigstop_race.py [local|postgres] [ROUNDS]
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common

backend = sys.argv[1] if len(sys.argv) > 1 else "local"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
schema = f"break22_p07_{int(time.time()) % 100000}"
extra = {
    "AFTERTHOUGHT_LEASE_SECONDS": "3",
    "AFTERTHOUGHT_BACKEND_TIMEOUT": "1",
    "AFTERTHOUGHT_BACKEND_SETTLE_SECONDS": "0.5",
    "AFTERTHOUGHT_SYNTHESIS_IDLE_SECONDS": "0.2",
}
if backend == "postgres":
    extra |= {
        "AFTERTHOUGHT_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/test",
        "AFTERTHOUGHT_DATABASE_SCHEMA": schema,
        "AFTERTHOUGHT_BACKEND": "postgres",
    }
env = common.deployment(f"p07{backend}", **extra)
run = Path(env["BREAK22_RUN"])
APP = "shopapp"
common.apply(env)
worker = common.spawn_worker(env)
rng = random.Random(int(os.environ.get("SEED", "7")))


def stored_rows() -> list[tuple[str, str]]:
    if backend == "postgres":
        import asyncpg

        async def get() -> list[tuple[str, str]]:
            db = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/test")
            rows = await db.fetch(
                f"SELECT content, '' FROM {schema}.messages"
                f" UNION ALL SELECT value, predicate FROM {schema}.facts"
            )
            await db.close()
            return [(r[0], r[1]) for r in rows]

        return asyncio.run(get())
    db = sqlite3.connect(run / "memory.sqlite3")
    return list(
        db.execute("SELECT content, '' FROM messages UNION ALL SELECT value, predicate FROM facts")
    )


bad = 0
try:
    time.sleep(3)
    for i in range(rounds):
        user, marker = f"user{i}", f"quux{i}zork"
        texts = [
            f"I live in {marker}ville now",
            f"my dog {marker} loves walks",
            f"I work at {marker} bakery",
            f"my sister lives in {marker}ton",
            f"I'm allergic to {marker}nuts",
        ]

        async def session(user: str = user, texts: list[str] = texts) -> None:
            runner, memory = common.make_runner(APP)
            await common.talk(runner, APP, user, *texts)
            await memory.aclose()

        asyncio.run(session())
        delay = rng.uniform(0.0, 1.2)
        time.sleep(delay)
        worker.send_signal(signal.SIGSTOP)
        done = common.cli(env, "forget", "--app", APP, "--user", user, "--yes")
        worker.send_signal(signal.SIGCONT)
        time.sleep(4)
        common.wait_settled(env, 30)
        time.sleep(2)
        left = [r for r in stored_rows() if marker in r[0].lower()]
        keys = common.redis_hits([marker.encode()], f"*{env['AFTERTHOUGHT_KEY_PREFIX']}*")
        report = done.stdout.strip().replace("\n", " ")[:150]
        print(f"round {i} stop after {delay:.2f}s forget rc={done.returncode} {report}")
        if left or keys:
            bad += 1
            print(f"   LEFT store={left[:4]} redis={keys[:4]}")
    # A forget left pending would be resumed by a worker: report what is pending now.
    status = common.cli(env, "status", "--json")
    print("status forgets:", [line for line in status.stdout.splitlines() if "pending" in line][:3])
finally:
    worker.send_signal(signal.SIGCONT)
    common.stop(worker)
print(f"rounds={rounds} leaks={bad}")
