"""Runs inside the agent process: ADK hooks that read memory inline and queue every write."""

from agent_hooks.callbacks import MemoryCallbacks, create_callbacks
from agent_hooks.injection import DEFAULT_CONTEXT_TEMPLATE
from agent_hooks.memory_service import ZepMemoryService

__all__ = ["DEFAULT_CONTEXT_TEMPLATE", "MemoryCallbacks", "ZepMemoryService", "create_callbacks"]
