"""What of an ADK conversation becomes a memory message, shared by the callbacks and the
memory service so that both give the same turn the same key."""

from __future__ import annotations

from collections.abc import Iterable

from google.adk.events.event import Event
from google.genai import types

from afterthought.contract import QueuedMessage, to_role


def said_text(content: types.Content | None) -> str:
    """The text a speaker said: text parts only, thoughts left out."""
    if content is None or not content.parts:
        return ""
    return "".join(p.text for p in content.parts if p.text and not p.thought)


def messages_from_events(
    events: Iterable[Event],
    *,
    app: str,
    user_id: str,
    session_id: str,
    assistant_name: str | None,
) -> list[QueuedMessage]:
    """Finished events with something said, keyed like the callbacks key them; marked as
    replays, so the worker sends only what the backend does not hold yet; each said at
    its event's time (``said_ms``), and counted among the sayings of its role and text
    (``saying``)."""
    ordinals: dict[tuple[str, str], int] = {}
    sayings: dict[tuple[str, str], int] = {}
    messages: list[QueuedMessage] = []
    for event in events:
        text = said_text(event.content)
        if event.partial or not text.strip() or not event.invocation_id:
            continue
        said_by = event.content.role if event.content else None
        role = "user" if event.author == "user" else to_role(said_by)
        slot = (event.invocation_id, role or "")
        ordinal = ordinals.get(slot, 0)
        ordinals[slot] = ordinal + 1
        said = (role or "", text)
        sayings[said] = sayings.get(said, 0) + 1
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
                saying=sayings[said],
            )
        )
    return messages
