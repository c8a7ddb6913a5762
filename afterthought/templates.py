"""Zep context templates (seed 003): an offline validator, and create / read / update /
delete through the configured backend. Set ``context_template_uuid`` to render every
context block with one; the local backend renders the variables it has data for."""

from __future__ import annotations

import re
from dataclasses import dataclass

from afterthought.backends.base import MemoryBackend

VARIABLES = frozenset({"edges", "entities", "user_summary", "observations", "thread_summaries"})
#: Variables that take ``limit`` only, and render at most this many items.
CAPPED = {"observations": 20, "thread_summaries": 20}
MAX_LIMIT = 1000
MAX_NAME_CHARS = 100

_VARIABLE = re.compile(r"%\{([^{}]*)\}")
_PARAM = re.compile(r"(\w+)=(\[[^\]]*\]|\S+)")


class TemplateError(ValueError):
    """The template would be refused by Zep; the message lists every problem."""


@dataclass(frozen=True, slots=True)
class Variable:
    name: str
    params: dict[str, str]
    text: str
    """The variable as written, ``%{...}`` included."""


def variables(template: str) -> list[Variable]:
    found = []
    for match in _VARIABLE.finditer(template):
        name, _, rest = match.group(1).strip().partition(" ")
        found.append(Variable(name, dict(_PARAM.findall(rest)), match.group(0)))
    return found


def problems(template: str) -> list[str]:
    """Every reason Zep would refuse the template (names, brackets, parameters, limits)."""
    found: list[str] = []
    if not template.strip():
        return ["the template is empty"]
    opened = template.count("%{")
    if opened != len(_VARIABLE.findall(template)):
        found.append("unbalanced %{ ... }: every variable needs its closing brace")
    for variable in variables(template):
        inner = variable.text[2:-1].strip()
        name = variable.name
        if name not in VARIABLES:
            found.append(f"unknown variable {name!r} (known: {', '.join(sorted(VARIABLES))})")
            continue
        leftover = _PARAM.sub("", inner.partition(" ")[2]).strip()
        if leftover:
            found.append(f"{name}: cannot read {leftover!r} (parameters are name=value)")
        allowed = {"limit"} if name in CAPPED else {"limit", "types", "include_attributes"}
        if name == "user_summary":
            allowed = set()
        for param, value in variable.params.items():
            if param not in allowed:
                found.append(f"{name} takes {', '.join(sorted(allowed)) or 'no parameters'}")
            elif param == "limit" and not (value.isdigit() and 1 <= int(value) <= MAX_LIMIT):
                found.append(f"{name}: limit must be 1..{MAX_LIMIT}")
            elif param == "types" and not re.fullmatch(r"\[\w+(,\s*\w+)*\]", value):
                found.append(f"{name}: types must look like [type1,type2]")
            elif param == "include_attributes" and value not in {"true", "false"}:
                found.append(f"{name}: include_attributes must be true or false")
    return found


def check(template: str, name: str | None = None) -> None:
    wrong = problems(template)
    if name is not None and not 0 < len(name) <= MAX_NAME_CHARS:
        wrong.append(f"the name must be 1..{MAX_NAME_CHARS} characters")
    if wrong:
        raise TemplateError("; ".join(wrong))


def render(template: str, values: dict[str, list[str]]) -> tuple[str, list[str]]:
    """Fill each variable with up to ``limit`` of its lines (capped ones at 20). Returns the
    text and the variables that had no data source (rendered empty)."""
    missing: list[str] = []

    def fill(variable: Variable) -> str:
        lines = values.get(variable.name)
        if lines is None:
            missing.append(variable.name)
            return ""
        limit = int(variable.params.get("limit", MAX_LIMIT))
        limit = min(limit, CAPPED.get(variable.name, MAX_LIMIT))
        return "\n".join(lines[:limit])

    rendered = template
    for variable in variables(template):
        rendered = rendered.replace(variable.text, fill(variable), 1)
    return rendered.strip(), missing


async def create_template(backend: MemoryBackend, *, name: str, template: str) -> str:
    """Validate offline, then create; returns the template's UUID."""
    check(template, name)
    return await backend.create_template(name=name, template=template)


async def update_template(
    backend: MemoryBackend, template_uuid: str, *, name: str, template: str
) -> None:
    check(template, name)
    await backend.update_template(template_uuid, name=name, template=template)


async def get_template(backend: MemoryBackend, template_uuid: str) -> tuple[str, str]:
    """``(name, template)``."""
    return await backend.get_template(template_uuid)


async def delete_template(backend: MemoryBackend, template_uuid: str) -> None:
    await backend.delete_template(template_uuid)
