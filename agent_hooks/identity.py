"""Whose memory a turn reads and writes. Never the model's choice (R4): explicit options,
then a per-call resolver, then session state, then the registry the worker fills.

Options and resolvers are the application's code and are trusted. Session state is not:
ADK's API server lets clients write it (``state_delta``), so a pin found there is checked
(``TurnMemory`` for the user and graph, the worker for the thread) unless the settings
say only the application writes it (``trust_state_identity``)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields, replace

from google.adk.agents.callback_context import CallbackContext
from google.adk.agents.readonly_context import ReadonlyContext

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


IdentityResolver = Callable[[ReadonlyContext], ZepIdentity | Awaitable[ZepIdentity | None] | None]


def from_state(ctx: ReadonlyContext) -> ZepIdentity:
    values = {name: ctx.state.get(key) for name, key in STATE_KEYS.items()}
    return ZepIdentity(**{k: v for k, v in values.items() if isinstance(v, str) and v})


def display_name(ctx: ReadonlyContext) -> str | None:
    """``zep_first_name`` / ``zep_last_name`` from state; no made-up "Anonymous User"."""
    parts = [ctx.state.get("zep_first_name"), ctx.state.get("zep_last_name")]
    return " ".join(p for p in parts if isinstance(p, str) and p) or None


async def resolve(
    ctx: ReadonlyContext, *, explicit: ZepIdentity, resolver: IdentityResolver | None
) -> ZepIdentity:
    """Explicit options, then the resolver, part by part: what the application pinned."""
    found = explicit
    if resolver is not None:
        value = resolver(ctx)
        if inspect.isawaitable(value):
            value = await value
        found = found.filled_from(value)
    return found
