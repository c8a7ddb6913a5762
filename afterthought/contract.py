"""The turn/job contract: what a queued message is, its deterministic key, its JSON form."""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from datetime import UTC, datetime
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)

from afterthought.keys import digest
from afterthought.telemetry import text_repaired

#: Written into every payload; workers accept this version and the one before it.
PAYLOAD_VERSION = 1
ACCEPTED_VERSIONS = frozenset({PAYLOAD_VERSION, PAYLOAD_VERSION - 1})

Role = Literal["user", "assistant", "system", "tool", "function"]
_ROLES: dict[str, Role] = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "function",
}


def to_role(raw: str | None) -> Role | None:
    """A backend role: ``human``/``ai`` (and ADK's ``model``) coerced, anything else None,
    which is sent as no role at all (seed 004; v4 has no ``norole``)."""
    return _ROLES.get((raw or "").strip().lower())


Kind = Literal["message", "fact", "forget"]
#: The pseudo-session that carries a user's fact writes and forgets through the queue.
MEMORY_SESSION = "~memory"


class MalformedPayload(ValueError):
    """A queued item that cannot be read back; it becomes a dead letter, never a crash."""


def message_key(
    *, app: str, user_id: str, session_id: str, invocation_id: str, role: str, ordinal: int
) -> str:
    """The one deterministic key of a message: the same turn always gets the same key."""
    return digest(app, user_id, session_id, invocation_id, role, str(ordinal))


def thread_key(*, app: str, user_id: str, session_id: str) -> str:
    """Names a thread's queue keys without putting user-chosen strings into key names."""
    return digest(app, user_id, session_id, size=24)


def checksum(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()[:16]


_SURROGATE = re.compile("[\ud800-\udfff]")


def repair_text(text: str) -> tuple[str, int]:
    """Text that can be encoded: surrogate pairs left as two code points are joined, lone
    surrogates (invalid UTF-16, e.g. from a JavaScript client) become U+FFFD. Returns the
    text and how many code points were replaced."""
    if not _SURROGATE.search(text):
        return text, 0
    repaired = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return repaired, repaired.count("\ufffd") - text.count("\ufffd")


def check_ids(*ids: str) -> None:
    """Ids name users and threads: one is never repaired into another's, so an id that is
    not valid Unicode is refused (``InvalidIds``) rather than changed."""
    if any(_SURROGATE.search(i) for i in ids):
        raise InvalidIds("an id contains a lone surrogate (invalid Unicode)")


def instant(at: float | None) -> datetime | None:
    """The instant an event time (seconds) names; None for none, and for one that names
    none (not finite, or beyond what a date can hold)."""
    if at is None or not math.isfinite(at):
        return None
    try:
        return datetime.fromtimestamp(at, UTC)
    except (OverflowError, OSError, ValueError):
        return None


class Unmade(ValueError):
    """What a message cannot be made of; ``reason`` names why (metrics, logs: no content)."""

    reason = "unmade"


class InvalidIds(Unmade):
    """An ADK id that cannot name anything safely (see :func:`check_ids`)."""

    reason = "invalid ids"


class InvalidTime(Unmade):
    """A replayed event's time that names no instant (see :func:`instant`): when it was
    said decides whether a forget covers it, so it is never guessed."""

    reason = "invalid time"


class QueuedMessage(BaseModel):
    """One message on its way to the backend."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    v: int = PAYLOAD_VERSION
    """Payload version."""
    said_ms: int | None = None
    """When the words were said (ms), set once by :meth:`build` and carried as it is by the
    buffer, a spool and every retry: the agent's clock for a live turn; for a replay (a
    session imported again, said long before) its event's time, never later than now, so
    words said before a forget are refused however late they are re-imported. A reply is
    dated by when its turn began (``began``): it may repeat the memory the turn read then,
    so a forget after that refuses it, however late the model answers. The enqueue
    script refuses it if the user was forgotten after that (``afterthought.queue``). Right
    after ``v`` in the JSON, where the script reads it. None: made by a version that did
    not stamp it."""
    saying: int = Field(default=1, ge=1)
    """Which saying of its role and text in its session this is (from 1), for a replay: it
    is taken as stored by another integration (without our key) only if the thread holds
    that many such messages (``afterthought.batching.StoredIndex``)."""
    seq: int | None = None
    """Per-thread sequence number, assigned by the enqueue script."""
    queued_ms: int | None = None
    """When the enqueue script queued it (Redis' clock, ms): status's ages, and what the
    worker compares with when Redis was found to be another server."""
    skew_ms: int = 0
    """How far the clock that stamped ``said_ms`` ran ahead of Redis' when it was queued
    (the enqueue script's; the way there included): ``said_ms - skew_ms`` is on Redis'
    clock, where forgets are timed."""
    numbering: int | None = None
    """The name of the thread's numbering its ``seq`` belongs to (the enqueue script's; a
    thread whose hash expired idle numbers from 1 again under another). None: unknown."""
    epoch: int = 0
    """The user's deletion epoch when queued (by the script); forgetting bumps it."""
    key: str
    """Deterministic message key (see :func:`message_key`); travels in backend metadata."""
    app: str
    """ADK app name."""
    user_id: str
    """ADK user id."""
    session_id: str
    """ADK session id."""
    invocation_id: str
    """ADK invocation that produced the message."""
    role: Role | None
    """Backend role; None: sent without one."""
    ordinal: int = Field(ge=0)
    """Position among this invocation's messages of the same role."""
    content: str = Field(min_length=1)
    """The text, never logged."""
    name: str | None = None
    """Display name of the speaker."""
    reference_time: str
    """ISO-8601 time the message was said (the event's time, not the flush time)."""
    checksum: str
    """Hash of ``content``, kept only to detect corruption."""
    replay: bool = False
    """Re-added from a stored session: the worker sends only what the backend lacks."""
    unsure: bool = False
    """May already be stored (a dead letter replayed, a direct write whose outcome is
    unknown): the worker reconciles its batch against the backend first."""
    kind: Kind = "message"
    """``message`` for the thread; ``fact``: ``content`` is a fact about the user to store;
    ``forget``: ``content`` is the id of a stored memory to delete."""
    trust: str | None = None
    """Who vouches for a fact: ``model`` (the remember tool), ``app`` (add_memory)."""
    zep_user_uuid: str | None = None
    """Pinned by the application (options, a resolver, or session state it is trusted
    with): the worker uses it. A user pinned in untrusted state is never sent."""
    zep_graph_uuid: str | None = None
    """Pinned graph, as above."""
    zep_thread_uuid: str | None = None
    """Pinned thread (by the application or in session state): the worker writes there,
    provisioning nothing, once the backend says it is the user's."""
    trace: dict[str, str] | None = None
    """The W3C Trace Context (``traceparent``, ``tracestate``) of the enqueue that queued
    it, where the application traces (``afterthought.tracing``): the worker's persist span
    links to it. Last in the JSON, and left out when None: a payload without tracing is
    what it was, and a worker of an earlier version ignores the field. One that is not
    text by name is read as ``{}`` (:meth:`_context`), which the persist span counts."""

    @field_validator("trace", mode="wrap")
    @classmethod
    def _context(cls, value: object, read: ValidatorFunctionWrapHandler) -> dict[str, str] | None:
        """A malformed context costs the message its trace link, never the message: the
        words are the user's, the context only a tracer's (another integration's, an
        edited payload's)."""
        try:
            context: dict[str, str] | None = read(value)
        except ValidationError:
            return {}
        return context

    @classmethod
    def build(
        cls,
        *,
        app: str,
        user_id: str,
        session_id: str,
        invocation_id: str,
        role: Role | None,
        ordinal: int,
        content: str,
        name: str | None = None,
        at: float | None = None,
        began: float | None = None,
        replay: bool = False,
        saying: int = 1,
        kind: Kind = "message",
        trust: str | None = None,
        zep_user_uuid: str | None = None,
        zep_graph_uuid: str | None = None,
        zep_thread_uuid: str | None = None,
    ) -> QueuedMessage:
        check_ids(app, user_id, session_id, invocation_id)
        # Raises ``Unmade``: an id ``check_ids`` refuses, a replay's time that names no
        # instant. A live message is said now, whatever its event's time says.
        when = instant(at)
        if replay and at is not None and when is None:
            raise InvalidTime("an event time is not finite or out of range")
        content, repaired = repair_text(content)
        if name is not None:
            name, _ = repair_text(name)
        if repaired:
            text_repaired.add(repaired)
        # ``began``: the earliest moment what it says could have come from the user's
        # memory (its turn's start); it is said then, as far as a forget is concerned.
        said = [time.time()]
        if replay and at is not None:
            said.append(at)
        if began is not None and instant(began) is not None:
            said.append(began)
        return cls(
            said_ms=int(min(said) * 1000),
            saying=saying,
            key=message_key(
                app=app,
                user_id=user_id,
                session_id=session_id,
                invocation_id=invocation_id,
                role=role or "",
                ordinal=ordinal,
            ),
            app=app,
            user_id=user_id,
            session_id=session_id,
            invocation_id=invocation_id,
            role=role,
            ordinal=ordinal,
            content=content,
            name=name,
            reference_time=(when or datetime.now(UTC)).isoformat(),
            checksum=checksum(content),
            replay=replay,
            kind=kind,
            trust=trust,
            zep_user_uuid=zep_user_uuid,
            zep_graph_uuid=zep_graph_uuid,
            zep_thread_uuid=zep_thread_uuid,
        )

    @property
    def thread_key(self) -> str:
        return thread_key(app=self.app, user_id=self.user_id, session_id=self.session_id)

    def encode(self) -> str:
        """JSON without the header the enqueue script prepends."""
        unqueued = {"seq", "epoch", "queued_ms", "skew_ms", "numbering"}
        return self.model_dump_json(exclude=unqueued if self.trace else unqueued | {"trace"})

    @classmethod
    def decode(cls, raw: bytes | str) -> QueuedMessage:
        try:
            message = cls.model_validate_json(raw)
        except ValidationError as exc:
            # The error names fields and types only; pydantic's text would echo content.
            fields = ",".join(sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]}))
            raise MalformedPayload(f"invalid payload fields: {fields or '?'}") from None
        if message.v not in ACCEPTED_VERSIONS:
            raise MalformedPayload(f"unsupported payload version {message.v}")
        if message.seq is None:
            raise MalformedPayload("payload has no sequence number")
        if checksum(message.content) != message.checksum:
            raise MalformedPayload("payload checksum mismatch")
        return message


def split_content(content: str, limit: int) -> list[str]:
    """Ordered parts of at most ``limit`` characters, cut at a line or word break when one
    is near; joined back they give the original text exactly."""
    parts: list[str] = []
    rest = content
    while len(rest) > limit:
        window = rest[:limit]
        cut = max(window.rfind("\n"), window.rfind(" "))
        if cut < limit // 2:
            cut = limit - 1
        parts.append(rest[: cut + 1])
        rest = rest[cut + 1 :]
    parts.append(rest)
    return parts


#: The reason listed for a dead letter whose header cannot be read.
UNREADABLE_LETTER = "unreadable letter header"


class DeadLetter(BaseModel):
    """A queued item the worker gave up on, with why; replayable as it was queued."""

    thread: str
    """Thread key it was queued on."""
    reason: str
    """Error kind, status and code (never content)."""
    attempts: int
    """Deferred attempts made before giving up."""
    at: int
    """When, in ms since the epoch."""
    item: bytes
    """The queued payload, byte for byte."""
    id: str = ""
    """A digest of the letter's bytes: names it whatever its place among the letters (a
    letter dead-lettered or replayed meanwhile moves the others' indexes)."""

    @classmethod
    def parse(cls, raw: bytes) -> DeadLetter:
        """Never raises: a letter whose header cannot be read (damaged, or another
        program's) is listed as :data:`UNREADABLE_LETTER`, on no thread, with its item,
        so one bad letter cannot stop a listing, a replay or a forget's sweep (the item
        says whose message it is, when it can be read)."""
        header, _, item = raw.partition(b"\n")
        named = letter_id(raw)
        try:
            return cls.model_validate({**json.loads(header), "item": item, "id": named})
        except (ValueError, TypeError):  # JSON, UTF-8 and validation errors alike
            return cls(thread="", reason=UNREADABLE_LETTER, attempts=0, at=0, item=item, id=named)


def letter_id(raw: bytes) -> str:
    """:attr:`DeadLetter.id` of a letter's bytes."""
    return hashlib.sha256(raw).hexdigest()[:16]
