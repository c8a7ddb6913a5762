"""From queued messages to backend calls: ordered parts (split, never cut), calls of at
most ``batch_size``, each keyed by what it carries; and reconciliation against what the
backend already holds. Shared by the worker and the agent's outage direct write."""

from __future__ import annotations

import hashlib
import heapq
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from afterthought.backends.base import (
    MESSAGE_KEY_FIELD,
    SESSION_FIELD,
    OutgoingMessage,
    StoredMessage,
)
from afterthought.contract import QueuedMessage, checksum, split_content
from afterthought.keys import Keys, digest

if TYPE_CHECKING:
    from afterthought.settings import Settings


@dataclass(frozen=True, slots=True)
class Call:
    """One ``add_messages`` call. A call resent after an unknown outcome is the same
    messages under the same key (never a batch cut anew), so where keys are honoured a
    late commit of the first attempt and the resend store it once."""

    messages: list[OutgoingMessage]

    @property
    def idempotency_key(self) -> str:
        """From each message's key and text only, nothing that could differ between two
        attempts at one call: the same call again gets the same key, and no other call
        can (two texts under one reused key are two calls)."""
        return "batch:" + digest(
            *(f"{m.metadata[MESSAGE_KEY_FIELD]}:{checksum(m.content)}" for m in self.messages)
        )


def asks_context(settings: Settings) -> bool:
    """Whether calls ask for the context block (``return_context``): every call alike,
    unless a template renders the block (``return_context`` knows none). Never by a call's
    place among those left to send, which changes between attempts: the body under one
    idempotency key must be the same at every attempt."""
    return settings.context_template_uuid is None


def parts(batch: Sequence[QueuedMessage], part_chars: int, keys: Keys) -> list[OutgoingMessage]:
    """Each message as ordered parts (W6), its key (per part), sequence and session tag
    (``keys.session_tag``) in metadata."""
    out: list[OutgoingMessage] = []
    for m in batch:
        pieces = split_content(m.content, part_chars)
        tag = keys.session_tag(m.app, m.user_id, m.session_id)
        for i, piece in enumerate(pieces):
            metadata: dict[str, str | int] = {
                MESSAGE_KEY_FIELD: m.key if len(pieces) == 1 else f"{m.key}:{i}",
                "afterthought_seq": m.seq or 0,
                SESSION_FIELD: tag,
            }
            if m.numbering is not None:
                metadata[NUMBERING_FIELD] = m.numbering
            if len(pieces) > 1:
                metadata["afterthought_part"] = f"{i + 1}/{len(pieces)}"
                metadata[WHOLE_FIELD] = m.checksum
            out.append(
                OutgoingMessage(
                    role=m.role,
                    content=piece,
                    reference_time=m.reference_time,
                    name=m.name,
                    metadata=metadata,
                    saying=m.saying,
                )
            )
    return out


#: The name of the thread's numbering a message's ``afterthought_seq`` belongs to.
NUMBERING_FIELD = "afterthought_numbering"
#: A part's metadata: the checksum of the whole message, so a thread read back knows a
#: message by its base key and text whatever ``max_message_chars`` split it.
WHOLE_FIELD = "afterthought_whole"


def pack(messages: Sequence[OutgoingMessage], per_call: int) -> list[Call]:
    return [Call(list(messages[i : i + per_call])) for i in range(0, len(messages), per_call)]


#: Digests a :class:`StoredIndex` holds unsorted before it merges them into its array.
MERGE_AT = 4096


def _digest(kind: str, name: str, content: str) -> int:
    """64 bits of a message's identity (``kind`` keeps a key apart from a role). Two
    different messages share one with probability 2^-64 per pair: one thread of 10^5
    stored messages checked against 10^5 replayed ones meets a collision with odds under
    10^-9, a collision would leave that one message unsent."""
    data = f"{kind}\0{name}\0{content}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class StoredIndex:
    """What a thread holds, as one 64-bit digest a message: by message key and checksum (a
    part by its key and text, and its split, once all in, as one message); for a
    replayed session also by role and text for messages stored without our key (written
    before afterthought, e.g. by zep-adk). 8 bytes a stored message in a sorted array, so
    a long thread's history fits in a worker (10^5 messages: under 1 MB), plus at most
    :data:`MERGE_AT` recent digests in a set.

    A message stored without our key stands for one saying: its role-and-text digest is
    kept once per stored message (a sorted array with repeats, plus its uuid's digest so a
    page read twice counts it once). A replayed message that is the n-th saying of its role
    and text in its session (``saying``) is taken as stored only if the thread holds n of
    them: a user who said "yes" twice, once before afterthought, keeps the second, whichever
    batch or worker replays it."""

    def __init__(self, *, replay: bool) -> None:
        self.replay = replay
        self._sorted = array("Q")
        self._recent: set[int] = set()
        self._said = array("Q")
        self._said_recent: list[int] = []
        # Parts seen of split messages not read whole yet: (base key, checksum, count).
        self._partial: dict[tuple[str, str, int], set[int]] = {}

    def __len__(self) -> int:
        return len(self._sorted) + len(self._recent) + len(self._said) + len(self._said_recent)

    def __contains__(self, digest: int) -> bool:
        if digest in self._recent:
            return True
        at = bisect_left(self._sorted, digest)
        return at < len(self._sorted) and self._sorted[at] == digest

    def _add(self, digest: int) -> bool:
        """Whether ``digest`` is new."""
        if digest in self:
            return False
        self._recent.add(digest)
        if len(self._recent) >= MERGE_AT:
            # A merge of two sorted runs: never all the digests as Python ints at once.
            self._sorted = array("Q", heapq.merge(self._sorted, sorted(self._recent)))
            self._recent.clear()
        return True

    def _merge_said(self) -> None:
        if self._said_recent:
            self._said = array("Q", heapq.merge(self._said, sorted(self._said_recent)))
            self._said_recent.clear()

    def _said_count(self, digest: int) -> int:
        """How many messages stored without our key have this role-and-text digest."""
        self._merge_said()
        return bisect_right(self._said, digest) - bisect_left(self._said, digest)

    def _add_keyed(self, key: str, content: str, metadata: Mapping[str, object]) -> None:
        """A message stored under our key, by key and checksum; a part by its own key and
        text, and, once all its split's parts are in, its whole message as one unsplit."""
        part, whole = metadata.get("afterthought_part"), metadata.get(WHOLE_FIELD)
        if part is None:
            self._add(_digest("whole", key, checksum(content)))
            return
        self._add(_digest("key", key, content))
        number, _, count = str(part).partition("/")
        if not (isinstance(whole, str) and number.isdigit() and count.isdigit()):
            return  # a part without its whole's checksum is known by its own key only
        split = (key.rpartition(":")[0], whole, int(count))
        seen = self._partial.setdefault(split, set())
        seen.add(int(number))
        if len(seen) == split[2]:
            del self._partial[split]
            self._add(_digest("whole", split[0], whole))

    def add_stored(self, stored: Iterable[StoredMessage]) -> None:
        for m in stored:
            if m.key:
                self._add_keyed(m.key, m.content, m.metadata)
            elif self.replay and self._add(_digest("uuid", m.uuid, "")):
                # Only what was stored without our key (by another integration) is matched
                # by text: ours are matched by key, or a user who says "yes" twice would
                # lose one.
                self._said_recent.append(_digest("said", m.role, m.content))
                if len(self._said_recent) >= MERGE_AT:
                    self._merge_said()

    def add_sent(self, sent: Iterable[OutgoingMessage]) -> None:
        """Messages a call stored (its reply came)."""
        for m in sent:
            self._add_keyed(str(m.metadata[MESSAGE_KEY_FIELD]), m.content, m.metadata)

    def lacking(
        self, wanted: Sequence[OutgoingMessage], *, by_text: bool = True
    ) -> list[OutgoingMessage]:
        """What of ``wanted`` the thread lacks, each once (a replay may repeat a turn queued
        in the same batch). Two texts under one key (a reused invocation id) are two
        messages. ``by_text`` False: by key only, for live messages checked against a
        replay's index (a live "yes" is not the one another integration stored)."""
        lacking: list[OutgoingMessage] = []
        taken: set[int] = set()
        for m in wanted:
            whole = _whole_digest(m)
            part = (
                _digest("key", str(m.metadata[MESSAGE_KEY_FIELD]), m.content)
                if WHOLE_FIELD in m.metadata
                else whole
            )
            if part in taken or part in self or whole in self:
                continue
            taken.add(part)
            said = (
                _digest("said", m.role, m.content) if by_text and self.replay and m.role else None
            )
            if said is not None and self._said_count(said) >= m.saying:
                continue
            lacking.append(m)
        return lacking


def _whole_digest(m: OutgoingMessage) -> int:
    """The message ``m`` is (a part of), by its base key and checksum: the same however it
    is split, and an unsplit message's only digest."""
    key = str(m.metadata[MESSAGE_KEY_FIELD])
    whole = m.metadata.get(WHOLE_FIELD)
    if whole is None:
        return _digest("whole", key, checksum(m.content))
    return _digest("whole", key.rpartition(":")[0], str(whole))


def missing(
    wanted: Sequence[OutgoingMessage], stored: Sequence[StoredMessage], *, replay: bool
) -> list[OutgoingMessage]:
    """What of ``wanted`` the backend lacks, of what it was read to hold (``stored``)."""
    index = StoredIndex(replay=replay)
    index.add_stored(stored)
    return index.lacking(wanted)
