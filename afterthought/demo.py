"""``afterthought demo``: ADK sessions of one user, with a real worker process persisting
memory in between (``examples/offline_chat.py`` is the short version to copy from; it
uses ``demo_deployment``). Session 1 is said the way
people talk; session 2 starts from what was remembered; session 3 asks about a passing
remark that only retrieval for the question brings back (the default, ``query`` mode),
then again in ``cached`` mode, with a block kept small so the difference shows.

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
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.models import BaseLlm
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types

from afterthought.agent_hooks import create_callbacks
from afterthought.settings import Settings
from afterthought.testing import RedisServer
from afterthought.testing.processes import cleanup, spawn_worker, wait_settled
from afterthought.testing.redis_server import listening
from afterthought.testing.stand_in_model import StandInLlm

APP = "offline_demo"
USER = "ada"
SESSION_1 = [
    "hey! big news, we finally moved to Lisbon last week, so I'm drowning in boxes",
    "funny, the trams here still have wooden benches, like riding a museum",
    "can you suggest a dinner without an oven? nothing with peanuts, I'm allergic to them",
    "genmaicha is my go-to tea these days, the toasted rice smell is the best",
    "my sister Ana starts at the university here in September, she'll stay with us",
]
SESSION_2 = "What do you remember about me?"
SESSION_3 = "what did I say about the trams again?"
#: The demo's block size: small enough that the block built before a question (cached
#: mode) cannot hold everything, so what session 3 asks must be retrieved for it.
DEMO_BLOCK = 400


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


def _runner(settings: Settings) -> Runner:
    callbacks = create_callbacks(settings=settings)
    agent = LlmAgent(
        name="assistant",
        model=choose_model(),
        instruction="You are a friendly assistant with long-term memory.",
        before_model_callback=callbacks.before_model_callback,
        after_model_callback=callbacks.after_model_callback,
    )
    return Runner(app_name=APP, agent=agent, session_service=InMemorySessionService())


async def _session(runner: Runner, *texts: str) -> None:
    session = await runner.session_service.create_session(app_name=APP, user_id=USER)
    for text in texts:
        await turn(runner, session.id, text)


async def conversation(settings: Settings) -> None:
    print("--- session 1 ---")
    await _session(_runner(settings), *SESSION_1)
    await settled(settings)
    print("[demo] the worker persisted session 1 and distilled facts from it\n")

    print("--- session 2 (a new session: only long-term memory connects them) ---")
    await _session(_runner(settings), SESSION_2)

    print("--- session 3, the default: the block retrieved for the question ---")
    await _session(_runner(settings), SESSION_3)
    print("--- session 3 again, cached mode: the block built before the question ---")
    await _session(_runner(settings.model_copy(update={"context_mode": "cached"})), SESSION_3)
    await settled(settings)  # the worker stops with nothing of the demo in flight


async def settled(settings: Settings) -> None:
    if not await wait_settled(settings, timeout=60):
        raise TimeoutError("the worker did not persist the queue in time")


@contextmanager
def demo_deployment(**overrides: Any) -> Iterator[Settings]:
    """A throwaway deployment: Redis (``REDIS_URL``, the machine's, or a private one), a
    fresh key prefix, a temporary SQLite file, and a worker process; all removed after.
    Other settings (``ZEP_API_KEY`` among them) come from the environment, or
    ``overrides``."""
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="afterthought-demo-") as tmp:
        settings = Settings(
            redis_url=choose_redis(stack),
            key_prefix=f"demo-{uuid.uuid4().hex[:8]}",
            local_db_path=Path(tmp) / "memory.sqlite3",
            synthesis_idle_seconds=0.5,  # facts right after the session, for the demo
            **overrides,
        )
        worker = spawn_worker(settings)  # `afterthought worker`, in its own process
        print(f"[demo] worker started (pid {worker.pid}), backend={settings.resolved_backend}")
        try:
            yield settings
        finally:
            worker.terminate()
            worker.wait(timeout=30)
            asyncio.run(cleanup(settings))


def main() -> int:
    with demo_deployment(context_max_chars=DEMO_BLOCK) as settings:
        asyncio.run(conversation(settings))
    return 0
