"""Your first agent with memory. Run a worker in one terminal, then talk in another; each
run is a new session of the same user:

    afterthought worker
    python examples/first_agent.py "big news, we moved to Lisbon last week"
    python examples/first_agent.py "any tips for my new city?"

With GOOGLE_API_KEY set the model is Gemini; without it, a stand-in that says which
memory it was given. Without ZEP_API_KEY memory lives in a local SQLite file."""

import asyncio
import os
import sys

from google.adk.agents import LlmAgent
from google.adk.runners import InMemoryRunner
from google.genai import types

from afterthought.agent_hooks import create_callbacks
from afterthought.testing import StandInLlm

memory = create_callbacks()  # settings from the environment: REDIS_URL, ZEP_API_KEY, ...
agent = LlmAgent(
    name="assistant",
    model="gemini-2.5-flash" if os.environ.get("GOOGLE_API_KEY") else StandInLlm(),
    instruction="You are a helpful assistant. Use what you remember about the user.",
    before_model_callback=memory.before_model_callback,
    after_model_callback=memory.after_model_callback,
)


async def main(text: str) -> None:
    runner = InMemoryRunner(agent=agent, app_name="first_agent")
    session = await runner.session_service.create_session(app_name="first_agent", user_id="ada")
    async for event in runner.run_async(
        user_id="ada", session_id=session.id, new_message=types.UserContent(text)
    ):
        if event.is_final_response() and event.content and event.content.parts:
            print("assistant:", "".join(p.text or "" for p in event.content.parts))


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "hello"))
