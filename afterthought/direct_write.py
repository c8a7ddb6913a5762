"""Opt-in (``direct_write_on_outage``): while Redis is unreachable the agent process
writes what it had to buffer straight to the backend, in the background, with the same
message keys, idempotency keys and reconciliation as the worker, so nothing is written
twice when the queue comes back. Only for threads whose backend identity this process
has already seen (the registry lives in Redis); the rest waits in the buffer."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

from afterthought.backends.base import MemoryBackend, ignored_roles
from afterthought.batching import asks_context, missing, pack, parts
from afterthought.contract import QueuedMessage
from afterthought.keys import Keys
from afterthought.settings import Settings

log = logging.getLogger("afterthought.enqueue")

#: Thread identities remembered per process.
MAX_IDENTITIES = 10_000


class DirectWriter:
    def __init__(self, settings: Settings, backend: MemoryBackend) -> None:
        self._settings = settings
        self._backend = backend
        self._threads: OrderedDict[str, str] = OrderedDict()

    def remember(self, thread_key: str, thread_uuid: str) -> None:
        self._threads[thread_key] = thread_uuid
        self._threads.move_to_end(thread_key)
        while len(self._threads) > MAX_IDENTITIES:
            self._threads.popitem(last=False)

    def knows(self, thread_key: str) -> bool:
        return thread_key in self._threads

    async def write(self, messages: Sequence[QueuedMessage]) -> None:
        """Persist messages of one known thread; raises on failure (they stay buffered)."""
        thread_uuid = self._threads[messages[0].thread_key]
        wanted = parts(messages, self._settings.max_message_chars, Keys.of(self._settings))
        stored = await self._backend.recent_messages(
            thread_uuid=thread_uuid, limit=len(wanted) + 30
        )
        for call in pack(missing(wanted, stored, replay=False), self._settings.batch_size):
            await self._backend.add_messages(
                thread_uuid=thread_uuid,
                messages=call.messages,
                idempotency_key=call.idempotency_key,
                ignore_roles=ignored_roles(self._settings, self._backend),
                return_context=asks_context(self._settings),  # the worker's body for the key
            )
        log.warning(
            "redis down: wrote directly thread=%s messages=%d",
            messages[0].thread_key,
            len(messages),
        )
