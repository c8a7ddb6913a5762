"""``MemoryPlugin``: memory for every agent of an ``App(plugins=[MemoryPlugin()])``."""

from __future__ import annotations

import logging
from typing import Any

from google.adk.agents.callback_context import CallbackContext
from google.adk.agents.invocation_context import InvocationContext
from google.adk.events.event import Event
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from typing_extensions import override

from afterthought.agent_hooks.turn_memory import TurnMemory

log = logging.getLogger("afterthought.hooks")


class MemoryPlugin(BasePlugin):
    """The callbacks' behaviour app-wide; nested ``AgentTool`` runs are skipped by default.
    Takes the same keyword arguments as ``create_callbacks``.

    ADK stops at the first plugin whose callback returns something, so a plugin that
    rewrites responses (a redaction, a guardrail) would hide them from plugins after it:
    replies are recorded from the event the user is shown (``on_event_callback``, which
    follows every ``after_model_callback``), and this plugin belongs first in the list
    (it warns once when it is not), where a plugin answering ``before_model_callback``
    (a cache) or rewriting events cannot hide a turn from it."""

    def __init__(
        self, *, name: str = "afterthought_memory", memory: TurnMemory | None = None, **kwargs: Any
    ) -> None:
        super().__init__(name=name)
        self.memory = memory or TurnMemory.create(**kwargs)
        self._order_checked = False

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
        if not llm_response.partial and not self.memory.nested(callback_context):
            self.memory.mark_tool_step(callback_context, llm_response)
        return None

    @override
    async def on_event_callback(
        self, *, invocation_context: InvocationContext, event: Event
    ) -> Event | None:
        self._check_order(invocation_context)
        await self.memory.after_event(CallbackContext(invocation_context), event)
        return None

    def _check_order(self, ctx: InvocationContext) -> None:
        if self._order_checked:
            return
        self._order_checked = True
        plugins = ctx.plugin_manager.plugins
        if plugins and plugins[0] is not self:
            log.warning(
                "MemoryPlugin is not the first plugin (position %d of %d): a plugin before it "
                "that answers before_model or rewrites events hides turns from memory",
                plugins.index(self) + 1 if self in plugins else 0,
                len(plugins),
            )

    @override
    async def close(self) -> None:
        await self.memory.aclose()
