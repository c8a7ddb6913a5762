"""A turn spooled while the agent could not reach Redis, the user forgotten, then the
spool replayed by a worker: nothing of the turn may be stored, and (the promise: no byte
of the user's words remains) the spool's files should not keep the words either.

    python probes/break22/p05_spool_after_forget.py
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common

env = common.deployment("p05", AFTERTHOUGHT_EXIT_FLUSH_SECONDS="0.5")
run = Path(env["BREAK22_RUN"])
APP, USER = "shopapp", "ada"
MARKERS = [b"zorbatown", b"quetzalwobble"]
common.apply(env)
worker = common.spawn_worker(env)
try:

    async def session(*texts: str) -> None:
        runner, memory = common.make_runner(APP)
        await common.talk(runner, APP, USER, *texts)
        await memory.aclose()

    asyncio.run(session("hello there, I like tea"))
    assert common.wait_settled(env, 60)
    common.stop(worker)  # no worker replays the spool while the turn is spooled
    # The agent's Redis is away (a closed port): the turn is buffered, then spooled at exit.
    common.apply(
        {**env, "REDIS_URL": "redis://127.0.0.1:1/0", "AFTERTHOUGHT_ENQUEUE_TIMEOUT": "0.2"}
    )
    asyncio.run(session("we moved to Zorbatown, quetzalwobble says hi"))
    common.apply(env)
    print("spool files after the outage:", common.file_hits(MARKERS, run / "spool"))
    done = common.cli(env, "forget", "--app", APP, "--user", USER, "--yes")
    print("forget rc", done.returncode, done.stdout.strip()[:200], done.stderr.strip()[:200])
    time.sleep(1.5)  # past forget_clock_margin_seconds
    worker = common.spawn_worker(env, "worker2")
    time.sleep(15)  # a worker replays the spool at start and every 10 s
    assert common.wait_settled(env, 60)
    import sqlite3

    db = sqlite3.connect(run / "memory.sqlite3")
    print("stored:", [(r, c[:60]) for r, c in db.execute("SELECT role, content FROM messages")])
    print("redis:", common.redis_hits(MARKERS, f"*{env['AFTERTHOUGHT_KEY_PREFIX']}*"))
    print("files:", [h for h in common.file_hits(MARKERS, run) if not h[0].endswith("cli.log")])
    print("spool dir:", sorted(str(p.relative_to(run)) for p in (run / "spool").rglob("*")))
    print(
        "worker2 log on spool:",
        [line for line in (run / "worker2.log").read_text().splitlines() if "spool" in line][:5],
    )
finally:
    common.stop(worker)
