"""``ZepContextTool``: memory through ``LlmAgent(tools=[...])`` instead of a callback.

Like ADK's ``PreloadMemoryTool`` it is never declared to the model: it only prepares each
request (injects the block, queues the user's message once). Pair it with
``create_after_model_callback(memory=tool.memory)`` to store the replies too."""

from __future__ import annotations

from typing import Any

from google.adk.models.llm_request import LlmRequest
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_context import ToolContext
from typing_extensions import override

from afterthought.agent_hooks.turn_memory import TurnMemory


class ZepContextTool(BaseTool):
    def __init__(self, *, memory: TurnMemory | None = None, **kwargs: Any) -> None:
        super().__init__(name="zep_context", description="Long-term memory (not callable).")
        self.memory = memory or TurnMemory.create(**kwargs)

    @override
    async def process_llm_request(
        self, *, tool_context: ToolContext, llm_request: LlmRequest
    ) -> None:
        # No super(): declaring the tool would let the model call it.
        await self.memory.before_model(callback_context=tool_context, llm_request=llm_request)
