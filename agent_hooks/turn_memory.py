"""The turn path shared by the callbacks, the plugin and ``ZepContextTool``: one context
block per invocation (``ContextReader``), each message queued once (``TurnRecorder``), and
never a memory failure reaching ADK (R1)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.adk.agents.callback_context import CallbackContext
from google.adk.events.event import Event
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse

from afterthought.agent_hooks.context_reader import ContextBuilder, ContextInput, ContextReader
from afterthought.agent_hooks.identity import (
    UNRESOLVED,
    IdentityResolver,
    Pins,
    Who,
    ZepIdentity,
    display_name,
    pins_of,
)
from afterthought.agent_hooks.injection import DEFAULT_CONTEXT_TEMPLATE, Injection, inject, render
from afterthought.agent_hooks.messages import said_text, stamp
from afterthought.agent_hooks.turn_recorder import TurnRecorder, settled
from afterthought.backends import open_backend
from afterthought.backends.base import BackendError, MemoryBackend, UserRef
from afterthought.contract import Kind, Role
from afterthought.direct_write import DirectWriter
from afterthought.enqueue import Enqueuer
from afterthought.identity import Identity
from afterthought.settings import Settings
from afterthought.shared_store import StoreWatch

__all__ = ["ContextBuilder", "ContextInput", "TurnMemory", "Who"]

log = logging.getLogger("afterthought.hooks")
T = TypeVar("T")

#: Invocations remembered per process (for block reuse and message ordinals).
MAX_TRACKED_INVOCATIONS = 4096
#: An agent compares stores (and looks for a worker's heartbeat) again this often: with an
#: announcement counting ``ANNOUNCED_SECONDS`` (30 s), a killed worker is told within a minute.
STORE_RECHECK_SECONDS = 30.0
#: Session-state key holding the id of the session whose turns these are. An ``AgentTool``
#: copies its caller's state into the child session, so a child sees its caller's id there.
OWNER_KEY = "afterthought:session"
#: The session whose tool step is running in this context (set after a model response
#: that calls tools, cleared at that session's next model call). A model call of another
#: session inside it is a nested run; context variables reach the tool's child runner,
#: and end with the run, so a session merely seeded with another's state is not nested.
_TOOL_STEP: ContextVar[str | None] = ContextVar("afterthought_tool_step", default=None)


@dataclass(slots=True)
class _Turn:
    block: asyncio.Future[str]
    began: float | None
    """When it began (seconds): before its block was read, so the earliest moment it could
    have seen the user's memory. Every reply of it is said then as far as a forget is
    concerned: one forgotten meanwhile refuses what the model answers from that memory."""
    identity: ZepIdentity | None = None
    """Whose memory its messages go to; None until known (the application's resolver
    failed, or has not answered yet): a message made meanwhile is dropped, counted."""
    ordinals: dict[Role, int] = field(default_factory=dict)
    speakers: set[str] = field(default_factory=set)
    """Agents that made a model call in it: their events are replies."""

    def next_ordinal(self, role: Role) -> int:
        n = self.ordinals.get(role, 0)
        self.ordinals[role] = n + 1
        return n


class TurnMemory:
    def __init__(
        self,
        settings: Settings,
        *,
        context_template: str = DEFAULT_CONTEXT_TEMPLATE,
        context_builder: ContextBuilder | None = None,
        injection: Injection = "system_instruction",
        identity: ZepIdentity | None = None,
        resolve_identity: IdentityResolver | None = None,
        backend: MemoryBackend | None = None,
    ) -> None:
        if "{context}" not in context_template:
            raise ValueError("context_template must contain a literal {context}")
        self.settings = settings
        self.context_template = context_template
        self.context_builder = context_builder
        self.injection: Injection = injection
        self.identity = identity or ZepIdentity()
        self.resolve_identity = resolve_identity
        # Opened now, as the callbacks are made, not in the first turn: opening Zep's imports
        # its SDK, which blocks the loop for longer than a read budget could cut short.
        self.backend: MemoryBackend = backend or open_backend(settings)
        self.direct: DirectWriter | None = None
        if settings.direct_write_on_outage:
            self.direct = DirectWriter(settings, self.backend)
        self.recorder = TurnRecorder(settings, direct=self.direct)
        self.reader = ContextReader(
            settings,
            redis=lambda: self.recorder.enqueuer.redis(),
            backend=lambda: self.backend,
            context_builder=context_builder,
            direct=self.direct,
        )
        # Keyed by every id of the turn: an invocation id is client-chosen in ADK's API server,
        # so two users (or sessions) may send the same one.
        self._turns: OrderedDict[Who, _Turn] = OrderedDict()
        self._store_check: asyncio.Task[None] | None = None
        self._store_watch = StoreWatch()
        self._store_due: float | None = 0.0
        """When the store check runs next (``time.monotonic``); None: one runs."""

    @classmethod
    def create(cls, *, settings: Settings | None = None, **kwargs: Any) -> TurnMemory:
        """Keyword arguments that name a :class:`Settings` field override it; the rest are
        options of this class (``context_template``, ``identity``, ...). Any other keyword
        is refused as :class:`Settings` refuses one: a one-line ``SettingsError`` that does
        not name it (it may be a key pasted where a name goes). ``backend`` is both: a
        name (``"zep"``, ``"local"``) is the setting, an object the backend to use."""
        options = {
            k: v
            for k, v in kwargs.items()
            if k in _OPTIONS and not (k in Settings.model_fields and isinstance(v, str))
        }
        fields = {k: v for k, v in kwargs.items() if k not in options}
        if settings is None:
            settings = Settings(**fields)
        elif fields:
            settings = Settings(**{**settings.model_dump(), **fields})
        return cls(settings, **options)

    @property
    def enqueuer(self) -> Enqueuer:
        """The recorder's enqueuer, whose Redis clients the reader shares (replaceable,
        e.g. by one that observes every attempt)."""
        return self.recorder.enqueuer

    @enqueuer.setter
    def enqueuer(self, enqueuer: Enqueuer) -> None:
        self.recorder.enqueuer = enqueuer

    # --- before the model ---------------------------------------------------------------
    async def before_model(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        try:
            if self.nested(callback_context):
                return None
            if _TOOL_STEP.get() == callback_context.session.id:
                _TOOL_STEP.set(None)  # its tool step is over
            turn = self._turns.get(Who.of(callback_context))
            if turn is None:
                # First model call of the invocation: queue the user's message while the
                # block is read, so the turn waits for the slower of the two, not both.
                turn, write = await self._start_turn(callback_context, llm_request)
                # Shielded: however the turn ends, the write runs on. A read that fails
                # in any way, even cancelled, is a turn without memory (R1).
                found, _, _ = await asyncio.gather(
                    turn.block,
                    asyncio.shield(write),
                    self.check_store_once(),
                    return_exceptions=True,
                )
            else:  # later calls (after a tool step) reuse the block: tool steps keep memory
                turn.speakers.add(callback_context.agent_name)
                (found,) = await asyncio.gather(turn.block, return_exceptions=True)
            block = found if isinstance(found, str) else ""
            if block:
                inject(llm_request, render(block, self.context_template), self.injection)
        except Exception as exc:  # R1: memory never breaks the turn
            log.warning(
                "before_model failed invocation=%s error=%s",
                callback_context.invocation_id,
                type(exc).__name__,
            )
        return None

    async def _start_turn(
        self, ctx: CallbackContext, llm_request: LlmRequest
    ) -> tuple[_Turn, Awaitable[bool]]:
        """W0: the user's message is handed to the recorder first; only then is the block
        read (the registry check of session state's pins is part of the read)."""
        who = Who.of(ctx)
        text = said_text(ctx.user_content)
        # Remembered at once: a later model call of the invocation queues nothing again.
        turn = self._remember(who, _Turn(block=_done(""), began=time.time()))
        turn.speakers.add(ctx.agent_name)
        try:
            pins = await self._pins(ctx)
            turn.identity = pins.writes
        finally:  # queued, or (the resolver failed: whose is it?) counted dropped
            write = self._record(who, turn, "user", text, ctx, at=_user_event_time(ctx))
        turn.block = asyncio.ensure_future(self.reader.read(who, ctx, llm_request, pins, text))
        return turn, write

    async def identity_of(self, who: Who, identity: ZepIdentity) -> Identity:
        return await self.reader.identity_of(who, identity)

    async def user_of(self, who: Who, identity: ZepIdentity) -> UserRef | None:
        return await self.reader.user_of(who, identity)

    # --- after the model ---------------------------------------------------------------
    async def after_model(
        self, *, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        """Queue the reply (final text only), stamped with its ordinal (``stamp``)."""
        try:
            if llm_response.partial:  # W8: chunks are display hints; the aggregate follows
                return None
            if self.nested(callback_context):
                return None
            self.mark_tool_step(callback_context, llm_response)
            await self._reply(callback_context, llm_response)
        except Exception as exc:
            log.warning(
                "after_model failed invocation=%s error=%s",
                callback_context.invocation_id,
                type(exc).__name__,
            )
        return None

    def mark_tool_step(self, ctx: CallbackContext, llm_response: LlmResponse) -> None:
        """A response that calls tools: its session's tools run next (see ``_nested``)."""
        content = llm_response.content
        if content and any(p.function_call for p in content.parts or ()):
            _TOOL_STEP.set(ctx.session.id)

    async def after_event(self, ctx: CallbackContext, event: Event) -> None:
        """Queue what an agent of a model call said, as the user is shown it (after every
        rewrite of the response), stamped with its ordinal: ``MemoryPlugin``'s reply."""
        try:
            if event.partial or self.nested(ctx):
                return
            turn = self._turns.get(Who.of(ctx))
            if turn is None or event.author not in turn.speakers:
                return  # the user's, or an agent's that made no model call: not a reply
            await self._reply(ctx, event)
        except Exception as exc:
            log.warning(
                "after_event failed invocation=%s error=%s",
                ctx.invocation_id,
                type(exc).__name__,
            )

    async def _reply(self, ctx: CallbackContext, response: LlmResponse) -> None:
        text = said_text(response.content)
        if not text.strip():  # function-call-only, thought-only or empty
            return
        who = Who.of(ctx)
        # A turn whose model call was not seen here (or is long forgotten) began by its
        # user's event at the latest: memory read elsewhere in it was read after that.
        turn = self._turns.get(who) or self._remember(
            who, _Turn(block=_done(""), began=_user_event_time(ctx))
        )
        try:
            if turn.identity is None:  # no model call of it seen, or its resolver failed
                turn.identity = (await self._pins(ctx)).writes
        finally:  # queued, or counted dropped
            write = self._record(
                who, turn, "assistant", text, ctx, at=None, began=turn.began, mark=response
            )
        await self.settle(write)

    # --- memory changes (tools, memory service) --------------------------------------------
    async def queue_change(
        self,
        *,
        app: str,
        user_id: str,
        kind: Kind,
        content: str,
        source: str,
        trust: str | None = None,
        identity: ZepIdentity | None = None,
    ) -> bool:
        """Queue a fact to store or a memory to forget (``TurnRecorder.change``), in the
        user's own graph (:attr:`ZepIdentity.for_changes`); True once queued."""
        message = self.recorder.change(
            app=app,
            user_id=user_id,
            kind=kind,
            content=content,
            source=source,
            trust=trust,
            identity=(identity or self.identity).for_changes,
        )
        return await self.settle(self.recorder.record([message]))

    async def current_block(self, ctx: CallbackContext, query: str) -> str:
        """The block the turn path would inject now (for the model-called context tool);
        empty on any failure, the application's resolver's too (R1)."""
        try:
            pins = await self._pins(ctx)
        except Exception as exc:
            log.warning("memory read skipped error=%s", type(exc).__name__)
            return ""
        return await self.reader.read(Who.of(ctx), ctx, None, pins, query)

    async def reads(self, ctx: CallbackContext) -> ZepIdentity:
        """Whose memory the turn reads (session state's pins checked, see
        ``ContextReader.checked``)."""
        return await self.reader.checked(Who.of(ctx), await self._pins(ctx))

    # --- shared -------------------------------------------------------------------------
    async def _pins(self, ctx: CallbackContext) -> Pins:
        """The turn's pins: the application's (options, then the resolver) and session
        state's. No lookup: only the application's resolver may wait or fail here."""
        return await pins_of(
            ctx,
            explicit=self.identity,
            resolver=self.resolve_identity,
            trust_state=self.settings.trust_state_identity,
        )

    def nested(self, ctx: CallbackContext) -> bool:
        """W8: a nested run (an ``AgentTool``'s child runner) is not the user's turn: it
        runs inside another session's tool step, in a session whose state was copied from
        that one."""
        running = _TOOL_STEP.get()
        if running not in (None, ctx.session.id) and ctx.state.get(OWNER_KEY) == running:
            return self.settings.skip_nested
        if ctx.state.get(OWNER_KEY) != ctx.session.id:
            ctx.state[OWNER_KEY] = ctx.session.id  # also fixes a marker copied by seeding
        return False

    def _record(
        self,
        who: Who,
        turn: _Turn,
        role: Role,
        text: str,
        ctx: CallbackContext,
        *,
        at: float | None,
        began: float | None = None,
        mark: LlmResponse | None = None,
    ) -> Awaitable[bool]:
        """Hand what was said to the recorder (its enqueue under way when this returns);
        True once queued. A message that cannot be made is counted dropped. ``mark``, the
        reply said, is stamped with the message's ordinal."""
        if not text:
            return _done(True)
        if turn.identity is None:
            self.enqueuer.drop(1, why=UNRESOLVED)
            return _done(False)
        name = self.settings.assistant_name if role == "assistant" else display_name(ctx)
        ordinal = turn.next_ordinal(role)
        if mark is not None:
            stamp(mark, ordinal)
        message = self.recorder.message(
            who,
            identity=turn.identity,
            role=role,
            ordinal=ordinal,
            text=text,
            name=name,
            at=at,
            began=began,
        )
        return _done(False) if message is None else self.recorder.record([message])

    def _remember(self, who: Who, turn: _Turn) -> _Turn:
        self._turns[who] = turn
        while len(self._turns) > MAX_TRACKED_INVOCATIONS:
            self._turns.popitem(last=False)
        return turn

    async def settle(self, write: Awaitable[bool]) -> bool:
        """Wait for a write handed to the recorder (``settled``: True once queued), the
        store check beside it: a process that only records (an after-model callback alone,
        ADK's ``add_session_to_memory``) is the one whose messages pile up with no worker,
        and must warn as one that reads does."""
        queued, _ = await asyncio.gather(settled(write), self.check_store_once())
        return queued

    async def check_store_once(self) -> None:
        """At a turn, a write or a search, at most every ``STORE_RECHECK_SECONDS``: warn when no
        worker runs (messages queue, nothing stores them) or the workers write another store
        (another local file, Zep while this process has no key, another Zep project); see
        :class:`StoreWatch`. Awaited within the read budget, beside the read, so that a
        process that lives for one turn still warns; past the budget it goes on unawaited."""
        due = self._store_due
        if due is None or time.monotonic() < due:
            return
        self._store_due = None  # one check at a time; it says when the next one is due
        self._store_check = asyncio.ensure_future(self._check_store())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.shield(self._store_check), self.settings.retrieval_budget
            )

    async def _check_store(self) -> None:
        try:
            await self._store_watch.check(
                self.recorder.enqueuer.redis(), self.settings, self.backend
            )
        except BackendError as exc:
            if exc.code == "schema_upgrade_pending":  # reads fall back to the cache until then
                log.warning("local store awaits a schema upgrade: start a worker on it")
        except Exception as exc:  # a check only: never a reason to fail anything
            log.debug("store check failed error=%s", type(exc).__name__)
        finally:
            self._store_due = time.monotonic() + STORE_RECHECK_SECONDS

    async def aclose(self) -> None:
        """Send what the outage buffer still holds and close this loop's connections."""
        if self._store_check is not None:
            self._store_check.cancel()
        await self.recorder.aclose()
        await self.backend.aclose()


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


#: The keyword options of :class:`TurnMemory` itself, told apart from settings in ``create``.
_OPTIONS = frozenset(inspect.signature(TurnMemory.__init__).parameters) - {"self", "settings"}
