"""The read half of the turn path (R2): the context block for a turn, within the budget.

``query`` mode (the default) retrieves the block for the user's message itself — one
SQLite query in this process on the local backend, ``graph.get_context`` on Zep — raced
against the cached block: that is read first (one MGET) and served when the retrieval
does not finish within the budget or fails. ``cached`` mode serves the block the worker
built before the message (one Redis MGET when warm; stale, it is served and refreshed in
the background; missing, it is read through)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import redis.asyncio as aioredis
from google.adk.agents.callback_context import CallbackContext
from google.adk.models.llm_request import LlmRequest

from afterthought.agent_hooks.identity import Pins, Who, ZepIdentity
from afterthought.backends.base import BackendError, MemoryBackend, UserRef
from afterthought.breaker import CircuitBreaker
from afterthought.context_cache import PENDING, CacheRead, ContextCache, now_version
from afterthought.contract import thread_key
from afterthought.direct_write import DirectWriter
from afterthought.forget_marks import person_pending
from afterthought.identity import Identity, IdentityRegistry
from afterthought.keys import Keys, digest
from afterthought.settings import Settings
from afterthought.telemetry import (
    context_cache_reads,
    context_queries,
    identity_pins_ignored,
    memory_read_failures,
    retrieval_duration,
)

log = logging.getLogger("afterthought.hooks")

T = TypeVar("T")

#: One background refresh per cached block at a time, across processes.
REFRESH_LOCK_MS = 10_000
#: The share of the budget a query read leaves for its fallback: a read through the
#: backend when nothing is cached; with a cached block, only the margin that lets the
#: read's own deadline fire before the turn's.
READ_THROUGH_RESERVE = 0.2
RACE_RESERVE = 0.05


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


class ContextReader:
    def __init__(
        self,
        settings: Settings,
        *,
        redis: Callable[[], aioredis.Redis],
        backend: Callable[[], MemoryBackend],
        context_builder: ContextBuilder | None = None,
        direct: DirectWriter | None = None,
    ) -> None:
        self.settings = settings
        self.context_builder = context_builder
        self.cache = ContextCache(settings)
        self.read_breaker = CircuitBreaker(
            failures=settings.read_breaker_failures, seconds=settings.read_breaker_seconds
        )
        self._redis = redis
        self._backend = backend
        self._direct = direct
        self._keys = Keys.of(settings)
        self._refreshing: set[asyncio.Task[None]] = set()

    async def read(
        self,
        who: Who,
        ctx: CallbackContext,
        llm_request: LlmRequest | None,
        pins: Pins,
        query: str,
    ) -> str:
        """The block for this turn; empty when there is none, or on any failure (R1)."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.settings.retrieval_budget) as budget:
                identity = await self.checked(who, pins, budget=budget)
                found = await self.cache.read(
                    self._redis(), app=who.app, user_id=who.user_id, session_id=who.session_id
                )
                if found.forgetting:
                    return ""  # what the backend still holds of them is being deleted
                if self.context_builder is not None and llm_request is not None:
                    return await self._build(who, ctx, llm_request, identity, query, budget)
                if self._direct is not None and not self._direct.knows(
                    thread_key(app=who.app, user_id=who.user_id, session_id=who.session_id)
                ):
                    # Learn the thread for outage writes.
                    await self.user_of(who, identity, budget=budget)
                if self.settings.context_mode == "query" and query.strip():
                    queried = await self._queried(
                        who, identity, query, started, budget, cached=found.block is not None
                    )
                    if queried is not None:
                        return queried
                return await self._cached(who, identity, query, found, budget)
        except Exception as exc:
            memory_read_failures.add(1)
            log.warning(
                "memory read skipped invocation=%s error=%s", who.invocation_id, type(exc).__name__
            )
            return ""
        finally:
            retrieval_duration.record(time.perf_counter() - started)

    async def checked(
        self, who: Who, pins: Pins, *, budget: asyncio.Timeout | None = None
    ) -> ZepIdentity:
        """Whose memory the turn reads: the application's pins, then session state's. A
        user or graph pinned in state is kept only if it is the one the registry holds for
        this ADK user (a client could have written another user's there). A thread pinned
        in state is written only after the worker checks it, so until then reads (a context
        builder) are not handed it. ``budget``: the turn's (see :meth:`guarded`)."""
        state = pins.state
        if pins.trusted:
            return pins.app.filled_from(state)
        if state.user_uuid or state.graph_uuid:
            registry = IdentityRegistry(self._redis(), self.settings)
            known = await registry.lookup_user(app=who.app, user_id=who.user_id)
            known = known or await self._named(who, registry, budget)
            if (
                known is None
                or state.user_uuid not in (None, known.user_uuid)
                or state.graph_uuid not in (None, known.graph_uuid)
            ):
                identity_pins_ignored.add(1)
                log.warning(
                    "identity pin ignored invocation=%s: not this user's", who.invocation_id
                )
                state = replace(state, user_uuid=None, graph_uuid=None)
        return pins.app.filled_from(replace(state, thread_uuid=None))

    async def _cached(
        self,
        who: Who,
        identity: ZepIdentity,
        query: str,
        found: CacheRead,
        budget: asyncio.Timeout,
    ) -> str:
        cached = found.block
        if cached is not None:
            fresh = cached.age <= self.settings.context_fresh_seconds
            context_cache_reads.add(1, {"result": "hit" if fresh else "stale"})
            if not fresh:
                self._refresh_later(who, identity, query)
            return cached.block
        context_cache_reads.add(1, {"result": "miss"})
        block = await self._fetch(
            who, identity, query, version=now_version(), epoch=found.epoch, budget=budget
        )
        return block or ""

    async def _queried(
        self,
        who: Who,
        identity: ZepIdentity,
        query: str,
        started: float,
        budget: asyncio.Timeout,
        *,
        cached: bool,
    ) -> str | None:
        """The block retrieved for ``query``, or None to fall back to the cached block. It
        gets what is left of the budget minus a reserve for the fallback, so a slow
        retrieval costs the turn its budget, never more, and still leaves it a block. With
        the cached block in hand (``cached``) the fallback costs nothing: the retrieval
        races it for nearly all the budget (Zep's read takes about 200 ms of the default
        250)."""
        if self.read_breaker.retry_in():
            return None  # open: not even the lookup of whose graph it would be
        # The forgetting mark was read with the cache: only the graph is looked up here.
        user = await self._graph_of(who, identity, budget)
        if user is None:
            if cached:
                return None
            # Nobody in the registry or the backend: the cache missed, and its read-through
            # would look the same nobody up again.
            context_cache_reads.add(1, {"result": "miss"})
            return ""
        if not self.read_breaker.allow():
            return None
        spent = time.perf_counter() - started
        reserve = RACE_RESERVE if cached else READ_THROUGH_RESERVE
        left = self.settings.retrieval_budget * (1 - reserve) - spent
        if left <= 0:
            context_queries.add(1, {"result": "no_time"})
            return None
        try:
            block = await self._get_context(user, query, timeout=left, budget=budget)
        except TimeoutError:
            context_queries.add(1, {"result": "timeout"})
            return None
        except Exception as exc:
            if isinstance(exc, BackendError) and exc.kind == "not_found":
                # The backend user is gone (a forget in a deployment that shares them,
                # before this one's worker met it): what is cached is what was deleted.
                context_queries.add(1, {"result": "gone"})
                await self.cache.invalidate_user(self._redis(), app=who.app, user_id=who.user_id)
                return ""
            context_queries.add(1, {"result": "error"})
            log.info(
                "memory query failed invocation=%s error=%s", who.invocation_id, type(exc).__name__
            )
            return None
        context_queries.add(1, {"result": "ok"})
        return block

    async def _get_context(
        self, user: UserRef, query: str, *, timeout: float, budget: asyncio.Timeout | None = None
    ) -> str:
        """The block from the backend, cut at ``timeout`` or at the end of the turn's
        ``budget`` (:meth:`guarded`)."""
        backend = self._backend()
        return await self.guarded(
            lambda: backend.get_context(
                user=user,
                query=query,
                max_chars=self.settings.context_max_chars,
                timeout=timeout,
                template_uuid=self.settings.context_template_uuid,
            ),
            timeout=timeout,
            budget=budget,
        )

    async def guarded(
        self,
        call: Callable[[], Awaitable[T]],
        *,
        timeout: float,
        budget: asyncio.Timeout | None,
    ) -> T:
        """One call of the turn path to the backend (a read, a lookup of whose memory it
        is), cut at ``timeout`` or at the end of the turn's ``budget``, whichever comes
        first; its outcome told to the read breaker. Whatever does not answer by that
        deadline is a failure, however it surfaces: a TimeoutError; a cancellation by
        either deadline (when a loop stall carries the loop past both, the inner
        ``asyncio.timeout`` re-raises the cancellation, the outer one turns it into the
        TimeoutError); an answer that comes after it (a stall can pass the deadline before
        its timer runs). So a backend that hangs at any of the turn's calls opens the
        breaker, and from then on costs a turn nothing until a probe. A cancellation from
        elsewhere (the turn's) always propagates; while the call still had time it tells
        the breaker nothing. A backend that says the user is not there has answered."""
        loop = asyncio.get_running_loop()
        ends = budget.when() if budget is not None else None
        due = loop.time() + timeout if ends is None else min(loop.time() + timeout, ends)
        deadline = asyncio.timeout_at(due)
        try:
            async with deadline:
                answer = await call()
        except asyncio.CancelledError:
            expired = deadline.expired() or (budget is not None and budget.expired())
            if expired or loop.time() >= due:
                self.read_breaker.failed()
            raise
        except Exception as exc:
            if isinstance(exc, BackendError) and exc.kind == "not_found":
                self.read_breaker.succeeded()  # it answered: that user is gone
            else:
                self.read_breaker.failed()
            raise
        if loop.time() > due:
            self.read_breaker.failed()  # it answered, but past the deadline
        else:
            self.read_breaker.succeeded()
        return answer

    async def _fetch(
        self,
        who: Who,
        identity: ZepIdentity,
        query: str,
        *,
        version: int,
        epoch: int,
        budget: asyncio.Timeout | None = None,
    ) -> str | None:
        """Read the block from the backend and cache it (unless the user was forgotten
        since ``epoch`` was read); None if nobody is known yet. ``budget``: the turn's."""
        if self.read_breaker.retry_in():
            return None  # open: not even the lookups of whose block it would be
        user = await self.user_of(who, identity, budget=budget)
        if user is None:
            return None
        if not self.read_breaker.allow():
            return None  # the backend keeps failing: the cache is all we use for now
        block = await self._get_context(
            user, query, timeout=self.settings.retrieval_budget, budget=budget
        )
        await self.cache.write(
            self._redis(),
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
            redis = self._redis()
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
        budget: asyncio.Timeout,
    ) -> str:
        assert self.context_builder is not None
        known = await self.identity_of(who, identity, budget=budget)
        built = await self.context_builder(
            ContextInput(
                user_message=query,
                user=known.user,
                thread_uuid=known.thread_uuid,
                backend=self._backend(),
                callback_context=ctx,
                llm_request=llm_request,
            )
        )
        return built or ""

    async def identity_of(
        self, who: Who, identity: ZepIdentity, *, budget: asyncio.Timeout | None = None
    ) -> Identity:
        """Pinned parts (options, resolver, state) win; the registry fills the rest, in one
        round trip, and only when something is missing. ``budget``: the turn's, if any."""
        if identity.graph_uuid and identity.thread_uuid:
            user = UserRef(user_uuid=identity.user_uuid or "", graph_uuid=identity.graph_uuid)
            return Identity(user=user, thread_uuid=identity.thread_uuid)
        registry = IdentityRegistry(self._redis(), self.settings)
        known = await registry.lookup(app=who.app, user_id=who.user_id, session_id=who.session_id)
        if self._direct is not None and known.user and known.thread_uuid:
            thread = thread_key(app=who.app, user_id=who.user_id, session_id=who.session_id)
            self._direct.remember(thread, known.thread_uuid)
        if identity.graph_uuid:
            pinned = UserRef(user_uuid=identity.user_uuid or "", graph_uuid=identity.graph_uuid)
            return Identity(user=pinned, thread_uuid=identity.thread_uuid or known.thread_uuid)
        named = known.user or await self._named(who, registry, budget)
        return Identity(user=named, thread_uuid=identity.thread_uuid or known.thread_uuid)

    async def _named(
        self, who: Who, registry: IdentityRegistry, budget: asyncio.Timeout | None
    ) -> UserRef | None:
        """The user the registry has no entry for (a newcomer, or one back after their
        entry expired) as the backend names them: their memory is there before a worker
        provisions them again (a newcomer's turn pays one backend lookup for it). A call
        to the backend like a read (:meth:`guarded`): while the breaker is open it is not
        made, half-open it is the probe, and a lookup the budget cuts is a failure."""
        zep_user_id = await registry.named_id(app=who.app, user_id=who.user_id)
        if zep_user_id is None or not self.read_breaker.allow():
            return None
        if await person_pending(self._redis(), self.settings, app=who.app, user_id=who.user_id):
            return None  # the backend still holds what their forget deletes
        backend = self._backend()
        try:
            return await self.guarded(
                lambda: backend.find_user(zep_user_id=zep_user_id),
                timeout=self.settings.backend_timeout,
                budget=budget,
            )
        except Exception as exc:  # a lookup that fails is a turn with what is cached
            log.info("backend user lookup failed error=%s", type(exc).__name__)
            return None

    async def user_of(
        self, who: Who, identity: ZepIdentity, *, budget: asyncio.Timeout | None = None
    ) -> UserRef | None:
        """The graph to read: pinned (options, resolver, state), else the registry's; None
        while the user is being forgotten (the backend may still hold what goes).
        ``budget``: the turn's, if any."""
        mark = await self._redis().get(self._keys.forgetting(who.app, who.user_id))
        if mark == PENDING.encode():
            return None
        return await self._graph_of(who, identity, budget)

    async def _graph_of(
        self, who: Who, identity: ZepIdentity, budget: asyncio.Timeout | None
    ) -> UserRef | None:
        if identity.graph_uuid:
            return UserRef(user_uuid=identity.user_uuid or "", graph_uuid=identity.graph_uuid)
        return (await self.identity_of(who, identity, budget=budget)).user
