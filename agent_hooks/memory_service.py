"""``ZepMemoryService``: ADK's memory-service interface (2.13) over the same queue, cache
and backend as the callbacks. Every write is queued; re-adding a session already
persisted turn by turn adds nothing; searches never raise."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from google.adk.events.event import Event
from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions.session import Session
from google.genai import types
from typing_extensions import override

from afterthought.agent_hooks.identity import ZepIdentity, replay_pins
from afterthought.agent_hooks.messages import messages_from_events, said_text
from afterthought.agent_hooks.turn_memory import TurnMemory, Who
from afterthought.backends.base import synthesizes
from afterthought.contract import QueuedMessage, Unmade, checksum
from afterthought.search import SearchHit, SearchRequest
from afterthought.settings import Settings
from afterthought.validation import detect

log = logging.getLogger("afterthought.hooks")

#: Why a memory entry is refused (and counted dropped) that holds no text to store.
NO_TEXT = "no text"


class ZepMemoryService(BaseMemoryService):
    """Takes the same keyword arguments as ``create_callbacks`` (or ``memory=`` to share)."""

    def __init__(self, *, memory: TurnMemory | None = None, limit: int = 10, **kwargs: Any):
        self.memory = memory or TurnMemory.create(**kwargs)
        self.limit = limit

    @property
    def settings(self) -> Settings:
        return self.memory.settings

    @override
    async def add_session_to_memory(self, session: Session) -> None:
        await self._queue(session)

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
        await self._queue(
            Session(id=session_id, app_name=app_name, user_id=user_id, events=list(events))
        )

    async def _queue(self, session: Session) -> None:
        """The events as replays, pinned as the session's turns were (the application's
        options and resolver, each invocation's as the turn path asked it, and the session
        state's pins), so that they are checked against the thread the turns went to. An
        event whose message cannot be made is counted dropped with its reason; the others
        are queued."""
        identity: ZepIdentity | dict[str, ZepIdentity] = {}  # none resolved yet
        refused: Counter[str] = Counter()
        try:
            identity = await replay_pins(
                session,
                explicit=self.memory.identity,
                resolver=self.memory.resolve_identity,
                trust_state=self.settings.trust_state_identity,
            )
        finally:  # queued, or (cancelled in the resolver: whose are they?) counted dropped
            messages = messages_from_events(
                session.events,
                app=session.app_name,
                user_id=session.user_id,
                session_id=session.id,
                assistant_name=self.settings.assistant_name,
                identity=identity,
                refused=refused,
            )
            for reason, count in refused.items():
                self.memory.enqueuer.drop(count, why=reason)
            write = self.memory.recorder.record(messages)
        await self.memory.settle(write)
        log.info("session queued for memory messages=%d refused=%d", len(messages), refused.total())

    @override
    async def add_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        memories: Sequence[MemoryEntry],
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        """Queued fact writes (trust ``app``); the same text added twice is stored once.
        The worker validates each like every other write and quarantines what it refuses
        (``afterthought quarantine list``). Every entry is made into its message first, then
        all are handed to the recorder at once, so a cancelled caller loses none. An entry
        that cannot be made (no text; ids that name nothing) is counted dropped, the others
        are queued all the same, and the caller gets a ValueError naming each refused one."""
        made: list[QueuedMessage] = []
        refused: list[str] = []
        for index, entry in enumerate(memories):
            text = said_text(entry.content).strip()
            if not text:
                self.memory.enqueuer.drop(1, why=NO_TEXT)
                refused.append(f"memories[{index}]: {NO_TEXT}")
                continue
            try:
                made.append(
                    self.memory.recorder.change(
                        app=app_name,
                        user_id=user_id,
                        kind="fact",
                        content=text,
                        source=checksum(text),
                        identity=self.memory.identity,
                        trust="app",
                    )
                )
            except Unmade as exc:
                refused.append(f"memories[{index}]: {exc}")
        await self.memory.settle(self.memory.recorder.record(made))
        if refused:
            raise ValueError("; ".join(refused))

    @override
    async def delete_memory(
        self, *, app_name: str, user_id: str, memory_id: str | None = None
    ) -> None:
        """A queued forget of one memory (an id ``search_memory`` returned)."""
        if not memory_id:
            raise ValueError("name the memory_id to delete (from search_memory results)")
        await self.memory.queue_change(
            app=app_name, user_id=user_id, kind="forget", content=memory_id, source=memory_id
        )

    @override
    async def search_memory(
        self, *, app_name: str, user_id: str, query: str
    ) -> SearchMemoryResponse:
        """What memory holds for ``query``, most relevant first: facts about the user that
        share its words, and past statements about it (the user's own on the local store;
        on Zep, episodes, which hold either speaker's turns). Nothing for an empty query,
        never "everything".
        Each entry has its id (for ``delete_memory``), the time it holds from (a fact's
        validity, a statement's saying), and in ``custom_metadata`` its kind (``fact`` or
        ``statement``), predicate (facts, when the backend names one) and score: higher is
        more relevant. The local store's are 0..1 (a fact: the share of the query's words
        it holds; a statement: BM25 as ``b/(1+b)``, or its cosine similarity with an
        embedder), and facts and statements are ordered together by them; Zep's are its
        rankers' (scale undocumented; with its default ranker, reciprocal rank fusion,
        small positive numbers). A backend that gives no score leaves it None: then facts
        come first, each kind in the backend's order. Empty on any failure."""

        def scored(hits: Sequence[tuple[SearchHit, str]]) -> list[tuple[SearchHit, str]]:
            """Without hits scored 0 or less; highest score first when every hit has one
            (stable: facts first among equals), else as given."""
            kept = [(hit, kind) for hit, kind in hits if hit.score is None or hit.score > 0]
            if any(hit.score is None for hit, _ in kept):
                return kept
            return sorted(kept, key=lambda entry: -(entry[0].score or 0.0))

        asked = " ".join(query.split())[:400]
        if not asked:
            return SearchMemoryResponse()
        await self.memory.check_store_once()  # a search may be all a process does
        reader, backend = self.memory.reader, self.memory.backend
        try:
            user = await self.memory.user_of(Who(app_name, user_id, "", ""), self.memory.identity)
            # The turn path's read breaker: ``PreloadMemoryTool`` searches on every turn,
            # which a backend that keeps failing would cost its timeout each time.
            if user is None or not reader.read_breaker.allow():
                return SearchMemoryResponse()
            timeout = self.settings.tool_timeout
            facts, statements = await asyncio.gather(
                *(
                    reader.guarded(
                        functools.partial(
                            backend.search,
                            graph_uuid=user.graph_uuid,
                            request=SearchRequest(query=asked, scope=scope, limit=self.limit),
                            timeout=timeout,
                        ),
                        timeout=timeout,
                        budget=None,
                    )
                    for scope in ("edges", "episodes")
                )
            )
        except Exception as exc:
            log.warning("memory search failed error=%s", type(exc).__name__)
            return SearchMemoryResponse()
        # A hit scored 0 is no answer to the query. Statements come as said, and the
        # instruction-like never reach a model; so do the facts a backend draws itself from
        # each sentence said (Zep's, in ``zep`` mode): ours were validated when made.
        if not synthesizes(self.settings, self.memory.backend):
            facts = [hit for hit in facts if detect(hit.text) is None]
        said = [hit for hit in statements if detect(hit.text) is None]
        found = scored([*((hit, "fact") for hit in facts), *((hit, "statement") for hit in said)])
        return SearchMemoryResponse(
            memories=[self._entry(*each) for each in once(found)[: self.limit]]
        )

    def _entry(self, hit: SearchHit, kind: str) -> MemoryEntry:
        """An entry as ADK's memory tools render it (``PreloadMemoryTool``: ``Time: …``
        then ``author: text``; ``load_memory``: the entries as they are): a statement's
        author is who said it, as ADK names the authors of events (``user``, the
        assistant); a fact's is ``fact``."""
        if kind == "fact":
            author = "fact"
        elif hit.said_by == "assistant":
            author = self.settings.assistant_name
        else:
            author = hit.said_by or "memory"
        # On one line: ``PreloadMemoryTool`` joins the entries' lines, so a line that a
        # statement's text began would read as an entry of its own (``fact: …``, ``Time: …``).
        text = " ".join(hit.text.split())
        return MemoryEntry(
            id=hit.uuid,
            author=author,
            timestamp=hit.created_at,
            content=types.Content(role="user", parts=[types.Part(text=text)]),
            custom_metadata={"kind": kind, "score": hit.score, **hit.extra},
        )


#: What makes two texts one: their words, whatever the punctuation, case and spacing.
_WORDS = re.compile(r"\w+")


def once(found: Sequence[tuple[SearchHit, str]]) -> list[tuple[SearchHit, str]]:
    """Each text once, where it ranks best: one statement can come back as a fact too (Zep
    extracts edges that may repeat a sentence as said), twice (a message Zep stored again
    after a lost reply), or said again in another session with other punctuation, case or
    spacing: texts of the same words, in order, are one."""
    seen: set[tuple[str, ...]] = set()
    kept = []
    for hit, kind in found:
        said = tuple(_WORDS.findall(unicodedata.normalize("NFKC", hit.text).casefold()))
        said = said or (hit.text,)
        if said not in seen:
            seen.add(said)
            kept.append((hit, kind))
    return kept
