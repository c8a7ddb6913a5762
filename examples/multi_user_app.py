"""A multi-user app: ``MemoryPlugin`` gives every agent of the ``App`` memory, and
``ZepMemoryService`` is ADK's memory service over the same queue and backend.

Two users talk to the same app; the app records a fact from a profile form with
``add_memory``; each user's next session remembers them, and only them. Offline: the
local SQLite backend and the stand-in model, and a worker process started for the run.

    python examples/multi_user_app.py"""

import asyncio
import sys

from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types

from afterthought.agent_hooks import MemoryPlugin, ZepMemoryService
from afterthought.demo import choose_model, demo_deployment, settled, turn
from afterthought.settings import Settings

APP = "travel_desk"
FIRST_SESSIONS = {
    "ada": ["I'm Ada, I live in Lisbon.", "I'm allergic to peanuts."],
    "grace": ["I'm Grace. I live in Oslo and I love skiing."],
}


async def run(settings: Settings) -> None:
    plugin = MemoryPlugin(settings=settings)
    # One TurnMemory for both: one Redis client, one cache, one backend connection.
    memory_service = ZepMemoryService(memory=plugin.memory)
    agent = LlmAgent(
        name="travel_agent",
        model=choose_model(),
        instruction="You plan trips and remember each traveller.",
    )
    runner = Runner(
        app=App(name=APP, root_agent=agent, plugins=[plugin]),
        session_service=InMemorySessionService(),
        memory_service=memory_service,
    )

    for user, lines in FIRST_SESSIONS.items():
        session = await runner.session_service.create_session(app_name=APP, user_id=user)
        print(f"--- {user}: session 1 ---")
        for text in lines:
            await turn(runner, session.id, text, user_id=user)
        # Optional: the callbacks queued every turn already; re-adding adds nothing.
        finished = await runner.session_service.get_session(
            app_name=APP, user_id=user, session_id=session.id
        )
        assert finished is not None
        await memory_service.add_session_to_memory(finished)

    # Something the app knows from elsewhere (a profile form): stored as an app fact.
    profile = MemoryEntry(content=types.UserContent("Ada prefers window seats."))
    await memory_service.add_memory(app_name=APP, user_id="ada", memories=[profile])
    await settled(settings)

    found = await memory_service.search_memory(app_name=APP, user_id="ada", query="seat")
    print(f"[example] search_memory(ada, 'seat'): {len(found.memories)} memories")
    for entry in found.memories:
        print("   -", "".join(p.text or "" for p in entry.content.parts or []))
    print()

    for user in FIRST_SESSIONS:
        session = await runner.session_service.create_session(app_name=APP, user_id=user)
        print(f"--- {user}: session 2 (only long-term memory connects them) ---")
        await turn(runner, session.id, "What do you know about me?", user_id=user)
    await runner.close()


def main() -> int:
    with demo_deployment() as settings:
        asyncio.run(run(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
