"""ADK model callbacks that give an ``LlmAgent`` long-term memory.

cb = create_callbacks()
LlmAgent(..., before_model_callback=cb.before_model_callback,
         after_model_callback=cb.after_model_callback)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from google.adk.agents.callback_context import CallbackContext
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse

from afterthought.backend import MemoryBackend
from afterthought.settings import Settings
from agent_hooks.injection import DEFAULT_CONTEXT_TEMPLATE
from agent_hooks.turn_memory import TurnMemory

BeforeModelCallback = Callable[..., Awaitable[LlmResponse | None]]
AfterModelCallback = Callable[..., Awaitable[LlmResponse | None]]


class MemoryCallbacks(NamedTuple):
    before_model_callback: BeforeModelCallback
    after_model_callback: AfterModelCallback


def create_callbacks(
    *,
    settings: Settings | None = None,
    context_template: str = DEFAULT_CONTEXT_TEMPLATE,
    backend: MemoryBackend | None = None,
    **overrides: Any,
) -> MemoryCallbacks:
    """The before/after pair, sharing per-invocation state. ``overrides`` are
    :class:`~afterthought.settings.Settings` fields (e.g. ``key_prefix="myapp"``)."""
    memory = TurnMemory(
        _settings(settings, overrides), context_template=context_template, backend=backend
    )

    async def before_model_callback(
        callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        return await memory.before_model(callback_context=callback_context, llm_request=llm_request)

    async def after_model_callback(
        callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        return await memory.after_model(
            callback_context=callback_context, llm_response=llm_response
        )

    return MemoryCallbacks(before_model_callback, after_model_callback)


def _settings(settings: Settings | None, overrides: dict[str, Any]) -> Settings:
    if settings is None:
        return Settings(**overrides)
    if not overrides:
        return settings
    return Settings.model_validate({**settings.model_dump(), **overrides})
