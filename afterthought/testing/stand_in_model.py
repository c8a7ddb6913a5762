"""A scripted ADK model for offline runs: it says what memory it was given, or plays a
script of replies (text or tool calls). It records every request it receives."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.models import BaseLlm
from google.adk.models._capabilities import LlmCapabilities
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types
from pydantic import Field, PrivateAttr

_BLOCK = re.compile(r"<ZEP_CONTEXT>\n?(.*?)\n?</ZEP_CONTEXT>", re.DOTALL)
#: What ADK's ``PreloadMemoryTool`` puts in a request (as user content).
_PRELOADED = re.compile(r"<PAST_CONVERSATIONS>\n?(.*?)\n?</PAST_CONVERSATIONS>", re.DOTALL)
_USAGE = types.GenerateContentResponseUsageMetadata(
    prompt_token_count=1, candidates_token_count=1, total_token_count=2
)


def system_text(request: LlmRequest) -> str:
    instruction = request.config.system_instruction if request.config else None
    return instruction if isinstance(instruction, str) else ""


def memory_lines(request: LlmRequest) -> list[str]:
    """The lines of the ``<ZEP_CONTEXT>`` block the request carried (empty if none)."""
    found = _BLOCK.search(system_text(request))
    return [line.strip() for line in found.group(1).splitlines() if line.strip()] if found else []


def preloaded_lines(request: LlmRequest) -> list[str]:
    """The lines of the ``<PAST_CONVERSATIONS>`` block ADK's ``PreloadMemoryTool`` put in
    the request (``Time: …`` and ``author: text`` lines; empty if none)."""
    for content in request.contents:
        for part in content.parts or []:
            if part.text and (found := _PRELOADED.search(part.text)):
                return [line.strip() for line in found.group(1).splitlines() if line.strip()]
    return []


class StandInLlm(BaseLlm):
    """Replies from ``script`` in order; a reply is a str, or ``{"call": name, "args": {}}``.
    With the script used up it says what memory it received (the hooks' block, or what
    ADK's ``PreloadMemoryTool`` preloaded)."""

    model: str = "afterthought-stand-in"
    script: list[str | dict[str, Any]] = Field(default_factory=list)
    _requests: list[LlmRequest] = PrivateAttr(default_factory=list)

    @property
    def capabilities(self) -> LlmCapabilities:
        return LlmCapabilities(output_schema_and_tools=True)

    @property
    def requests(self) -> list[LlmRequest]:
        return self._requests

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self._requests.append(llm_request)
        reply = self.script.pop(0) if self.script else self._describe(llm_request)
        if isinstance(reply, dict):
            call = types.Part.from_function_call(name=reply["call"], args=reply.get("args", {}))
            yield LlmResponse(content=types.ModelContent([call]), usage_metadata=_USAGE)
            return
        if stream:
            words = reply.split(" ")
            for i, word in enumerate(words):
                chunk = word if i == len(words) - 1 else word + " "
                yield LlmResponse(
                    content=types.ModelContent(chunk), partial=True, usage_metadata=_USAGE
                )
        yield LlmResponse(
            content=types.ModelContent(reply), turn_complete=True, usage_metadata=_USAGE
        )

    @staticmethod
    def _describe(request: LlmRequest) -> str:
        lines = memory_lines(request) or preloaded_lines(request)
        if not lines:
            return "(stand-in model) I received no memory about you."
        return "(stand-in model) My memory of you:\n" + "\n".join(lines)
