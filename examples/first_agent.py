# my_agent.py (this is examples/first_agent.py): python my_agent.py "hello"
import asyncio
import os
import sys

from google.adk.agents import LlmAgent
from google.adk.runners import InMemoryRunner
from google.genai import types

from afterthought import SettingsError
from afterthought.agent_hooks import create_callbacks
from afterthought.testing import StandInLlm  # a model that needs no key, for trying it out

try:
    memory = create_callbacks()  # settings from the environment: REDIS_URL, ZEP_API_KEY, ...
except SettingsError as exc:  # one line: the variable and what is wrong, never its value
    sys.exit(f"my_agent: {exc}")
agent = LlmAgent(
    name="assistant",
    model="gemini-2.5-flash" if os.environ.get("GOOGLE_API_KEY") else StandInLlm(),
    before_model_callback=memory.before_model_callback,
    after_model_callback=memory.after_model_callback,
)


async def main(text: str) -> None:
    runner = InMemoryRunner(agent=agent, app_name="first_agent")
    session = await runner.session_service.create_session(app_name="first_agent", user_id="ada")
    new_message = types.UserContent(text)
    async for event in runner.run_async(
        user_id="ada", session_id=session.id, new_message=new_message
    ):
        if event.is_final_response() and event.content and event.content.parts:
            print("assistant:", event.content.parts[0].text)


asyncio.run(main(" ".join(sys.argv[1:]) or "hello"))
