"""Whose memory a turn reads and writes. Never the model's choice (R4): explicit options,
then a per-call resolver, then session state, then the registry the worker fills.

Options and resolvers are the application's code and are trusted. Session state is not:
ADK's API server lets clients write it (``state_delta``), so a pin found there is checked
unless the settings say only the application writes it (``trust_state_identity``): a user
or graph against the registry before a read (``ContextReader.checked``), and never put on
a write (``Pins.writes``); a thread by the worker, against the backend, before a write."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, fields, replace

from google.adk.agents.callback_context import CallbackContext
from google.adk.agents.invocation_context import InvocationContext
from google.adk.agents.readonly_context import ReadonlyContext
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from google.genai import types

log = logging.getLogger("afterthought.hooks")

#: Why a message is dropped when the application's resolver gave no identity for it.
UNRESOLVED = "identity unresolved"
#: Session-state keys an application may set to pin a session to Zep UUIDs it stores.
STATE_KEYS = {
    "user_uuid": "zep_user_uuid",
    "graph_uuid": "zep_graph_uuid",
    "thread_uuid": "zep_thread_uuid",
}


@dataclass(frozen=True, slots=True)
class Who:
    """The ADK ids of a turn."""

    app: str
    user_id: str
    session_id: str
    invocation_id: str

    @classmethod
    def of(cls, ctx: CallbackContext) -> Who:
        return cls(ctx.session.app_name, ctx.user_id, ctx.session.id, ctx.invocation_id)


@dataclass(frozen=True, slots=True)
class ZepIdentity:
    """Zep UUIDs pinned for a turn; a missing part comes from the registry."""

    user_uuid: str | None = None
    graph_uuid: str | None = None
    """The user's graph, or a shared (non-user) graph to read from."""
    thread_uuid: str | None = None

    @property
    def for_changes(self) -> ZepIdentity:
        """Where a fact the user's memory gains (or loses) is written: a graph pinned without
        its user is a shared graph to read from, never one user's facts' place."""
        return self if self.user_uuid else replace(self, graph_uuid=None)

    def filled_from(self, other: ZepIdentity | None) -> ZepIdentity:
        """Parts of ``self`` win; ``other`` fills the gaps."""
        if other is None:
            return self
        return replace(
            self,
            **{
                f.name: getattr(self, f.name) or getattr(other, f.name) for f in fields(ZepIdentity)
            },
        )


@dataclass(frozen=True, slots=True)
class Pins:
    """What a turn is pinned to: by the application (options, resolver: trusted) and by
    session state (client-writable, so checked before use unless ``trusted``)."""

    app: ZepIdentity = ZepIdentity()
    state: ZepIdentity = ZepIdentity()
    trusted: bool = False
    """Only the application writes session state (``trust_state_identity``)."""

    @property
    def writes(self) -> ZepIdentity:
        """Whose memory the turn writes, known without a lookup: its messages are queued
        before anything that can wait or fail (W0). Of untrusted state only the thread is
        kept, and the worker writes there only once the backend says it is the user's;
        a user or graph pinned there is left out, and the worker takes the registry's
        user, the only one such a pin may name."""
        if self.trusted:
            return self.app.filled_from(self.state)
        return self.app.filled_from(ZepIdentity(thread_uuid=self.state.thread_uuid))


IdentityResolver = Callable[[ReadonlyContext], ZepIdentity | Awaitable[ZepIdentity | None] | None]


def from_state(state: State | Mapping[str, object]) -> ZepIdentity:
    """What session state pins (a turn's state, or a stored session's)."""
    values = {name: state.get(key) for name, key in STATE_KEYS.items()}
    return ZepIdentity(**{k: v for k, v in values.items() if isinstance(v, str) and v})


def display_name(ctx: ReadonlyContext) -> str | None:
    """``zep_first_name`` / ``zep_last_name`` from state; no made-up "Anonymous User"."""
    parts = [ctx.state.get("zep_first_name"), ctx.state.get("zep_last_name")]
    return " ".join(p for p in parts if isinstance(p, str) and p) or None


async def pins_of(
    ctx: ReadonlyContext,
    *,
    explicit: ZepIdentity,
    resolver: IdentityResolver | None,
    trust_state: bool,
) -> Pins:
    """Explicit options, then the resolver, part by part (what the application pinned);
    and what session state pins."""
    found = explicit
    if resolver is not None:
        value = resolver(ctx)
        if inspect.isawaitable(value):
            value = await value
        found = found.filled_from(value)
    return Pins(app=found, state=from_state(ctx.state), trusted=trust_state)


async def replay_pins(
    session: Session,
    *,
    explicit: ZepIdentity,
    resolver: IdentityResolver | None,
    trust_state: bool,
) -> ZepIdentity | dict[str, ZepIdentity]:
    """Whose memory a stored session's turns were written to (``Pins.writes``), found as
    the turn path found it: without a resolver, one identity for the whole session; with
    one, by invocation id, the resolver asked for each with a context of the session at
    that invocation (its user content, state, ids). An invocation whose resolver call
    failed is left out (its messages are dropped, counted: whose are they?)."""
    if resolver is None:
        return Pins(app=explicit, state=from_state(session.state), trusted=trust_state).writes
    service = InMemorySessionService()  # required by the context; never called
    said: dict[str, types.Content | None] = {}  # each invocation's, in order: its user's words
    for event in session.events:
        if event.invocation_id:
            said.setdefault(event.invocation_id, None)
            if event.author == "user" and said[event.invocation_id] is None:
                said[event.invocation_id] = event.content
    found: dict[str, ZepIdentity] = {}
    for invocation, user_content in said.items():
        ctx = ReadonlyContext(
            InvocationContext(
                session_service=service,
                invocation_id=invocation,
                session=session,
                user_content=user_content,
            )
        )
        try:
            pins = await pins_of(ctx, explicit=explicit, resolver=resolver, trust_state=trust_state)
        except Exception as exc:  # the application's code: its failure drops, never raises
            log.warning("identity resolver failed in a replay error=%s", type(exc).__name__)
            continue
        found[invocation] = pins.writes
    return found
