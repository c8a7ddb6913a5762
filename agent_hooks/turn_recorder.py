"""The write half of the turn path: every message and memory change becomes one queued
message, enqueued in one Redis round trip (the worker stores it, after the thought).

W0: a message is handed over before anything that can wait or fail, and its enqueue runs
on a task of its own, so nothing that happens to the caller afterwards (a failed read, a
timeout, a cancellation) stops it: every message made is queued, buffered, or counted in
``Enqueuer.dropped``, and so is every one that could not be made."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence

from afterthought.agent_hooks.identity import Who, ZepIdentity
from afterthought.contract import MEMORY_SESSION, Kind, QueuedMessage, Role, Unmade
from afterthought.direct_write import DirectWriter
from afterthought.enqueue import Enqueuer
from afterthought.settings import Settings

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
        began: float | None = None,
    ) -> QueuedMessage | None:
        """The message to queue; None (counted dropped) when it cannot be made (an id that
        cannot name a thread)."""
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
                began=began,
                zep_user_uuid=identity.user_uuid,
                zep_graph_uuid=identity.graph_uuid,
                zep_thread_uuid=identity.thread_uuid,
            )
        except Unmade as exc:
            log.error("message refused invocation=%s reason=%s", who.invocation_id, exc)
            self.enqueuer.drop(1, why=exc.reason)
            return None

    def record(self, messages: Sequence[QueuedMessage]) -> asyncio.Task[bool]:
        """Queue messages of one thread, in order, on a task of their own: it runs to its
        end whatever becomes of the caller (which awaits it with ``settled``). The task starts
        before the caller can be resumed, so before a cancellation can reach the caller.
        Its result: False if they wait in the buffer or were dropped (counted)."""
        batch, began = list(messages), asyncio.Event()
        # In flight from now on, before the task's first step (a loop busy elsewhere runs
        # it later): a stop signal meanwhile spools them.
        token = self.enqueuer.reserve(batch)
        task = asyncio.ensure_future(self._enqueue(batch, began, token))

        def cut_before_it_began(done: asyncio.Task[bool]) -> None:
            # A task cancelled before its first step (a shutdown that cancels every task
            # in the same loop iteration) runs none of its code, its handler included.
            if done.cancelled() and not began.is_set():
                self.enqueuer.hold(batch, reserved=token)

        task.add_done_callback(cut_before_it_began)
        return task

    async def _enqueue(
        self, messages: list[QueuedMessage], began: asyncio.Event, token: int
    ) -> bool:
        began.set()
        return await self.enqueuer.enqueue(messages, reserved=token)

    def change(
        self,
        *,
        app: str,
        user_id: str,
        kind: Kind,
        content: str,
        source: str,
        identity: ZepIdentity,
        trust: str | None = None,
    ) -> QueuedMessage:
        """The message of a fact to store or a memory to forget. ``source`` names the
        change (an invocation, or the content itself), so the same change queued twice
        stays one. Raises ``Unmade`` (counted dropped) for ids that cannot name anything."""
        try:
            return QueuedMessage.build(
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
        except Unmade as exc:
            self.enqueuer.drop(1, why=exc.reason)
            raise

    async def aclose(self) -> None:
        """Send what the outage buffer still holds (for ``exit_flush_seconds``; the rest is
        spooled) and close this loop's connections."""
        await self.enqueuer.aclose()


async def settled(write: Awaitable[bool]) -> bool:
    """Wait for a write handed to the recorder; True once queued. Shielded: a cancelled
    caller leaves it running. A write cut short itself (its messages are held) is False,
    never an error for the caller."""
    (done,) = await asyncio.gather(asyncio.shield(write), return_exceptions=True)
    return done is True
