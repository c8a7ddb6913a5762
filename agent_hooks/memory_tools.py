"""Model-in-the-loop memory (seed 004's remember / search / context): tools the model
decides to call. Whose memory is never an argument (R4): it comes from the turn."""

from __future__ import annotations

import logging
from typing import Any

from google.adk.tools.base_tool import BaseTool
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_context import ToolContext

from afterthought.agent_hooks.graph_search_tool import ZepGraphSearchTool
from afterthought.agent_hooks.turn_memory import TurnMemory
from afterthought.validation import refusal

log = logging.getLogger("afterthought.hooks")

#: The longest fact the model may ask to remember.
MAX_FACT_CHARS = 2000
#: What the model hears when validation refuses a fact: neutral, no reason given.
NOT_SAVED = "Not saved."


def create_memory_tools(memory: TurnMemory | None = None, **kwargs: Any) -> list[BaseTool]:
    """``remember`` (a queued write, trust ``model``), ``memory_search`` and
    ``recall_context``, sharing one :class:`TurnMemory`."""
    memory = memory or TurnMemory.create(**kwargs)

    async def remember(fact: str, tool_context: ToolContext) -> str:
        """Save one fact about the user to long-term memory, for later conversations."""
        if not isinstance(fact, str) or not fact.strip():
            return "Nothing saved: give the fact as text."
        if len(fact) > MAX_FACT_CHARS:
            return f"Nothing saved: keep a fact under {MAX_FACT_CHARS} characters."
        # The worker decides (and quarantines what it refuses, for an operator to see);
        # the same decision here only spares the model a "Saved." that is not true. The
        # answer never says why: that would teach the model the rule.
        refused = refusal(fact, trust="model") is not None
        try:
            queued = await memory.queue_change(
                app=tool_context.session.app_name,
                user_id=tool_context.user_id,
                kind="fact",
                content=fact.strip(),
                source=f"{tool_context.invocation_id}:{tool_context.function_call_id}",
                trust="model",
            )
        except Exception as exc:
            log.warning("remember failed error=%s", type(exc).__name__)
            queued = False
        if refused:
            log.info("remember refused chars=%d", len(fact))
            return NOT_SAVED
        return "Saved." if queued else "Not saved yet: memory is unreachable right now."

    async def recall_context(tool_context: ToolContext) -> str:
        """What long-term memory holds about the user right now."""
        block = await memory.current_block(tool_context, _user_text(tool_context))
        return block or "Nothing is known about the user yet."

    return [
        FunctionTool(remember),
        ZepGraphSearchTool(memory=memory),
        FunctionTool(recall_context),
    ]


def _user_text(ctx: ToolContext) -> str:
    content = ctx.user_content
    return "".join(p.text or "" for p in (content.parts or [])) if content else ""
