"""``MemoryPlugin``: memory for every agent of an ``App(plugins=[MemoryPlugin()])``."""

from __future__ import annotations

from typing import Any

from google.adk.agents.callback_context import CallbackContext
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from typing_extensions import override

from afterthought.agent_hooks.turn_memory import TurnMemory


class MemoryPlugin(BasePlugin):
    """The callbacks' behaviour app-wide; nested ``AgentTool`` runs are skipped by default.
    Takes the same keyword arguments as ``create_callbacks``."""

    def __init__(
        self, *, name: str = "afterthought_memory", memory: TurnMemory | None = None, **kwargs: Any
    ) -> None:
        super().__init__(name=name)
        self.memory = memory or TurnMemory.create(**kwargs)

    @override
    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        return await self.memory.before_model(
            callback_context=callback_context, llm_request=llm_request
        )

    @override
    async def after_model_callback(
        self, *, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        return await self.memory.after_model(
            callback_context=callback_context, llm_response=llm_response
        )

    @override
    async def close(self) -> None:
        await self.memory.aclose()
