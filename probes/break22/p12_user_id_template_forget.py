"""Deployment B runs the `{user_id}` template (an upgraded deployment's) beside A (the
default `{deployment}:{user_id}`) on one store. B never saw a user `A:ada`; the operator
of B forgets `A:ada` (an end user asked to be forgotten under that id). README warns that
such ids are the same backend user; this measures what a forget by id alone does.

    python probes/break22/p12_user_id_template_forget.py
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common

a = common.deployment("p12a")
shared = {"AFTERTHOUGHT_LOCAL_DB_PATH": str(Path(a["BREAK22_RUN"]) / "shared.sqlite3")}
a |= shared
b = common.deployment("p12b", AFTERTHOUGHT_ZEP_USER_ID_TEMPLATE="{user_id}") | shared
A = a["AFTERTHOUGHT_KEY_PREFIX"]


def a_rows() -> int:
    db = sqlite3.connect(shared["AFTERTHOUGHT_LOCAL_DB_PATH"])
    return len([c for (c,) in db.execute("SELECT content FROM messages") if "zorbabees" in c])


common.apply(a)
wa = common.spawn_worker(a)
try:

    async def go() -> None:
        runner, memory = common.make_runner("app")
        await common.talk(runner, "app", "ada", "I keep zorbabees")
        await memory.aclose()

    asyncio.run(go())
    assert common.wait_settled(a, 60)
    time.sleep(1)
    print("A's ada statements:", a_rows())
    dry = common.cli(b, "forget", "--app", "app", "--user", f"{A}:ada")
    print("B dry run rc", dry.returncode, dry.stdout.strip()[:160])
    done = common.cli(b, "forget", "--app", "app", "--user", f"{A}:ada", "--yes")
    print("B forget rc", done.returncode, done.stdout.strip()[:160])
    print("A's ada statements after B's forget:", a_rows())
finally:
    common.stop(wa)
