"""What of an ADK conversation becomes a memory message, shared by the callbacks and the
memory service so that both give the same turn the same key."""

from __future__ import annotations

from collections.abc import Iterable

from google.adk.events.event import Event
from google.adk.models.llm_response import LlmResponse
from google.genai import types

from afterthought.agent_hooks.identity import ZepIdentity
from afterthought.contract import QueuedMessage, to_role

#: ``custom_metadata`` key of a reply the hooks recorded: its ordinal in its invocation.
#: ADK copies a response's metadata into its event, so a stored session says which of its
#: events the hooks recorded, and under which key, when an invocation also holds what
#: they never saw (an agent without the hooks, a banner of a non-model agent).
ORDINAL_KEY = "afterthought:ordinal"


def said_text(content: types.Content | None) -> str:
    """The text a speaker said: text parts only, thoughts left out."""
    if content is None or not content.parts:
        return ""
    return "".join(p.text for p in content.parts if p.text and not p.thought)


def stamp(response: LlmResponse, ordinal: int) -> None:
    """Mark a reply (a model response, or the event made of it) as recorded as ``ordinal``."""
    response.custom_metadata = {**(response.custom_metadata or {}), ORDINAL_KEY: ordinal}


def _stamped(event: Event) -> int | None:
    value = (event.custom_metadata or {}).get(ORDINAL_KEY)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def messages_from_events(
    events: Iterable[Event],
    *,
    app: str,
    user_id: str,
    session_id: str,
    assistant_name: str | None,
    identity: ZepIdentity | None = None,
) -> list[QueuedMessage]:
    """Finished events with something said, keyed like the callbacks key them; marked as
    replays, so the worker sends only what the backend does not hold yet; each said at
    its event's time (``said_ms``), and counted among the sayings of its role and text
    (``saying``). ``identity`` is what the session's turns were written with (its pins,
    ``Pins.writes``): the replay is reconciled against the thread they went to.

    In an invocation where the hooks stamped replies, only those are theirs, under the
    ordinal they were recorded with; in one without stamps (recorded before stamps, or
    never by the hooks) every text event counts, in order."""
    said = [
        event
        for event in events
        if not event.partial and event.invocation_id and said_text(event.content).strip()
    ]
    stamped = {event.invocation_id for event in said if _stamped(event) is not None}
    pins = identity or ZepIdentity()
    ordinals: dict[tuple[str, str], int] = {}
    sayings: dict[tuple[str, str], int] = {}
    messages: list[QueuedMessage] = []
    for event in said:
        said_by = event.content.role if event.content else None
        role = "user" if event.author == "user" else to_role(said_by)
        slot = (event.invocation_id, role or "")
        ordinal = ordinals.get(slot, 0)
        ordinals[slot] = ordinal + 1
        if event.invocation_id in stamped and role != "user":
            mark = _stamped(event)
            if mark is None:
                continue  # not something the hooks recorded
            ordinal = mark
        text = said_text(event.content)
        spoken = (role or "", text)
        sayings[spoken] = sayings.get(spoken, 0) + 1
        messages.append(
            QueuedMessage.build(
                app=app,
                user_id=user_id,
                session_id=session_id,
                invocation_id=event.invocation_id,
                role=role,
                ordinal=ordinal,
                content=text,
                name=assistant_name if role == "assistant" else None,
                at=event.timestamp,
                replay=True,
                zep_user_uuid=pins.user_uuid,
                zep_graph_uuid=pins.graph_uuid,
                zep_thread_uuid=pins.thread_uuid,
                saying=sayings[spoken],
            )
        )
    return messages
