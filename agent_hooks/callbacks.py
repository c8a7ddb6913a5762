"""ADK model callbacks that give an ``LlmAgent`` long-term memory.

    memory = create_callbacks()
    LlmAgent(..., before_model_callback=memory.before_model_callback,
             after_model_callback=memory.after_model_callback)

Keyword arguments are :class:`~afterthought.settings.Settings` fields (``key_prefix=``) or
:class:`~afterthought.agent_hooks.turn_memory.TurnMemory` options (``context_template=``,
``context_builder=``, ``injection=``, ``identity=``, ``resolve_identity=``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from google.adk.agents.callback_context import CallbackContext
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse

from afterthought.agent_hooks.turn_memory import TurnMemory

BeforeModelCallback = Callable[[CallbackContext, LlmRequest], Awaitable[LlmResponse | None]]
AfterModelCallback = Callable[[CallbackContext, LlmResponse], Awaitable[LlmResponse | None]]


class MemoryCallbacks(NamedTuple):
    before_model_callback: BeforeModelCallback
    after_model_callback: AfterModelCallback


def create_before_model_callback(
    memory: TurnMemory | None = None, **kwargs: Any
) -> BeforeModelCallback:
    """Injects memory into every model call and queues the user's message once."""
    memory = memory or TurnMemory.create(**kwargs)

    async def before_model_callback(
        callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        return await memory.before_model(callback_context=callback_context, llm_request=llm_request)

    return before_model_callback


def create_after_model_callback(
    memory: TurnMemory | None = None, **kwargs: Any
) -> AfterModelCallback:
    """Queues what the agent said (final text only)."""
    memory = memory or TurnMemory.create(**kwargs)

    async def after_model_callback(
        callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        return await memory.after_model(
            callback_context=callback_context, llm_response=llm_response
        )

    return after_model_callback


def create_callbacks(memory: TurnMemory | None = None, **kwargs: Any) -> MemoryCallbacks:
    """The pair, sharing one :class:`TurnMemory` (per-invocation block and ordinals)."""
    memory = memory or TurnMemory.create(**kwargs)
    return MemoryCallbacks(
        create_before_model_callback(memory), create_after_model_callback(memory)
    )
