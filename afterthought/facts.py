"""Facts about a user: what synthesis proposes and what the backend stores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from afterthought.keys import digest

Trust = Literal["user", "assistant", "model", "tool", "app"]

#: Predicates with one current value: a newer statement supersedes the older one.
SINGLE_VALUED = frozenset(
    {"name", "lives_in", "from", "works_at", "occupation", "age", "birthday", "diet"}
)


class Fact(BaseModel):
    """A fact as an extractor proposes it; validation decides whether it is written."""

    subject: str = Field(min_length=1, max_length=100)
    """Whom it is about; ``user`` for the user."""
    predicate: str = Field(min_length=1, max_length=60, pattern=r"^[a-z][a-z0-9_]*$")
    """snake_case relation, e.g. ``lives_in``."""
    value: str = Field(min_length=1, max_length=200)
    """The object, e.g. ``Lisbon``."""
    kind: str = Field("preference", max_length=30)
    """What sort of fact (pruning keeps kinds for different times)."""
    confidence: float = Field(0.8, ge=0, le=1)
    """How sure the extractor is."""
    importance: float = Field(0.5, ge=0, le=1)
    """How much it matters to keep (pruning ranks by importance x recency)."""
    source_keys: list[str] = Field(min_length=1)
    """Keys of the messages it came from (provenance)."""
    trust: Trust = "user"
    """Who asserted it: the user, the assistant, a tool..."""
    valid_at: str | None = None
    """When it became true (the source message's time)."""

    @property
    def single_valued(self) -> bool:
        return self.predicate in SINGLE_VALUED or self.predicate.startswith("favourite_")

    @property
    def signature(self) -> str:
        return fact_signature(self.subject, self.predicate, self.value)

    def statement(self) -> str:
        return f"{self.predicate.replace('_', ' ')}: {self.value}"


def fact_signature(subject: str, predicate: str, value: str) -> str:
    """What makes two facts the same one (tombstones and duplicates compare it)."""
    return digest(subject.lower(), predicate, " ".join(value.lower().split()))


@dataclass(frozen=True, slots=True)
class StoredFact:
    uuid: str
    subject: str
    predicate: str
    value: str
    kind: str
    importance: float
    trust: str
    valid_at: str
    invalid_at: str | None
    source_keys: list[str]
    extracted: bool = False
    """Zep extracted it from what it ingested (it carries none of our provenance); False
    for what we wrote. Pruning leaves extracted facts alone unless ``prune_zep_edges``."""

    @property
    def signature(self) -> str:
        return fact_signature(self.subject, self.predicate, self.value)
