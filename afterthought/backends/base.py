"""The memory-backend port: the few operations both processes need, shaped after Zep's,
and what each backend can do (:class:`Capabilities`), so callers never branch on a name."""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from afterthought.facts import Fact, StoredFact
from afterthought.search import SearchHit, SearchRequest

if TYPE_CHECKING:
    from afterthought.settings import Settings

#: Metadata key that carries our message key into the backend (reconciliation reads it).
MESSAGE_KEY_FIELD = "afterthought_key"
#: Metadata key that marks a late copy of a message, where the backend cannot delete one
#: message (Zep v4): the uuid of the copy that stays. Reads of history skip what carries it.
COPY_OF_FIELD = "afterthought_copy_of"
#: Metadata key that carries the session a message was said in, as a digest of the
#: deployment and the session's ids (``Keys.session_tag``, never a raw id): the user's map
#: of sessions to threads is rebuilt from it where the backend does not replay a thread's
#: creation (``Capabilities.replays_thread_creates``).
SESSION_FIELD = "afterthought_session"

#: What a write must pass as it leaves this process: an adapter that sends over the network
#: calls it once the request is built, right before its first byte goes out (Zep: an httpx
#: request hook), and a raise there sends nothing. The worker sets it, around each call of a
#: batch, to its lease's check: a worker stopped (SIGSTOP, a long GC pause) after its own
#: check and before that point finds its lease run out on its clock and sends nothing. Zep
#: has no conditional write to carry the lease further: a stop after this point (the
#: request written later, or held in the kernel or a load balancer) is not caught here, and
#: is left to the late-copy repair.
LAST_CHECK: ContextVar[Callable[[], object] | None] = ContextVar(
    "afterthought_last_check", default=None
)

ErrorKind = Literal[
    "timeout",
    "unavailable",
    "rate_limited",
    "unauthorized",
    "not_found",
    "conflict",
    "too_large",
    "bad_request",
    "invalid_response",
]


class BackendError(Exception):
    """A backend failure, classified. Its text holds status and error code, never content.
    What the worker does about each kind is decided in one table (``worker.retry``)."""

    def __init__(
        self,
        kind: ErrorKind,
        *,
        status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(f"{kind} (status={status}, code={code})")
        self.kind: ErrorKind = kind
        self.status = status
        self.code = code
        self.retry_after = retry_after
        self.detail = detail
        """What an operator can act on, where the kind says too little: the file or host
        that failed and why (never content, never a key)."""


@dataclass(frozen=True, slots=True)
class UserRef:
    """A backend user and the graph that holds its memory."""

    user_uuid: str
    graph_uuid: str


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    role: str | None
    content: str
    reference_time: str
    name: str | None = None
    metadata: Mapping[str, str | int] = field(default_factory=dict)
    saying: int = 1
    """Not sent: which saying of its role and text in its session (``QueuedMessage.saying``)."""


@dataclass(frozen=True, slots=True)
class StoredMessage:
    uuid: str
    role: str
    content: str
    metadata: Mapping[str, object]
    processed: bool | None = None
    """Whether the backend has taken the message into its graph (None: it does not say)."""

    @property
    def key(self) -> str | None:
        value = self.metadata.get(MESSAGE_KEY_FIELD)
        return value if isinstance(value, str) else None

    @property
    def is_copy(self) -> bool:
        """A late copy of another message, marked as such (:data:`COPY_OF_FIELD`)."""
        return COPY_OF_FIELD in self.metadata


@dataclass(frozen=True, slots=True)
class LateCopy:
    """A later copy of a stored message (the same key and text again in its thread), which
    a call committed late stored."""

    uuid: str
    kept: str
    """The uuid of the first copy, which stays."""
    key: str
    content: str
    processed: bool | None
    """As :attr:`StoredMessage.processed` of the copy."""


@dataclass(frozen=True, slots=True)
class HistoryMessage:
    """A stored message as synthesis reads it."""

    key: str
    role: str
    content: str
    reference_time: str


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend does on its own; callers consult these, never ``name``."""

    #: It extracts facts from ingested messages itself (Zep's graph); else our synthesis must.
    extracts_facts: bool
    #: It honours ``ignore_roles`` (stores those messages but keeps them out of extraction).
    ignores_roles: bool
    #: Deletes are accepted and done later (202 + task); forgetting must wait for them.
    async_deletes: bool
    #: Ingestion is asynchronous: a context read right after a write may not reflect it.
    ingests_async: bool
    #: ``create_thread`` with one idempotency key gives the same thread for good (the
    #: local store), so a session's thread is found again without the registry's map;
    #: else (Zep v4: no client thread id, a replay window of its own) the map is rebuilt
    #: from the backend (:meth:`MemoryBackend.session_threads`) when Redis lost it.
    replays_thread_creates: bool


class MemoryBackend(abc.ABC):
    """Implemented by :class:`~afterthought.backends.zep.ZepBackend` and
    :class:`~afterthought.backends.local.LocalBackend`. Failures raise :class:`BackendError`."""

    #: For logs and metrics labels only.
    name: str
    capabilities: Capabilities

    @abc.abstractmethod
    async def ensure_user(
        self, *, zep_user_id: str, first_name: str | None = None, last_name: str | None = None
    ) -> tuple[UserRef, bool]:
        """Create the user, or find the one already created with this id (then False)."""

    @abc.abstractmethod
    async def find_user(self, *, zep_user_id: str) -> UserRef | None:
        """The user stored under this id, or None: a forget asks the backend itself, as the
        registry in Redis may have lost the user."""

    @abc.abstractmethod
    async def create_thread(self, *, user: UserRef, idempotency_key: str) -> str:
        """Create a thread; callers serialise this per session (see the identity registry)."""

    def session_threads(self, *, user: UserRef) -> AsyncGenerator[tuple[str, str | None]]:
        """The user's threads, newest first, each with the session tag
        (:data:`SESSION_FIELD`) its first message carries (None: empty, or untagged).
        Asked only of backends that do not replay thread creates."""
        raise NotImplementedError

    @abc.abstractmethod
    async def thread_owner(self, *, thread_uuid: str) -> str | None:
        """The ``user_uuid`` the thread belongs to; None if there is no such thread."""

    @abc.abstractmethod
    async def add_messages(
        self,
        *,
        thread_uuid: str,
        messages: Sequence[OutgoingMessage],
        idempotency_key: str,
        ignore_roles: Sequence[str] = (),
        return_context: bool = False,
        timeout: float | None = None,
    ) -> str | None:
        """Append messages in order; a replay with the same key adds nothing. With
        ``return_context``, the thread's context block after the call (else None).
        ``timeout``: seconds before the call counts as timed out (its outcome unknown)."""

    @abc.abstractmethod
    async def remove_copy(
        self, *, thread_uuid: str, copy: LateCopy, last_chance: bool
    ) -> str | None:
        """Take a late copy out of what readers meet: deleted where the backend can delete
        one message, else marked with :data:`COPY_OF_FIELD` and what the backend derived
        from it deleted. Returns what was done (``deleted``, ``marked``, or
        ``marked_unmatched``: marked, but what was derived from it could not be told
        apart), or None when it cannot be done yet (the backend has not derived from the
        copy yet) and ``last_chance`` is not set: asked again at the next run."""

    @abc.abstractmethod
    async def recent_messages(
        self, *, thread_uuid: str, limit: int, timeout: float | None = None
    ) -> list[StoredMessage]:
        """The thread's latest messages, newest first."""

    @abc.abstractmethod
    async def message_page(
        self, *, thread_uuid: str, cursor: str | None, timeout: float | None = None
    ) -> tuple[list[StoredMessage], str | None]:
        """One page of the thread's messages, newest first, from ``cursor`` (None: the
        newest), as many as the backend gives a page; and the cursor of the next (older)
        page, None after the oldest. Pages are cut by position, not offset: messages added
        between two pages shift none of them."""

    @abc.abstractmethod
    async def get_context(
        self,
        *,
        user: UserRef,
        query: str,
        max_chars: int,
        timeout: float,
        template_uuid: str | None = None,
    ) -> str:
        """The user's context block for ``query`` (rendered with the template, if any);
        empty when there is nothing to say."""

    @abc.abstractmethod
    async def create_template(self, *, name: str, template: str) -> str:
        """Store a context template; returns its UUID (see ``afterthought.templates``)."""

    @abc.abstractmethod
    async def get_template(self, template_uuid: str) -> tuple[str, str]:
        """``(name, template)``."""

    @abc.abstractmethod
    async def update_template(self, template_uuid: str, *, name: str, template: str) -> None: ...

    @abc.abstractmethod
    async def delete_template(self, template_uuid: str) -> None: ...

    @abc.abstractmethod
    async def add_fact(
        self,
        *,
        user: UserRef,
        text: str,
        key: str,
        trust: str,
        reference_time: str,
        said_ms: int | None = None,
    ) -> None:
        """Store a fact about the user, with provenance; a replay of ``key`` adds nothing
        while the fact is held. ``said_ms`` (when the add was made) tells a new add of a
        fact deleted since from a replay of the one before."""

    @abc.abstractmethod
    async def delete_memory(self, *, user: UserRef, memory_uuid: str) -> bool:
        """Delete one stored memory (a fact, or what a search returned): True once it is
        deleted, False if there was no such memory (gone already is fine)."""

    @abc.abstractmethod
    async def delete_user(self, *, user: UserRef) -> None:
        """Delete the user with its threads, messages and facts; gone is fine."""

    @abc.abstractmethod
    async def user_messages(
        self, *, user: UserRef, after: str | None, limit: int
    ) -> tuple[list[HistoryMessage], str | None]:
        """The user's stored messages after the cursor ``after``, oldest first, and the
        cursor of the last one (None if there were none)."""

    @abc.abstractmethod
    async def list_facts(self, *, user: UserRef) -> list[StoredFact]:
        """The user's facts, superseded ones included (``invalid_at`` set)."""

    @abc.abstractmethod
    async def write_facts(
        self, *, user: UserRef, add: Sequence[Fact], invalidate: Sequence[str], at: str
    ) -> None:
        """Add facts (with provenance) and mark superseded ones invalid, all or nothing."""

    @abc.abstractmethod
    async def search(
        self, *, graph_uuid: str, request: SearchRequest, timeout: float
    ) -> list[SearchHit]:
        """One page of results (``request.limit``), best first; ``context`` gives one hit."""

    async def kept_secret(self, name: str) -> str | None:
        """A random secret the store keeps under ``name``, made by the first to ask; None
        where the store keeps none (Zep)."""
        return None

    async def prepare(self) -> None:
        """Ready what every call needs, for a long-lived process (a worker, at start): what
        cannot be readied raises here, once, rather than failing each call after."""
        return None

    async def aclose(self) -> None:
        """Release the running loop's connections."""
        return None


def ignored_roles(settings: Settings, backend: MemoryBackend) -> tuple[str, ...]:
    """Roles the backend stores as history but keeps out of fact extraction: where it
    extracts, the assistant's in ``zep`` mode (it is not a source of user facts) and every
    role in ``managed`` mode (only validated facts reach the graph)."""
    if not (backend.capabilities.extracts_facts and backend.capabilities.ignores_roles):
        return ()
    return ("user", "assistant") if settings.memory_mode == "managed" else ("assistant",)


def synthesizes(settings: Settings, backend: MemoryBackend) -> bool:
    """Our synthesis runs where nothing else extracts: locally, and in ``managed`` mode.
    Elsewhere the backend's facts are its own, drawn from what was said as it was said."""
    return not backend.capabilities.extracts_facts or settings.memory_mode == "managed"
