"""How a context block enters the model request: fenced, neutralised, never formatted."""

from __future__ import annotations

import logging
import re
from typing import Literal

from google.adk.models.llm_request import LlmRequest
from google.genai import types

from afterthought.validation import normalise, normalise_mapped

log = logging.getLogger("afterthought.hooks")

#: Seed 000's canonical template (zep-adk's Python, TypeScript and Go share it).
DEFAULT_CONTEXT_TEMPLATE = (
    "The following context is retrieved from Zep, the agent's long-term memory. "
    "It contains relevant facts, entities, and prior knowledge about the user. "
    "Use it to inform your responses.\n\n"
    "<ZEP_CONTEXT>\n"
    "{context}\n"
    "</ZEP_CONTEXT>"
)

Injection = Literal["system_instruction", "user_content"]

#: ADK's private hook for request-scoped user content (``PreloadMemoryTool`` uses it).
_TRANSIENT = "_insert_transient_user_content"

_FENCE = re.compile(
    r"<\s*([A-Za-z_][\w-]*)\s*>\s*\{context\}|\{context\}\s*<\s*/\s*([A-Za-z_][\w-]*)"
)


def fence_names(template: str) -> set[str]:
    """Tag names that wrap ``{context}`` in the template (``ZEP_CONTEXT`` by default)."""
    return {name for m in _FENCE.finditer(template) for name in m.groups() if name}


#: Digits and signs that read as a letter of a tag name ("zep_c0ntext"): a model may
#: read them as the tag, so they count as the letter.
_READS_AS = {
    "a": "a4@",
    "b": "b8",
    "e": "e3",
    "g": "g9",
    "i": "i1l|!",
    "l": "l1i|",
    "o": "o0",
    "s": "s5$",
    "t": "t7+",
    "z": "z2",
}


def _markers(fences: set[str]) -> re.Pattern[str]:
    """A fence tag's opening bracket as the normalised view reads it: any case, spaced,
    split by invisible characters, with full-width or look-alike brackets, letters written
    as digits, and any run of slashes or backslashes before the name ("<//", "<\\/")."""
    names = []
    for name in fences:
        chars = [c for c in normalise(name) if c.isalnum()]
        names.append(r"[\s_\-.]*".join(f"[{re.escape(_READS_AS.get(c, c))}]" for c in chars))
    return re.compile(rf"<(?=[\s/\\]*(?:{'|'.join(names)}))")


def neutralise(block: str, fences: set[str]) -> str:
    """Defuse any text in memory that would open or close the fence around it: the
    bracket that starts a fence tag — found on the normalised view, whatever character
    stands for it — becomes ``&lt;``, so no tag is left to read."""
    if not fences:
        return block
    view, origin = normalise_mapped(block)
    brackets = sorted({origin[found.start()] for found in _markers(fences).finditer(view)})
    out: list[str] = []
    done = 0
    for at in brackets:
        out += [block[done:at], "&lt;"]
        done = at + 1
    out.append(block[done:])
    return "".join(out)


def render(block: str, template: str = DEFAULT_CONTEXT_TEMPLATE) -> str:
    """Literal replacement of ``{context}``: braces, ``%`` or ``$`` in memory stay inert."""
    return template.replace("{context}", neutralise(block, fence_names(template)))


def transient_content_supported() -> bool:
    return callable(getattr(LlmRequest, _TRANSIENT, None))


def inject(llm_request: LlmRequest, text: str, how: Injection = "system_instruction") -> None:
    """System instruction by default. ``user_content`` keeps the system prompt stable (and
    provider context caches warm) through ADK's private transient-content hook; without
    it, it falls back to the system instruction."""
    if how == "user_content":
        if transient_content_supported():
            content = types.Content(role="user", parts=[types.Part.from_text(text=text)])
            getattr(llm_request, _TRANSIENT)([content])
            return
        log.warning("this ADK has no transient user content; memory goes to the system prompt")
    llm_request.append_instructions([text])
