"""One user, two ADK sessions, a worker storing memory in between: the second session is
answered from long-term memory. Offline: memory is a temporary SQLite file and the model a
stand-in that says which memory it was given (Gemini when GOOGLE_API_KEY is set).

    python examples/offline_chat.py                     # starts its own worker process
    python examples/offline_chat.py --external-worker   # a worker runs elsewhere (compose)

``make_runner`` and ``talk`` are the parts to copy into an application. ``demo_deployment``
only provides a throwaway deployment: a Redis key prefix, a temporary SQLite file and an
``afterthought worker`` process, all removed at the end."""

import asyncio
import os
import sys

from google.adk.agents import LlmAgent
from google.adk.runners import InMemoryRunner
from google.genai import types

from afterthought.agent_hooks import create_callbacks
from afterthought.demo import demo_deployment
from afterthought.settings import Settings
from afterthought.testing import StandInLlm
from afterthought.testing.processes import wait_settled

APP, USER = "offline_chat", "ada"


def make_runner(settings: Settings) -> InMemoryRunner:
    """An agent whose every turn reads the user's memory and queues what was said."""
    memory = create_callbacks(settings=settings)
    agent = LlmAgent(
        name="assistant",
        model="gemini-2.5-flash" if os.environ.get("GOOGLE_API_KEY") else StandInLlm(),
        instruction="You are a friendly assistant. Use what you remember about the user.",
        before_model_callback=memory.before_model_callback,
        after_model_callback=memory.after_model_callback,
    )
    return InMemoryRunner(agent=agent, app_name=APP)


async def talk(runner: InMemoryRunner, *texts: str) -> None:
    """A new session of the user, one turn per text."""
    session = await runner.session_service.create_session(app_name=APP, user_id=USER)
    for text in texts:
        print(f"{USER}> {text}")
        async for event in runner.run_async(
            user_id=USER, session_id=session.id, new_message=types.UserContent(text)
        ):
            if event.is_final_response() and event.content and event.content.parts:
                reply = "".join(part.text or "" for part in event.content.parts)
                print("agent> " + reply.replace("\n", "\n       ") + "\n")


async def main(settings: Settings) -> None:
    print("--- session 1 ---")
    await talk(
        make_runner(settings),
        "hey! big news, we finally moved to Lisbon last week, so I'm drowning in boxes",
        "nothing with peanuts for dinner please, I'm allergic to them",
        "my sister Ana starts at the university here in September",
    )
    # The worker stores the turns within milliseconds, and distils facts once the user
    # has been quiet for `synthesis_idle_seconds` (5 s by default; 0.5 s in this demo).
    if not await wait_settled(settings, timeout=60):
        raise SystemExit("the worker did not store session 1 in time")
    print("--- session 2 (a new session: only long-term memory connects them) ---")
    await talk(make_runner(settings), "What do you remember about me?")


if __name__ == "__main__":
    if "--external-worker" in sys.argv[1:]:
        asyncio.run(main(Settings()))  # every setting from the environment
    else:
        with demo_deployment() as deployment:
            asyncio.run(main(deployment))
