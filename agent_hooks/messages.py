"""What of an ADK conversation becomes a memory message, shared by the callbacks and the
memory service so that both give the same turn the same key."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping

from google.adk.events.event import Event
from google.adk.models.llm_response import LlmResponse
from google.genai import types

from afterthought.agent_hooks.identity import UNRESOLVED, ZepIdentity
from afterthought.contract import QueuedMessage, Unmade, to_role

#: ``custom_metadata`` key of a reply the hooks recorded: its ordinal in its invocation.
#: ADK copies a response's metadata into its event, so a stored session says which of its
#: events the hooks recorded, and under which key, when an invocation also holds what
#: they never saw (an agent without the hooks, a banner of a non-model agent).
ORDINAL_KEY = "afterthought:ordinal"


class Unresolved(Unmade):
    """The application's resolver gave no identity for the event's invocation."""

    reason = UNRESOLVED


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
    identity: ZepIdentity | Mapping[str, ZepIdentity] | None = None,
    refused: Counter[str] | None = None,
) -> list[QueuedMessage]:
    """Finished events with something said, keyed like the callbacks key them; marked as
    replays, so the worker sends only what the backend does not hold yet; each said when
    its invocation began (``said_ms``: its first event's time), and counted among the
    sayings of its role and text (``saying``). ``identity`` is what the session's turns
    were written with (its pins, ``Pins.writes``), for all or by invocation id (the
    application's resolver's answer for each; one missing: unresolved): the replay is
    reconciled against the thread they went to. ``refused`` counts by reason the events
    whose message cannot be made (an id or a time, ``Unmade``; an invocation unresolved),
    left out; without it the first raises.

    In an invocation where the hooks stamped replies, only those are theirs, under the
    ordinal they were recorded with; in one without stamps (recorded before stamps, or
    never by the hooks) every text event counts, in order."""
    events = list(events)
    # A reply may repeat the memory its turn read when it began: it is dated by the
    # invocation's first event, so a forget after that refuses it however late it came.
    began: dict[str, float] = {}
    for event in events:
        if event.invocation_id and math.isfinite(event.timestamp):
            began[event.invocation_id] = min(
                event.timestamp, began.get(event.invocation_id, event.timestamp)
            )
    said = [
        event
        for event in events
        if not event.partial and event.invocation_id and said_text(event.content).strip()
    ]
    stamped = {event.invocation_id for event in said if _stamped(event) is not None}
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
        pins = (
            identity.get(event.invocation_id)
            if isinstance(identity, Mapping)
            else identity or ZepIdentity()
        )
        try:
            if pins is None:
                raise Unresolved(UNRESOLVED)
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
                    began=began.get(event.invocation_id),
                    replay=True,
                    zep_user_uuid=pins.user_uuid,
                    zep_graph_uuid=pins.graph_uuid,
                    zep_thread_uuid=pins.thread_uuid,
                    saying=sayings[spoken],
                )
            )
        except Unmade as exc:
            if refused is None:
                raise
            refused[exc.reason] += 1
    return messages
