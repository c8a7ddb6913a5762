"""The turn path shared by the callbacks, the plugin and ``ZepContextTool``: read one
context block per invocation within the budget (one Redis MGET when the cache is warm),
queue each message once, and never let a memory failure reach ADK (R1)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from google.adk.agents.callback_context import CallbackContext
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse

from afterthought.backends import open_backend
from afterthought.backends.base import MemoryBackend, UserRef
from afterthought.breaker import CircuitBreaker
from afterthought.context_cache import PENDING, ContextCache, now_version
from afterthought.contract import (
    MEMORY_SESSION,
    InvalidIds,
    Kind,
    QueuedMessage,
    Role,
    thread_key,
)
from afterthought.direct_write import DirectWriter
from afterthought.enqueue import Enqueuer
from afterthought.identity import Identity, IdentityRegistry
from afterthought.keys import Keys, digest
from afterthought.settings import Settings
from afterthought.telemetry import (
    context_cache_reads,
    identity_pins_ignored,
    memory_read_failures,
    queue_failures,
    retrieval_duration,
)
from agent_hooks.identity import (
    IdentityResolver,
    ZepIdentity,
    display_name,
    from_state,
    resolve,
)
from agent_hooks.injection import DEFAULT_CONTEXT_TEMPLATE, Injection, inject, render
from agent_hooks.messages import said_text

log = logging.getLogger("afterthought.hooks")
T = TypeVar("T")

#: Invocations remembered per process (for block reuse and message ordinals).
MAX_TRACKED_INVOCATIONS = 4096
#: Session-state key holding the id of the session whose turns these are. An ``AgentTool``
#: copies its caller's state into the child session, so a child sees its caller's id there.
OWNER_KEY = "afterthought:session"
#: The session whose tool step is running in this context (set after a model response
#: that calls tools, cleared at that session's next model call). A model call of another
#: session inside it is a nested run; context variables reach the tool's child runner,
#: and end with the run, so a session merely seeded with another's state is not nested.
_TOOL_STEP: ContextVar[str | None] = ContextVar("afterthought_tool_step", default=None)
#: One background refresh per cached block at a time, across processes.
REFRESH_LOCK_MS = 10_000


@dataclass(frozen=True, slots=True)
class ContextInput:
    """What a custom ``context_builder`` gets."""

    user_message: str
    """The text of the user's message that started the invocation."""
    user: UserRef | None
    """The user's backend identity, if known."""
    thread_uuid: str | None
    """The session's backend thread, if known."""
    backend: MemoryBackend
    """The configured backend (``backend.zep`` is the SDK client on Zep)."""
    callback_context: CallbackContext
    """ADK's context of this model call."""
    llm_request: LlmRequest
    """The request about to go to the model."""


ContextBuilder = Callable[[ContextInput], Awaitable[str | None]]


@dataclass(slots=True)
class _Turn:
    block: asyncio.Future[str]
    identity: ZepIdentity
    ordinals: dict[Role, int] = field(default_factory=dict)

    def next_ordinal(self, role: Role) -> int:
        n = self.ordinals.get(role, 0)
        self.ordinals[role] = n + 1
        return n


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
        self._backend = backend
        self.direct: DirectWriter | None = None
        if settings.direct_write_on_outage:
            self.direct = DirectWriter(settings, self.backend)
        self.enqueuer = Enqueuer(settings, direct=self.direct)
        self.cache = ContextCache(settings)
        self._keys = Keys(settings.key_prefix)
        # Keyed by every id of the turn: an invocation id is client-chosen in ADK's API server,
        # so two users (or sessions) may send the same one.
        self._turns: OrderedDict[Who, _Turn] = OrderedDict()
        self._refreshing: set[asyncio.Task[None]] = set()
        self.read_breaker = CircuitBreaker(
            failures=settings.read_breaker_failures, seconds=settings.read_breaker_seconds
        )

    @classmethod
    def create(cls, *, settings: Settings | None = None, **kwargs: Any) -> TurnMemory:
        """Keyword arguments that name a :class:`Settings` field override it; the rest are
        options of this class (``context_template``, ``identity``, ...)."""
        fields = {k: v for k, v in kwargs.items() if k in Settings.model_fields}
        options = {k: v for k, v in kwargs.items() if k not in fields}
        if settings is None:
            settings = Settings(**fields)
        elif fields:
            settings = Settings.model_validate({**settings.model_dump(), **fields})
        return cls(settings, **options)

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
            if _TOOL_STEP.get() == callback_context.session.id:
                _TOOL_STEP.set(None)  # its tool step is over
            turn = self._turns.get(Who.of(callback_context))
            if turn is None:
                # First model call of the invocation: queue the user's message while the
                # block is read, so the turn waits for the slower of the two, not both.
                turn, write = await self._start_turn(callback_context, llm_request)
                block, _ = await asyncio.gather(turn.block, write)
            else:  # later calls (after a tool step) reuse the block: tool steps keep memory
                block = await turn.block
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
        who = Who.of(ctx)
        identity, reads = await self.identities(ctx)
        text = said_text(ctx.user_content)
        block = asyncio.ensure_future(self._read_block(who, ctx, llm_request, reads, text))
        turn = _Turn(block=block, identity=identity)
        self._remember(who, turn)
        if not text:
            return turn, _done(True)
        message = self._message(who, turn, "user", text, ctx, at=_user_event_time(ctx))
        if message is None:
            return turn, _done(False)
        return turn, self.enqueuer.enqueue([message])

    async def _read_block(
        self,
        who: Who,
        ctx: CallbackContext,
        llm_request: LlmRequest | None,
        identity: ZepIdentity,
        query: str,
    ) -> str:
        """R2: the cached block (one MGET); stale, it is served and refreshed in the
        background; missing, it is read through within the budget."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.settings.retrieval_budget):
                redis = self.enqueuer.redis()
                found = await self.cache.read(
                    redis, app=who.app, user_id=who.user_id, session_id=who.session_id
                )
                if found.forgetting:
                    return ""  # what the backend still holds of them is being deleted
                if self.context_builder is not None and llm_request is not None:
                    return await self._build(who, ctx, llm_request, identity, query)
                cached = found.block
                if self.direct is not None and not self.direct.knows(
                    thread_key(app=who.app, user_id=who.user_id, session_id=who.session_id)
                ):
                    await self.user_of(who, identity)  # learn the thread for outage writes
                if cached is not None:
                    fresh = cached.age <= self.settings.context_fresh_seconds
                    context_cache_reads.add(1, {"result": "hit" if fresh else "stale"})
                    if not fresh:
                        self._refresh_later(who, identity, query)
                    return cached.block
                context_cache_reads.add(1, {"result": "miss"})
                block = await self._fetch(
                    who, identity, query, version=now_version(), epoch=found.epoch
                )
                return block or ""
        except Exception as exc:
            memory_read_failures.add(1)
            log.warning(
                "memory read skipped invocation=%s error=%s", who.invocation_id, type(exc).__name__
            )
            return ""
        finally:
            retrieval_duration.record(time.perf_counter() - started)

    async def _fetch(
        self, who: Who, identity: ZepIdentity, query: str, *, version: int, epoch: int
    ) -> str | None:
        """Read the block from the backend and cache it (unless the user was forgotten
        since ``epoch`` was read); None if nobody is known yet."""
        user = await self.user_of(who, identity)
        if user is None:
            return None
        if not self.read_breaker.allow():
            return None  # the backend keeps failing: the cache is all we use for now
        try:
            block = await self.backend.get_context(
                user=user,
                query=query,
                max_chars=self.settings.context_max_chars,
                timeout=self.settings.retrieval_budget,
                template_uuid=self.settings.context_template_uuid,
            )
        except Exception:
            self.read_breaker.failed()
            raise
        self.read_breaker.succeeded()
        await self.cache.write(
            self.enqueuer.redis(),
            app=who.app,
            user_id=who.user_id,
            session_id=None,
            graph_uuid=user.graph_uuid,
            block=block,
            version=version,
            epoch=epoch,
        )
        return block

    def _refresh_later(self, who: Who, identity: ZepIdentity, query: str) -> None:
        async def refresh() -> None:
            lock = self._keys.lock(f"refresh:{digest(who.app, who.user_id)}")
            redis = self.enqueuer.redis()
            if not await redis.set(lock, "1", nx=True, px=REFRESH_LOCK_MS):
                return  # another process is on it
            try:
                epoch = await self.cache.epoch(redis, app=who.app, user_id=who.user_id)
                await self._fetch(who, identity, query, version=now_version(), epoch=epoch)
            except Exception as exc:
                log.info("context refresh failed error=%s", type(exc).__name__)
            finally:
                await redis.delete(lock)

        task = asyncio.get_running_loop().create_task(refresh())
        self._refreshing.add(task)
        task.add_done_callback(self._refreshing.discard)

    async def _build(
        self,
        who: Who,
        ctx: CallbackContext,
        llm_request: LlmRequest,
        identity: ZepIdentity,
        query: str,
    ) -> str:
        assert self.context_builder is not None
        known = await self.identity_of(who, identity)
        built = await self.context_builder(
            ContextInput(
                user_message=query,
                user=known.user,
                thread_uuid=known.thread_uuid,
                backend=self.backend,
                callback_context=ctx,
                llm_request=llm_request,
            )
        )
        return built or ""

    async def identity_of(self, who: Who, identity: ZepIdentity) -> Identity:
        """Pinned parts (options, resolver, state) win; the registry fills the rest, in one
        round trip, and only when something is missing."""
        if identity.graph_uuid and identity.thread_uuid:
            user = UserRef(user_uuid=identity.user_uuid or "", graph_uuid=identity.graph_uuid)
            return Identity(user=user, thread_uuid=identity.thread_uuid)
        registry = IdentityRegistry(self.enqueuer.redis(), self.settings)
        known = await registry.lookup(app=who.app, user_id=who.user_id, session_id=who.session_id)
        if self.direct is not None and known.user and known.thread_uuid:
            thread = thread_key(app=who.app, user_id=who.user_id, session_id=who.session_id)
            self.direct.remember(thread, known.thread_uuid)
        if identity.graph_uuid:
            pinned = UserRef(user_uuid=identity.user_uuid or "", graph_uuid=identity.graph_uuid)
            return Identity(user=pinned, thread_uuid=identity.thread_uuid or known.thread_uuid)
        return Identity(user=known.user, thread_uuid=identity.thread_uuid or known.thread_uuid)

    async def user_of(self, who: Who, identity: ZepIdentity) -> UserRef | None:
        """The graph to read: pinned (options, resolver, state), else the registry's; None
        while the user is being forgotten (the backend may still hold what goes)."""
        mark = await self.enqueuer.redis().get(self._keys.forgetting(who.app, who.user_id))
        if mark == PENDING.encode():
            return None
        if identity.graph_uuid:
            return UserRef(user_uuid=identity.user_uuid or "", graph_uuid=identity.graph_uuid)
        return (await self.identity_of(who, identity)).user

    # --- after the model ----------------------------------------------------------------
    async def after_model(
        self, *, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        try:
            if llm_response.partial:  # W8: chunks are display hints; the aggregate follows
                return None
            if self._nested(callback_context):
                return None
            content = llm_response.content
            if content and any(p.function_call for p in content.parts or ()):
                _TOOL_STEP.set(callback_context.session.id)  # its tools run next
            text = said_text(content)
            if not text.strip():  # function-call-only, thought-only or empty
                return None
            who = Who.of(callback_context)
            turn = self._turns.get(who)
            if turn is None:
                identity, _ = await self.identities(callback_context)
                turn = _Turn(block=_done(""), identity=identity)
                self._remember(who, turn)
            message = self._message(who, turn, "assistant", text, callback_context, at=None)
            if message is not None:
                await self.enqueuer.enqueue([message])
        except Exception as exc:
            log.warning(
                "after_model failed invocation=%s error=%s",
                callback_context.invocation_id,
                type(exc).__name__,
            )
        return None

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
        """Queue a fact to store or a memory to forget. ``source`` names the change (an
        invocation, or the content itself), so the same change queued twice stays one."""
        pinned = identity or self.identity
        message = QueuedMessage.build(
            app=app,
            user_id=user_id,
            session_id=MEMORY_SESSION,
            invocation_id=f"{kind}:{source}",
            role="user",
            ordinal=0,
            content=content,
            kind=kind,
            trust=trust,
            zep_user_uuid=pinned.user_uuid,
            zep_graph_uuid=pinned.graph_uuid,
        )
        return await self.enqueuer.enqueue([message])

    async def current_block(self, ctx: CallbackContext, query: str) -> str:
        """The block the turn path would inject now (for the model-called context tool)."""
        _, reads = await self.identities(ctx)
        return await self._read_block(Who.of(ctx), ctx, None, reads, query)

    # --- shared -------------------------------------------------------------------------
    async def identities(self, ctx: CallbackContext) -> tuple[ZepIdentity, ZepIdentity]:
        """Whose memory the turn writes, and whose it reads: the application's pins, then
        session state's. A user or graph pinned in state is kept only if it is the one the
        registry holds for this ADK user (a client could have written another user's
        there). A thread pinned in state is written only after the worker checks it, so
        until then reads (a context builder) are not handed it."""
        pinned = await resolve(ctx, explicit=self.identity, resolver=self.resolve_identity)
        state = from_state(ctx)
        if self.settings.trust_state_identity:
            found = pinned.filled_from(state)
            return found, found
        if state.user_uuid or state.graph_uuid:
            registry = IdentityRegistry(self.enqueuer.redis(), self.settings)
            known = await registry.lookup_user(app=ctx.session.app_name, user_id=ctx.user_id)
            if (
                known is None
                or state.user_uuid not in (None, known.user_uuid)
                or state.graph_uuid not in (None, known.graph_uuid)
            ):
                identity_pins_ignored.add(1)
                log.warning(
                    "identity pin ignored invocation=%s: not this user's", ctx.invocation_id
                )
                state = replace(state, user_uuid=None, graph_uuid=None)
        writes = pinned.filled_from(state)
        return writes, pinned.filled_from(replace(state, thread_uuid=None))

    def _nested(self, ctx: CallbackContext) -> bool:
        """W8: a nested run (an ``AgentTool``'s child runner) is not the user's turn: it
        runs inside another session's tool step, in a session whose state was copied from
        that one."""
        running = _TOOL_STEP.get()
        if running not in (None, ctx.session.id) and ctx.state.get(OWNER_KEY) == running:
            return self.settings.skip_nested
        if ctx.state.get(OWNER_KEY) != ctx.session.id:
            ctx.state[OWNER_KEY] = ctx.session.id  # also fixes a marker copied by seeding
        return False

    def _message(
        self,
        who: Who,
        turn: _Turn,
        role: Role,
        text: str,
        ctx: CallbackContext,
        *,
        at: float | None,
    ) -> QueuedMessage | None:
        """The message to queue; None (counted) when an id cannot name a thread."""
        name = self.settings.assistant_name if role == "assistant" else display_name(ctx)
        pinned = turn.identity
        try:
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
                zep_user_uuid=pinned.user_uuid,
                zep_graph_uuid=pinned.graph_uuid,
                zep_thread_uuid=pinned.thread_uuid,
            )
        except InvalidIds as exc:
            queue_failures.add(1, {"outcome": "refused"})
            log.error("message refused invocation=%s reason=%s", who.invocation_id, exc)
            return None

    def _remember(self, who: Who, turn: _Turn) -> None:
        self._turns[who] = turn
        while len(self._turns) > MAX_TRACKED_INVOCATIONS:
            self._turns.popitem(last=False)

    async def aclose(self) -> None:
        """Send what the outage buffer still holds and close this loop's connections."""
        await self.enqueuer.drain_buffer()
        await self.enqueuer.aclose()
        if self._backend is not None:
            await self._backend.aclose()


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
