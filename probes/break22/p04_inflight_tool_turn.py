"""A turn in flight through a forget, across a tool step: the user's message is queued at
the first model call, the tool runs `afterthought forget --yes` (the operator forgets the
user meanwhile), the second model call replies with the user's words. After the worker
settles nothing of the user may be stored or queued.

    python probes/break22/p04_inflight_tool_turn.py [local|postgres]
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common

backend = sys.argv[1] if len(sys.argv) > 1 else "local"
schema = f"break22_p04_{int(time.time()) % 100000}"
extra = {}
if backend == "postgres":
    extra = {
        "AFTERTHOUGHT_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/test",
        "AFTERTHOUGHT_DATABASE_SCHEMA": schema,
        "AFTERTHOUGHT_BACKEND": "postgres",
    }
env = common.deployment(f"p04{backend}", **extra)
run = Path(env["BREAK22_RUN"])
APP, USER = "shopapp", "ada"
MARKERS = [b"zorbatown", b"quetzalwobble", b"brindleshank"]
common.apply(env)
worker = common.spawn_worker(env)
forget_out: list[str] = []


async def forget_now() -> str:
    """A tool: the operator forgets the user while the turn is in flight."""
    proc = await asyncio.create_subprocess_exec(
        str(common.VENV_BIN / "afterthought"),
        "forget",
        "--app",
        APP,
        "--user",
        USER,
        "--yes",
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    forget_out.append(f"rc={proc.returncode} {out.decode()[:200]} {err.decode()[:200]}")
    return "done"


def runner_with(script: list[object]):  # type: ignore[no-untyped-def]
    from google.adk.agents import LlmAgent
    from google.adk.runners import InMemoryRunner

    from afterthought.agent_hooks import create_callbacks
    from afterthought.agent_hooks.turn_memory import TurnMemory
    from afterthought.testing import StandInLlm

    memory = TurnMemory.create()
    callbacks = create_callbacks(memory)
    agent = LlmAgent(
        name="assistant",
        model=StandInLlm(script=script),
        tools=[forget_now],
        before_model_callback=callbacks.before_model_callback,
        after_model_callback=callbacks.after_model_callback,
    )
    return InMemoryRunner(agent=agent, app_name=APP), memory


try:

    async def main() -> None:
        runner, memory = common.make_runner(APP)
        await common.talk(runner, APP, USER, "we moved to Zorbatown last week")
        await memory.aclose()

    asyncio.run(main())
    assert common.wait_settled(env, 60)
    time.sleep(2)
    assert common.wait_settled(env, 60)

    async def inflight() -> list[str]:
        runner, memory = runner_with(
            [{"call": "forget_now", "args": {}}, "noted: quetzalwobble and brindleshank, Zorbatown"]
        )
        replies = await common.talk(runner, APP, USER, "my quetzalwobble needs brindleshank food")
        print("enqueuer dropped:", getattr(memory.enqueuer, "dropped", None))
        await memory.aclose()
        return replies

    print("in-flight turn replies:", asyncio.run(inflight()))
    print("forget:", forget_out)
    assert common.wait_settled(env, 60)
    time.sleep(3)
    print("redis:", common.redis_hits(MARKERS, f"*{env['AFTERTHOUGHT_KEY_PREFIX']}*"))
    print("files:", [h for h in common.file_hits(MARKERS, run) if not h[0].endswith(("cli.log",))])
    if backend == "postgres":
        import asyncpg

        async def pg() -> None:
            db = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/test")
            rows = await db.fetch(f"SELECT role, content FROM {schema}.messages")
            print("pg messages:", [(r[0], r[1][:60]) for r in rows])
            await db.close()

        asyncio.run(pg())
    else:
        import sqlite3

        db = sqlite3.connect(run / "memory.sqlite3")
        print(
            "sqlite messages:",
            [(r, c[:60]) for r, c in db.execute("SELECT role, content FROM messages")],
        )
finally:
    common.stop(worker)
