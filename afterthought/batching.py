"""From queued messages to backend calls: ordered parts (split, never cut), calls of at
most ``batch_size``, each keyed by what it carries; and reconciliation against what the
backend already holds. Shared by the worker and the agent's outage direct write."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from afterthought.backends.base import MESSAGE_KEY_FIELD, OutgoingMessage, StoredMessage
from afterthought.contract import QueuedMessage, checksum, split_content
from afterthought.keys import digest

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


def parts(batch: Sequence[QueuedMessage], part_chars: int) -> list[OutgoingMessage]:
    """Each message as ordered parts (W6), its key (per part) and sequence in metadata."""
    out: list[OutgoingMessage] = []
    for m in batch:
        pieces = split_content(m.content, part_chars)
        for i, piece in enumerate(pieces):
            metadata: dict[str, str | int] = {
                MESSAGE_KEY_FIELD: m.key if len(pieces) == 1 else f"{m.key}:{i}",
                "afterthought_seq": m.seq or 0,
            }
            if len(pieces) > 1:
                metadata["afterthought_part"] = f"{i + 1}/{len(pieces)}"
            out.append(
                OutgoingMessage(
                    role=m.role,
                    content=piece,
                    reference_time=m.reference_time,
                    name=m.name,
                    metadata=metadata,
                )
            )
    return out


def pack(messages: Sequence[OutgoingMessage], per_call: int) -> list[Call]:
    return [Call(list(messages[i : i + per_call])) for i in range(0, len(messages), per_call)]


def missing(
    wanted: Sequence[OutgoingMessage], stored: Sequence[StoredMessage], *, replay: bool
) -> list[OutgoingMessage]:
    """What of ``wanted`` the backend lacks: by message key and text (two texts under one
    key, from a reused invocation id, are two messages); for a replayed session also by the
    same role saying the same text in a message stored without our key (written before
    afterthought, e.g. by zep-adk)."""
    present = {(m.key, m.content) for m in stored if m.key}
    # Only what was stored without our key (by another integration) is matched by text: our
    # own messages are matched by key, or a user who says "yes" twice would lose one.
    said = {(m.role, m.content) for m in stored if not m.key} if replay else set()
    lacking: list[OutgoingMessage] = []
    for m in wanted:  # a replay may also repeat a turn queued in the same batch
        key = (str(m.metadata[MESSAGE_KEY_FIELD]), m.content)
        if key not in present and (m.role, m.content) not in said:
            lacking.append(m)
            present.add(key)
    return lacking
