"""``afterthought demo``: two ADK sessions of one user, with a real worker process
persisting memory in between (``examples/offline_chat.py`` runs it too).

Offline by default: the local SQLite backend and a stand-in model that says what memory
it received. With GOOGLE_API_KEY it talks to Gemini; with ZEP_API_KEY it uses Zep.
Uses REDIS_URL, else a Redis on 127.0.0.1:6379, else starts a private one."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from google.adk.agents import LlmAgent
from google.adk.models import BaseLlm
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types

from afterthought.settings import Settings
from afterthought.testing import RedisServer
from afterthought.testing.processes import cleanup, spawn_worker, wait_settled
from afterthought.testing.redis_server import listening
from afterthought.testing.stand_in_model import StandInLlm
from agent_hooks import create_callbacks

APP = "offline_demo"
USER = "ada"
SESSION_1 = ["Hi! I'm Ada. I live in Lisbon.", "I'm allergic to peanuts and I love genmaicha tea."]
SESSION_2 = "What do you remember about me?"


def choose_redis(stack: ExitStack) -> str:
    if os.environ.get("REDIS_URL"):
        return os.environ["REDIS_URL"]
    if listening("127.0.0.1", 6379):
        return "redis://127.0.0.1:6379/0"
    print("[demo] no Redis found: starting a private one")
    return stack.enter_context(RedisServer())


def choose_model() -> BaseLlm | str:
    if os.environ.get("GOOGLE_API_KEY"):
        return "gemini-2.5-flash"
    print("[demo] no GOOGLE_API_KEY: using the offline stand-in model\n")
    return StandInLlm()


async def turn(runner: Runner, session_id: str, text: str, *, user_id: str = USER) -> None:
    print(f"{user_id}> {text}")
    async for event in runner.run_async(
        user_id=user_id, session_id=session_id, new_message=types.UserContent(text)
    ):
        if event.is_final_response() and event.content and event.content.parts:
            reply = "".join(p.text or "" for p in event.content.parts)
            print("agent> " + reply.replace("\n", "\n       ") + "\n")


async def conversation(settings: Settings) -> None:
    callbacks = create_callbacks(settings=settings)
    agent = LlmAgent(
        name="assistant",
        model=choose_model(),
        instruction="You are a friendly assistant with long-term memory.",
        before_model_callback=callbacks.before_model_callback,
        after_model_callback=callbacks.after_model_callback,
    )
    runner = Runner(app_name=APP, agent=agent, session_service=InMemorySessionService())

    first = await runner.session_service.create_session(app_name=APP, user_id=USER)
    print("--- session 1 ---")
    for text in SESSION_1:
        await turn(runner, first.id, text)

    await settled(settings)
    print("[demo] the worker persisted session 1 and distilled facts from it\n")

    second = await runner.session_service.create_session(app_name=APP, user_id=USER)
    print("--- session 2 (a new session: only long-term memory connects them) ---")
    await turn(runner, second.id, SESSION_2)


async def settled(settings: Settings) -> None:
    if not await wait_settled(settings, timeout=60):
        raise TimeoutError("the worker did not persist the queue in time")


@contextmanager
def demo_deployment() -> Iterator[Settings]:
    """A throwaway deployment: Redis (``REDIS_URL``, the machine's, or a private one), a
    fresh key prefix, a temporary SQLite file, and a worker process; all removed after.
    Other settings (``ZEP_API_KEY`` among them) come from the environment."""
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="afterthought-demo-") as tmp:
        settings = Settings(
            redis_url=choose_redis(stack),
            key_prefix=f"demo-{uuid.uuid4().hex[:8]}",
            local_db_path=Path(tmp) / "memory.sqlite3",
            synthesis_idle_seconds=0.5,  # facts right after the session, for the demo
        )
        worker = spawn_worker(settings)  # `afterthought worker`, in its own process
        print(f"[demo] worker started (pid {worker.pid}), backend={settings.resolved_backend}")
        try:
            yield settings
        finally:
            worker.terminate()
            worker.wait(timeout=30)
            asyncio.run(cleanup(settings))


def main(*, external_worker: bool = False) -> int:
    if external_worker:
        # A worker runs elsewhere (docker compose): every setting comes from the environment.
        asyncio.run(conversation(Settings()))
        return 0
    with demo_deployment() as settings:
        asyncio.run(conversation(settings))
    return 0
