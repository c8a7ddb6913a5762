"""How a context block enters the model request: fenced, neutralised, never formatted."""

from __future__ import annotations

import re

from google.adk.models.llm_request import LlmRequest

#: Seed 000's canonical template (zep-adk's Python, TypeScript and Go share it).
DEFAULT_CONTEXT_TEMPLATE = (
    "The following context is retrieved from Zep, the agent's long-term memory. "
    "It contains relevant facts, entities, and prior knowledge about the user. "
    "Use it to inform your responses.\n\n"
    "<ZEP_CONTEXT>\n"
    "{context}\n"
    "</ZEP_CONTEXT>"
)

_FENCE = re.compile(
    r"<\s*([A-Za-z_][\w-]*)\s*>\s*\{context\}|\{context\}\s*<\s*/\s*([A-Za-z_][\w-]*)"
)


def fence_names(template: str) -> set[str]:
    """Tag names that wrap ``{context}`` in the template (``ZEP_CONTEXT`` by default)."""
    return {name for m in _FENCE.finditer(template) for name in m.groups() if name}


def neutralise(block: str, fences: set[str]) -> str:
    """Defuse any text in memory that would open or close the fence around it."""
    for name in fences:
        block = re.sub(rf"<(\s*/?\s*{re.escape(name)})", r"&lt;\1", block, flags=re.IGNORECASE)
    return block


def render(block: str, template: str = DEFAULT_CONTEXT_TEMPLATE) -> str:
    """Literal replacement of ``{context}``: braces, ``%`` or ``$`` in memory stay inert."""
    return template.replace("{context}", neutralise(block, fence_names(template)))


def inject(llm_request: LlmRequest, text: str) -> None:
    """Append to the system instruction (ADK's helper joins with a blank line)."""
    llm_request.append_instructions([text])
