# ruff: noqa
"""Real ADK Runner + the callbacks, its task cancelled after k loop ticks (k = 0..N): every
user message the session holds ends stored, buffered, spooled, or counted dropped."""

import asyncio, sqlite3, sys, tempfile, uuid
from pathlib import Path

sys.path.insert(0, "tests")
from conftest import drain
from google.adk.agents import LlmAgent
from google.adk.runners import InMemoryRunner
from google.genai import types

from afterthought.agent_hooks import TurnMemory, create_callbacks
from afterthought.settings import Settings
from afterthought.testing import StandInLlm


async def main(n):
    tmp = Path(tempfile.mkdtemp())
    s = Settings(
        redis_url="redis://127.0.0.1:6379/0",
        key_prefix=f"r21dc{uuid.uuid4().hex[:6]}",
        local_db_path=tmp / "m.sqlite3",
        spool_path=tmp / "spool",
        backend="local",
        synthesis_idle_seconds=0,
        context_settle_seconds=0,
        audit_key="k" * 20,
    )
    from afterthought.testing.redis_proxy import RedisProxy
    import random

    rnd = random.Random(7)
    proxy = RedisProxy(s.redis_url).start()
    proxy.reply_delay = float(sys.argv[2])
    memory = TurnMemory.create(settings=s.model_copy(update={"redis_url": proxy.url}))
    cb = create_callbacks(memory)
    agent = LlmAgent(
        name="assistant",
        model=StandInLlm(script=[f"reply {i}" for i in range(n)]),
        before_model_callback=cb.before_model_callback,
        after_model_callback=cb.after_model_callback,
    )
    runner = InMemoryRunner(agent=agent, app_name="cancelapp")
    sessions = []
    for k in range(n):
        session = await runner.session_service.create_session(app_name="cancelapp", user_id="ada")

        async def turn():
            async for _ in runner.run_async(
                user_id="ada", session_id=session.id, new_message=types.UserContent(f"hello {k}")
            ):
                pass

        task = asyncio.ensure_future(turn())
        await asyncio.sleep(rnd.uniform(0, 8 * proxy.reply_delay))
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        sessions.append(session.id)
    await asyncio.sleep(3.0)
    e = memory.enqueuer
    print(f"buffered={e.buffered} dropped={e.dropped} spooled={e.spooled}")
    await memory.aclose()
    await drain(s, timeout=300)
    db = sqlite3.connect(tmp / "m.sqlite3")
    stored = {c for (c,) in db.execute("select content from messages")}
    said_user = said_reply = missing_user = missing_reply = 0
    for k, sid in enumerate(sessions):
        full = await runner.session_service.get_session(
            app_name="cancelapp", user_id="ada", session_id=sid
        )
        texts = [
            (ev.author, ev.content.parts[0].text)
            for ev in full.events
            if ev.content and ev.content.parts and ev.content.parts[0].text
        ]
        for author, text in texts:
            if author == "user":
                said_user += 1
                missing_user += text not in stored
            else:
                said_reply += 1
                missing_reply += text not in stored
    print(
        f"sessions={n} user_said={said_user} user_missing={missing_user} replies_said={said_reply} replies_missing={missing_reply} stored={len(stored)}"
    )


asyncio.run(main(int(sys.argv[1])))
