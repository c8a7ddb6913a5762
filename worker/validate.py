"""Which proposed facts may be written. Quarantined ones are recorded for review, never
written: instruction-like text, tool or retrieval output posing as a statement, claims
the assistant (or a tool) made about the user, values too long or oddly shaped."""

from __future__ import annotations

import re

from afterthought.backends.base import HistoryMessage
from afterthought.facts import Fact

#: Text that tries to steer the agent rather than state a fact.
INSTRUCTION = re.compile(
    r"ignore (?:all |any |the )?(?:previous|prior|above|earlier|your)|disregard|"
    r"from now on|(?:always|never) (?:respond|reply|answer|say|use|call|refer|tell|do)|"
    r"\byou (?:must|should|will|are now|have to)\b|system prompt|developer message|"
    r"new instructions?|\binstructions?\b|act as|pretend (?:to be|you)|jailbreak|override|"
    r"^\s*(?:system|assistant|developer)\s*:|<\s*/?\s*[a-z_]+\s*>",
    re.IGNORECASE | re.MULTILINE,
)
#: Text pasted from a tool, a search or a memory block rather than said.
TOOL_OUTPUT = re.compile(
    r"^\s*(?:tool|function|search|api|retrieval)\s*(?:result|output|response)\b|"
    r"```|\bZEP_CONTEXT\b|FACTS and ENTITIES|^\s*[{\[]",
    re.IGNORECASE | re.MULTILINE,
)


def quarantine_reason(
    fact: Fact,
    sources: dict[str, HistoryMessage],
    *,
    accept_assistant_facts: bool = False,
) -> str | None:
    """Why the fact must not be written, or None if it may be."""
    if fact.trust in ("assistant", "tool") and not accept_assistant_facts:
        return f"{fact.trust}-asserted"
    for key in fact.source_keys:
        source = sources.get(key)
        if source is None:
            return "unknown source"
        if source.role in ("tool", "function"):
            return "tool output"
        if source.role == "assistant" and not accept_assistant_facts:
            return "assistant-asserted"
        if INSTRUCTION.search(source.content):
            return "instruction-like"
        if TOOL_OUTPUT.search(source.content):
            return "tool or retrieval output"
    if INSTRUCTION.search(fact.value) or TOOL_OUTPUT.search(fact.value):
        return "instruction-like value"
    if len(fact.value.split()) > 12:
        return "value too long for a fact"
    return None
