"""The write half of the turn path: every message and memory change becomes one queued
message, enqueued in one Redis round trip (the worker stores it, after the thought)."""

from __future__ import annotations

import logging

from afterthought.agent_hooks.identity import Who, ZepIdentity
from afterthought.contract import MEMORY_SESSION, InvalidIds, Kind, QueuedMessage, Role
from afterthought.direct_write import DirectWriter
from afterthought.enqueue import Enqueuer
from afterthought.settings import Settings
from afterthought.telemetry import queue_failures

log = logging.getLogger("afterthought.hooks")


class TurnRecorder:
    def __init__(self, settings: Settings, *, direct: DirectWriter | None = None) -> None:
        self.settings = settings
        self.enqueuer = Enqueuer(settings, direct=direct)

    def message(
        self,
        who: Who,
        *,
        identity: ZepIdentity,
        role: Role,
        ordinal: int,
        text: str,
        name: str | None,
        at: float | None,
    ) -> QueuedMessage | None:
        """The message to queue; None (counted) when an id cannot name a thread."""
        try:
            return QueuedMessage.build(
                app=who.app,
                user_id=who.user_id,
                session_id=who.session_id,
                invocation_id=who.invocation_id,
                role=role,
                ordinal=ordinal,
                content=text,
                name=name,
                at=at,
                zep_user_uuid=identity.user_uuid,
                zep_graph_uuid=identity.graph_uuid,
                zep_thread_uuid=identity.thread_uuid,
            )
        except InvalidIds as exc:
            queue_failures.add(1, {"outcome": "refused"})
            log.error("message refused invocation=%s reason=%s", who.invocation_id, exc)
            return None

    async def record(self, messages: list[QueuedMessage]) -> bool:
        """Queue the messages; False if they could not be queued nor buffered."""
        return await self.enqueuer.enqueue(messages)

    async def queue_change(
        self,
        *,
        app: str,
        user_id: str,
        kind: Kind,
        content: str,
        source: str,
        identity: ZepIdentity,
        trust: str | None = None,
    ) -> bool:
        """Queue a fact to store or a memory to forget. ``source`` names the change (an
        invocation, or the content itself), so the same change queued twice stays one."""
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
            zep_user_uuid=identity.user_uuid,
            zep_graph_uuid=identity.graph_uuid,
        )
        return await self.enqueuer.enqueue([message])

    async def aclose(self) -> None:
        """Send what the outage buffer still holds and close this loop's connections."""
        await self.enqueuer.drain_buffer()
        await self.enqueuer.aclose()
