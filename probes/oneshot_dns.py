# ruff: noqa
"""A one-shot agent (real ADK Runner, StandInLlm) whose Redis host name resolves slowly
(a DNS server that does not answer: getaddrinfo blocks 15 s in asyncio's executor thread).
Does it exit within exit_flush_seconds, with its turn spooled?"""

import os, socket, sys, time

if sys.argv[1:] == ["child"]:
    real = socket.getaddrinfo

    def slow(host, *a, **k):
        if host == "redis.example.internal":
            time.sleep(float(os.environ["DNS_SECONDS"]))
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *a, **k)

    socket.getaddrinfo = slow
    import asyncio
    from google.adk.agents import LlmAgent
    from google.adk.runners import InMemoryRunner
    from google.genai import types
    from afterthought.agent_hooks import create_callbacks
    from afterthought.testing import StandInLlm

    memory = create_callbacks()
    agent = LlmAgent(
        name="assistant",
        model=StandInLlm(script=["hi there"]),
        before_model_callback=memory.before_model_callback,
        after_model_callback=memory.after_model_callback,
    )

    async def main():
        runner = InMemoryRunner(agent=agent, app_name="oneshot")
        session = await runner.session_service.create_session(app_name="oneshot", user_id="ada")
        async for _ in runner.run_async(
            user_id="ada", session_id=session.id, new_message=types.UserContent("hello")
        ):
            pass
        print("TURN_END", time.time(), flush=True)

    import atexit, threading

    atexit.register(lambda: print("ATEXIT_LAST", time.time(), flush=True))
    t = time.time()
    asyncio.run(main())
    print("RUN_DONE", time.time(), flush=True)
    threading._register_atexit(lambda: print("THREADING_ATEXIT", time.time(), flush=True))
    sys.exit(0)

import subprocess, tempfile
from pathlib import Path
from afterthought.settings import Settings
from afterthought.spool import Spool

for dns in (15.0,):
    tmp = Path(tempfile.mkdtemp())
    env = {
        **os.environ,
        "REDIS_URL": "redis://redis.example.internal:6379/0",
        "AFTERTHOUGHT_KEY_PREFIX": "r21ddns",
        "AFTERTHOUGHT_SPOOL_PATH": str(tmp / "spool"),
        "AFTERTHOUGHT_LOCAL_DB_PATH": str(tmp / "m.sqlite3"),
        "AFTERTHOUGHT_EXIT_FLUSH_SECONDS": "1",
        "DNS_SECONDS": str(dns),
    }
    env.pop("ZEP_API_KEY", None)
    t0 = time.time()
    p = subprocess.run(
        [sys.executable, __file__, "child"], env=env, capture_output=True, text=True, timeout=300
    )
    end = time.time()
    turn = [float(l.split()[1]) for l in p.stdout.splitlines() if l.startswith("TURN_END")]
    s = Settings(
        redis_url=env["REDIS_URL"],
        key_prefix="r21ddns",
        spool_path=tmp / "spool",
        local_db_path=tmp / "m.sqlite3",
    )
    print(
        f"dns={dns}s rc={p.returncode} start_to_turn_end={turn[0] - t0 if turn else None:.1f}s "
        f"turn_end_to_exit={end - turn[0] if turn else None:.1f}s spooled={Spool.of(s).waiting()}"
    )
    print(
        "   ",
        [
            (l.split()[0], round(float(l.split()[1]) - turn[0], 1))
            for l in p.stdout.splitlines()
            if l.split()[0] in ("RUN_DONE", "ATEXIT_LAST", "THREADING_ATEXIT")
        ],
    )
    print("   stderr:", " | ".join(l[:150] for l in p.stderr.splitlines()[-4:]))
