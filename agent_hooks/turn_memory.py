"""The per-process memory of the turn path: read one context block per invocation within
the budget, queue each message once, and never let a memory failure reach ADK."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from google.adk.agents.callback_context import CallbackContext
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse

from afterthought.backend import MemoryBackend, UserRef, open_backend
from afterthought.contract import QueuedMessage, Role, thread_key
from afterthought.direct_write import DirectWriter
from afterthought.enqueue import Enqueuer
from afterthought.identity import IdentityRegistry
from afterthought.settings import Settings
from agent_hooks.injection import DEFAULT_CONTEXT_TEMPLATE, inject, render
from agent_hooks.messages import said_text

log = logging.getLogger("afterthought.hooks")
T = TypeVar("T")

#: Invocations remembered per process (for block reuse and message ordinals).
MAX_TRACKED_INVOCATIONS = 4096
#: Session-state key holding the id of the session that owns the run. An ``AgentTool``
#: copies its caller's state into the child session, so a child sees another id there.
OWNER_KEY = "afterthought:session"


@dataclass(slots=True)
class _Turn:
    block: asyncio.Future[str]
    ordinals: dict[Role, int] = field(default_factory=dict)

    def next_ordinal(self, role: Role) -> int:
        n = self.ordinals.get(role, 0)
        self.ordinals[role] = n + 1
        return n


@dataclass(frozen=True, slots=True)
class _Who:
    app: str
    user_id: str
    session_id: str
    invocation_id: str

    @classmethod
    def of(cls, ctx: CallbackContext) -> _Who:
        return cls(ctx.session.app_name, ctx.user_id, ctx.session.id, ctx.invocation_id)


class TurnMemory:
    """Shared by the before/after callbacks (and later the plugin and tools)."""

    def __init__(
        self,
        settings: Settings,
        *,
        context_template: str = DEFAULT_CONTEXT_TEMPLATE,
        backend: MemoryBackend | None = None,
    ) -> None:
        if "{context}" not in context_template:
            raise ValueError("context_template must contain a literal {context}")
        self.settings = settings
        self.context_template = context_template
        self._backend = backend
        self.direct: DirectWriter | None = None
        if settings.direct_write_on_outage:
            self.direct = DirectWriter(settings, self.backend)
        self.enqueuer = Enqueuer(settings, direct=self.direct)
        self._turns: OrderedDict[str, _Turn] = OrderedDict()

    @property
    def backend(self) -> MemoryBackend:
        if self._backend is None:
            self._backend = open_backend(self.settings)
        return self._backend

    # --- before the model ---------------------------------------------------------------
    async def before_model(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        try:
            if self._nested(callback_context):
                return None
            turn = self._turns.get(callback_context.invocation_id)
            if turn is None:
                # First model call of the invocation: queue the user's message while the
                # block is read, so the turn waits for the slower of the two, not both.
                turn, write = self._start_turn(callback_context)
                block, _ = await asyncio.gather(turn.block, write)
            else:  # later calls (after a tool step) reuse the block: tool steps keep memory
                block = await turn.block
            if block:
                inject(llm_request, render(block, self.context_template))
        except Exception as exc:  # R1: memory never breaks the turn
            log.warning(
                "before_model failed invocation=%s error=%s",
                callback_context.invocation_id,
                type(exc).__name__,
            )
        return None

    def _start_turn(self, ctx: CallbackContext) -> tuple[_Turn, Awaitable[bool]]:
        who = _Who.of(ctx)
        text = said_text(ctx.user_content)
        turn = _Turn(block=asyncio.ensure_future(self._read_block(who, ctx, text)))
        self._remember(who.invocation_id, turn)
        if not text:
            return turn, _done(True)
        message = self._message(who, turn, "user", text, ctx, at=_user_event_time(ctx))
        return turn, self.enqueuer.enqueue([message])

    async def _read_block(self, who: _Who, ctx: CallbackContext, query: str) -> str:
        budget = self.settings.retrieval_budget
        try:
            async with asyncio.timeout(budget):
                user = await self._user(who, ctx)
                if user is None:
                    return ""
                return await self.backend.get_context(
                    user=user,
                    query=query,
                    max_chars=self.settings.context_max_chars,
                    timeout=budget,
                )
        except Exception as exc:
            log.warning(
                "memory read skipped invocation=%s error=%s", who.invocation_id, type(exc).__name__
            )
            return ""

    async def _user(self, who: _Who, ctx: CallbackContext) -> UserRef | None:
        """Identity from session state when pinned there, else the registry."""
        state = ctx.state
        user_uuid, graph_uuid = state.get("zep_user_uuid"), state.get("zep_graph_uuid")
        if isinstance(user_uuid, str) and isinstance(graph_uuid, str):
            return UserRef(user_uuid=user_uuid, graph_uuid=graph_uuid)
        registry = IdentityRegistry(self.enqueuer.redis(), self.settings)
        known = await registry.lookup(app=who.app, user_id=who.user_id, session_id=who.session_id)
        if self.direct is not None and known.user and known.thread_uuid:
            thread = thread_key(app=who.app, user_id=who.user_id, session_id=who.session_id)
            self.direct.remember(thread, known.thread_uuid)
        return known.user

    # --- after the model ----------------------------------------------------------------
    async def after_model(
        self, *, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        try:
            if llm_response.partial:  # W8: chunks are display hints; the aggregate follows
                return None
            if self._nested(callback_context):
                return None
            text = said_text(llm_response.content)
            if not text.strip():  # function-call-only, thought-only or empty
                return None
            who = _Who.of(callback_context)
            turn = self._turns.get(who.invocation_id)
            if turn is None:
                turn = _Turn(block=_done(""))
                self._remember(who.invocation_id, turn)
            message = self._message(who, turn, "assistant", text, callback_context, at=None)
            await self.enqueuer.enqueue([message])
        except Exception as exc:
            log.warning(
                "after_model failed invocation=%s error=%s",
                callback_context.invocation_id,
                type(exc).__name__,
            )
        return None

    # --- shared -------------------------------------------------------------------------
    def _nested(self, ctx: CallbackContext) -> bool:
        """W8: a nested run (an ``AgentTool``'s child runner) is not the user's turn."""
        owner = ctx.state.get(OWNER_KEY)
        if owner is None:
            ctx.state[OWNER_KEY] = ctx.session.id
            return False
        return self.settings.skip_nested and owner != ctx.session.id

    def _message(
        self,
        who: _Who,
        turn: _Turn,
        role: Role,
        text: str,
        ctx: CallbackContext,
        *,
        at: float | None,
    ) -> QueuedMessage:
        if role == "assistant":
            name: str | None = self.settings.assistant_name
        else:
            parts = [ctx.state.get("zep_first_name"), ctx.state.get("zep_last_name")]
            name = " ".join(p for p in parts if isinstance(p, str) and p) or None
        return QueuedMessage.build(
            app=who.app,
            user_id=who.user_id,
            session_id=who.session_id,
            invocation_id=who.invocation_id,
            role=role,
            ordinal=turn.next_ordinal(role),
            content=text,
            name=name,
            at=at,
        )

    def _remember(self, invocation_id: str, turn: _Turn) -> None:
        self._turns[invocation_id] = turn
        while len(self._turns) > MAX_TRACKED_INVOCATIONS:
            self._turns.popitem(last=False)


def _user_event_time(ctx: CallbackContext) -> float | None:
    """When the user said it: the timestamp of this invocation's user event."""
    for event in reversed(ctx.session.events):
        if event.invocation_id == ctx.invocation_id and event.author == "user":
            return event.timestamp
    return None


def _done(value: T) -> asyncio.Future[T]:
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future
