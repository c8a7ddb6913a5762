"""``ZepMemoryService``: ADK's memory-service interface over the same queue and backend.
Adding a session queues its messages (keyed like the callbacks key them), so re-adding a
session already persisted turn by turn adds nothing."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from google.adk.events.event import Event
from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions.session import Session
from google.genai import types
from typing_extensions import override

from afterthought.backend import MemoryBackend, open_backend
from afterthought.enqueue import Enqueuer
from afterthought.identity import IdentityRegistry
from afterthought.settings import Settings
from agent_hooks.messages import messages_from_events

log = logging.getLogger("afterthought.hooks")


class ZepMemoryService(BaseMemoryService):
    def __init__(
        self,
        *,
        settings: Settings | None = None,
        backend: MemoryBackend | None = None,
        **overrides: Any,
    ) -> None:
        self.settings = settings or Settings(**overrides)
        self.enqueuer = Enqueuer(self.settings)
        self._backend = backend

    @property
    def backend(self) -> MemoryBackend:
        if self._backend is None:
            self._backend = open_backend(self.settings)
        return self._backend

    @override
    async def add_session_to_memory(self, session: Session) -> None:
        await self._queue(session.app_name, session.user_id, session.id, session.events)

    @override
    async def add_events_to_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        events: Sequence[Event],
        session_id: str | None = None,
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        if session_id is None:
            raise ValueError("add_events_to_memory needs the session_id the events belong to")
        await self._queue(app_name, user_id, session_id, events)

    async def _queue(
        self, app: str, user_id: str, session_id: str, events: Sequence[Event]
    ) -> None:
        messages = messages_from_events(
            events,
            app=app,
            user_id=user_id,
            session_id=session_id,
            assistant_name=self.settings.assistant_name,
        )
        for start in range(0, len(messages), 100):  # a few round trips, not one per message
            await self.enqueuer.enqueue(messages[start : start + 100])
        log.info("session queued for memory messages=%d", len(messages))

    @override
    async def search_memory(
        self, *, app_name: str, user_id: str, query: str
    ) -> SearchMemoryResponse:
        """The user's context block for ``query``, as one entry (empty on any failure)."""
        try:
            registry = IdentityRegistry(self.enqueuer.redis(), self.settings)
            user = await registry.lookup_user(app=app_name, user_id=user_id)
            if user is None:
                return SearchMemoryResponse()
            block = await self.backend.get_context(
                user=user,
                query=query,
                max_chars=self.settings.context_max_chars,
                timeout=self.settings.retrieval_budget,
            )
        except Exception as exc:
            log.warning("memory search failed error=%s", type(exc).__name__)
            return SearchMemoryResponse()
        if not block:
            return SearchMemoryResponse()
        entry = MemoryEntry(content=types.Content(role="user", parts=[types.Part(text=block)]))
        return SearchMemoryResponse(memories=[entry.model_copy(update={"author": "memory"})])
