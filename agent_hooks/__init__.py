"""Runs inside the agent process: ADK hooks that read memory inline and queue every write."""

from afterthought.agent_hooks.callbacks import (
    MemoryCallbacks,
    create_after_model_callback,
    create_before_model_callback,
    create_callbacks,
)
from afterthought.agent_hooks.context_tool import ZepContextTool
from afterthought.agent_hooks.identity import ZepIdentity
from afterthought.agent_hooks.injection import DEFAULT_CONTEXT_TEMPLATE
from afterthought.agent_hooks.memory_service import ZepMemoryService
from afterthought.agent_hooks.plugin import MemoryPlugin
from afterthought.agent_hooks.turn_memory import ContextBuilder, ContextInput, TurnMemory

__all__ = [
    "DEFAULT_CONTEXT_TEMPLATE",
    "ContextBuilder",
    "ContextInput",
    "MemoryCallbacks",
    "MemoryPlugin",
    "TurnMemory",
    "ZepContextTool",
    "ZepIdentity",
    "ZepMemoryService",
    "create_after_model_callback",
    "create_before_model_callback",
    "create_callbacks",
]
