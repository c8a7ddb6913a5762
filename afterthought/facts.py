"""Facts about a user: what synthesis proposes and what the backend stores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from afterthought.keys import digest

Trust = Literal["user", "assistant", "model", "tool", "app"]

#: Predicates with one current value per subject: a newer statement supersedes the older
#: one. Relations with one current person (``husband``, ``mother``...) are here; those that
#: come in numbers (``sister``, ``dog``, ``child``) are not: a second child is not a
#: replacement of the first.
SINGLE_VALUED = frozenset(
    {
        "name",
        "age",
        "birth_year",
        "birthday",
        "born_in",
        "nationality",
        "lives_in",
        "from",
        "grew_up_in",
        "works_at",
        "occupation",
        "studies",
        "studies_at",
        "diet",
        "household_size",
        "relationship_status",
        "spouse",
        "pregnancy",
        "wife",
        "husband",
        "partner",
        "boyfriend",
        "girlfriend",
        "fiance",
        "mother",
        "father",
        "mother_in_law",
        "father_in_law",
        "boss",
        "car",
        "home",
        "alcohol",
        "works_shifts",
    }
)
_VOLATILE_TEXT = """
    lives_in works_at occupation studies studies_at diet household_size relationship_status
    pregnancy partner boyfriend girlfriend fiance medication
"""
#: Facts whose value moves with a life (home, work, diet, a dose): once the user speaks of
#: one again, their latest words are the authority (synthesis retires the fact).
VOLATILE = frozenset(_VOLATILE_TEXT.split())
#: Prefixes of single-valued families: one favourite of each sort, one date per event, one
#: current amount of each routine ("50 km a week", then "30 km a week").
SINGLE_VALUED_PREFIXES = ("favourite_", "event_", "routine_")
#: ``not_lives_in: Paris`` retracts ``lives_in: Paris`` ("I don't live in Paris anymore");
#: it is never stored itself.
RETRACTION = "not_"


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
        return self.predicate in SINGLE_VALUED or self.predicate.startswith(SINGLE_VALUED_PREFIXES)

    @property
    def retracts(self) -> str | None:
        """The predicate this fact denies (its value no longer holds), or None."""
        return self.predicate.removeprefix(RETRACTION) if self.is_retraction else None

    @property
    def is_retraction(self) -> bool:
        return self.predicate.startswith(RETRACTION)

    @property
    def signature(self) -> str:
        return fact_signature(self.subject, self.predicate, self.value)

    def statement(self) -> str:
        return statement(self.subject, self.predicate, self.value)


def statement(subject: str, predicate: str, value: str) -> str:
    """A fact as one line; one about someone else names them ("sister Ana lives in: Oslo"),
    a free-form note is its own text. Line breaks become spaces: a fact must not forge the
    block's headers or quoted lines after it."""
    if predicate == "noted":
        return " ".join(value.split())
    about = "" if subject == "user" else f"{subject} "
    return " ".join(f"{about}{predicate.replace('_', ' ')}: {value}".split())


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
