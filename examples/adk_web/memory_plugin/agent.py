"""Memory for every agent of the app: ``MemoryPlugin`` reads the user's memory into each
model call and queues every turn (``afterthought worker`` stores them). Without
``GOOGLE_API_KEY`` the model is a stand-in that says what memory it was given."""

import os

from google.adk.agents import LlmAgent
from google.adk.apps import App

from afterthought.agent_hooks import MemoryPlugin
from afterthought.testing import StandInLlm

root_agent = LlmAgent(
    name="assistant",
    model="gemini-2.5-flash" if os.environ.get("GOOGLE_API_KEY") else StandInLlm(),
    instruction="You are a helpful assistant who remembers the user.",
)
# adk web loads `app` before `root_agent`; its name is the folder's.
app = App(name="memory_plugin", root_agent=root_agent, plugins=[MemoryPlugin()])
