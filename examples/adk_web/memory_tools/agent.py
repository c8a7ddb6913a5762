"""ADK's own memory tools over the server's memory service (``adk web
--memory_service_uri afterthought://``): ``PreloadMemoryTool`` puts what memory holds
about the user's message into each turn, ``load_memory`` lets the model search it, and
the session is added to memory after every turn. Without ``GOOGLE_API_KEY`` the model is
a stand-in that says what memory it was given."""

import os

from google.adk.agents import LlmAgent
from google.adk.agents.callback_context import CallbackContext
from google.adk.tools.load_memory_tool import load_memory_tool
from google.adk.tools.preload_memory_tool import PreloadMemoryTool

from afterthought.testing import StandInLlm


async def remember(callback_context: CallbackContext) -> None:
    await callback_context.add_session_to_memory()  # queued: the turn does not wait


root_agent = LlmAgent(
    name="assistant",
    model="gemini-2.5-flash" if os.environ.get("GOOGLE_API_KEY") else StandInLlm(),
    instruction="You are a helpful assistant who remembers the user.",
    tools=[PreloadMemoryTool(), load_memory_tool],
    after_agent_callback=remember,
)
