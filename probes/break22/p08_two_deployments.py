"""Two deployments on one Redis and one local store file (different key prefixes, default
templates): B's users have adversarial ids (A's rendered backend id, colons, an escaped
colon, a Cyrillic look-alike, a 5,000-character id, an id equal to A's prefix). Each of B's
users is forgotten in B; A's `ada` must keep every statement, and B's forgets must report
nothing of A. Then the reverse: A forgets `ada`; B's users keep theirs.

    python probes/break22/p08_two_deployments.py [local|postgres]
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common

backend = sys.argv[1] if len(sys.argv) > 1 else "local"
schema = f"break22_p08_{int(time.time()) % 100000}"
tag = uuid.uuid4().hex[:4]
a = common.deployment("p08a")
store = {"AFTERTHOUGHT_LOCAL_DB_PATH": str(Path(a["BREAK22_RUN"]) / "shared.sqlite3")}
if backend == "postgres":
    store = {
        "AFTERTHOUGHT_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/test",
        "AFTERTHOUGHT_DATABASE_SCHEMA": schema,
        "AFTERTHOUGHT_BACKEND": "postgres",
    }
a |= {**store, "AFTERTHOUGHT_KEY_PREFIX": f"shop{tag}"}
b = common.deployment("p08b") | store
A = a["AFTERTHOUGHT_KEY_PREFIX"]
APP = "app"
B_USERS = [f"{A}:ada", "ada", f"{A}%3Aada", f"{A}:a:da", "\u0430da", "a" * 5000, A, f"{A}:"]


def rows() -> list[tuple[str, str]]:
    if backend == "postgres":
        import asyncpg

        async def get() -> list[tuple[str, str]]:
            db = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/test")
            found = await db.fetch(
                f"SELECT u.user_id, m.content FROM {schema}.messages m"
                f" JOIN {schema}.users u ON u.uuid = m.user_uuid"
            )
            await db.close()
            return [(r[0], r[1]) for r in found]

        return asyncio.run(get())
    db = sqlite3.connect(store["AFTERTHOUGHT_LOCAL_DB_PATH"])
    return list(
        db.execute(
            "SELECT u.user_id, m.content FROM messages m JOIN threads t ON t.uuid = m.thread_uuid"
            " JOIN users u ON u.uuid = t.user_uuid"
        )
    )


def talk(env: dict[str, str], user: str, text: str) -> None:
    common.apply(env)

    async def go() -> None:
        runner, memory = common.make_runner(APP)
        await common.talk(runner, APP, user, text)
        await memory.aclose()

    asyncio.run(go())


wa, wb = common.spawn_worker(a), common.spawn_worker(b)
try:
    talk(a, "ada", "A-ada says: I keep zorbabees")
    for n, user in enumerate(B_USERS):
        talk(b, user, f"B-user{n} says: I keep quuxbees{n}")
    assert common.wait_settled(a, 60) and common.wait_settled(b, 60)
    time.sleep(2)
    before = rows()
    print("backend users:", sorted({u[:40] for u, _ in before}))
    a_before = [c for u, c in before if "zorbabees" in c]
    print("A-ada statements before:", len(a_before))
    for n, user in enumerate(B_USERS):
        done = common.cli(b, "forget", "--app", APP, "--user", user, "--yes")
        report = json.loads(done.stdout) if done.stdout.strip().startswith("{") else done.stderr
        left = [c for u, c in rows() if "zorbabees" in c]
        theirs = [c for u, c in rows() if f"quuxbees{n}" in c and "B-user" in c]
        users = report.get("users") if isinstance(report, dict) else report[:80]
        former = report.get("former_users") if isinstance(report, dict) else ""
        print(
            f"B forgets {user[:24]!r:28} rc={done.returncode} users={users} former={former}"
            f" | A-ada left {len(left)}/{len(a_before)} | B's own left {len(theirs)}"
        )
    talk(b, "bob", "B-bob says: I keep quuxbeesbob")
    assert common.wait_settled(b, 60)
    done = common.cli(a, "forget", "--app", APP, "--user", "ada", "--yes")
    print("A forgets ada rc", done.returncode, done.stdout.strip()[:120])
    print(
        "after: A-ada left",
        len([c for u, c in rows() if "zorbabees" in c]),
        "| B-bob left",
        len([c for u, c in rows() if "quuxbeesbob" in c]),
    )
finally:
    common.stop(wa)
    common.stop(wb)
