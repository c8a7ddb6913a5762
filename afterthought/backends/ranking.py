"""Which statements a block is offered for a question, best first: written once for both
stores. A store answers the ranking's questions (``StatementSource``: BM25 over the user's
statements, their texts, the dense ranking) in its own SQL; what is asked, in what order,
and how the answers combine is decided here, so the local and the PostgreSQL block stay
one block."""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import Any, Protocol, TypeVar

from afterthought.backends.retrieval import (
    HOP_FROM,
    asks_advice,
    asks_before,
    asks_now,
    changed_topics,
    expansion_terms,
    fuse,
    hop_terms,
    query_terms,
    question_names,
    question_terms,
)

T = TypeVar("T")

#: Candidates from the second hop (``retrieval.hop_terms``) from each of the best first.
RELEVANT_HOPS = 2
#: The oldest statements on its topic a question about before a change is offered first.
OLDEST = 3
#: A word in at most this many of the user's statements links them (``rare_terms``).
RARE = 3
#: Statements of changed facts a question about before a change is offered at most: the
#: old and the new value of its topic's latest two changes.
CHANGE_STATEMENTS = 4


class StatementSource(Protocol):
    """One read's view of one user's eligible statements."""

    async def lexical(self, queries: Sequence[Sequence[str]]) -> list[list[int]]:
        """For each of ``queries`` (terms), the statements ranked by BM25 for its terms,
        best first (``local._lexical``): rankings that do not wait on each other are asked
        together, in one question to the store."""
        ...

    async def counts(self, terms: Sequence[str]) -> dict[str, int]:
        """The statements holding each term (counted as far as ``split_by_frequency``
        needs: up to ten times ``RANKED_ROWS``)."""
        ...

    async def contents(self, ids: Sequence[int]) -> dict[int, str]:
        """The text of each of ``ids`` still stored."""
        ...

    async def dense(self, query: str) -> list[int]:
        """The statements nearest ``query`` by embedding, best first; none without an
        embedder."""
        ...

    async def constraints(self) -> list[int]:
        """The statements the user's current facts that limit advice (``CONSTRAINTS``)
        were read from, the most important fact's first (``local._constraints``)."""
        ...

    async def changes(self, predicates: Sequence[str]) -> list[int]:
        """The statements the user's own replaced facts of ``predicates`` were read from,
        each followed by those of what replaced it, the newest change first
        (``local._replaced``)."""
        ...


def run_now(ranking: Coroutine[Any, Any, T]) -> T:
    """``ranking`` run to its end at once: on a source whose answers never wait (the local
    store reads SQLite in the calling thread) it never suspends."""
    try:
        ranking.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    ranking.close()
    raise RuntimeError("a ranking waited on a source that answers at once")


async def relevant(source: StatementSource, query: str) -> list[int]:
    """The statements about ``query``, then, after the best ``HOP_FROM``, for each of these
    the best ``RELEVANT_HOPS`` about the names and relations it holds (``hop_terms``): what
    a question needs two statements for ("the city I visit in August" is in "my brother
    Elio lives in Brno", found by "Elio" from "a week off in August to stay with Elio").
    The question's own names anchor hops too: the best statements naming them ("the
    restaurant Mbali recommended": "Mbali swears by Dosa Palace") start a hop of their own,
    however common the question's other words make them rank, and a hop by their rare
    words as well (``rare_terms``). For a question about before a change, the statements
    its topic's facts changed by come right after the best (``changes``: "the weather here
    in Accra…", then "we've settled into Kraków", though neither shares a word with "where
    did I live before the move?"), then the oldest statements on its topic: the newer
    ones, and the hops from them, crowd out what was said before the thing changed."""
    first, earliest, anchors = await ranked(source, query)
    best = first[:HOP_FROM]
    if not best:
        return first
    starts = list(dict.fromkeys([*best, *anchors[:HOP_FROM]]))
    texts = await source.contents(starts)
    found = [m for m in starts if m in texts]
    anchored = [m for m in found if m in anchors[:HOP_FROM]]
    hops = [hop_terms([texts[m]], query) for m in found]
    rare = await rare_terms(source, [texts[m] for m in anchored], query, hops)
    hopped = await source.lexical([*hops, *rare])
    from_rare = dict(zip(anchored, hopped[len(found) :], strict=True))
    second: list[int] = []
    for message_id, hop in zip(found, hopped[: len(found)], strict=True):
        second += hop[:RELEVANT_HOPS]
        second += from_rare.get(message_id, [])[:RELEVANT_HOPS]
    # Advice must respect what limits the user ("what should I pack for a winter hike?":
    # "the Raynaud's is bad this week"), though the question names none of it.
    limits = await source.constraints() if asks_advice(query) else []
    changed = await changes(source, query)
    return list(
        dict.fromkeys([*best, *changed, *limits, *earliest, *anchors[:HOP_FROM], *second, *first])
    )


async def changes(source: StatementSource, query: str) -> list[int]:
    """For a question about before a change, the statements its topic's facts changed by
    (``changed_topics``), the topic it asks most about first: at most
    ``CHANGE_STATEMENTS``."""
    out: list[int] = []
    for predicate in changed_topics(query):
        out = list(dict.fromkeys([*out, *await source.changes([predicate])]))
        if len(out) >= CHANGE_STATEMENTS:
            break
    return out[:CHANGE_STATEMENTS]


async def rare_terms(
    source: StatementSource, texts: Sequence[str], query: str, hops: Sequence[Sequence[str]]
) -> list[list[str]]:
    """For each of ``texts``, its words the user rarely says (in at most ``RARE``
    statements, the text one of them) that ``query`` does not hold, to hop by: "a pastime
    Jia and I share" finds "Jia is into bouldering", whose "bouldering" finds "I started
    bouldering" (no name, no relation links the two). Counted in one question, with the
    terms of ``hops`` (ranked next)."""
    asked = set(query_terms(query))
    words = [[t for t in query_terms(text) if t not in asked] for text in texts]
    counts = await source.counts([t for terms in [*words, *hops] for t in terms])
    return [[t for t in dict.fromkeys(terms) if 1 < counts[t] <= RARE] for terms in words]


async def ranked(source: StatementSource, query: str) -> tuple[list[int], list[int], list[int]]:
    """The question ranked three ways, fused: BM25 over its own words, BM25 over the words
    its topic is said in (``expansion_terms``; the newer first for a question about now),
    and the dense ranking; for a question about before a change (``asks_before``), the
    oldest ``OLDEST`` statements on its topic; and, asked with them, BM25 over the
    question's names alone (``relevant``'s anchors)."""
    expansion = expansion_terms(query)
    lexical, said, anchors = await source.lexical(
        [question_terms(query), expansion, question_names(query)]
    )
    earliest: list[int] = []
    if expansion:
        # "Where do I work now?": of the statements on the topic, the newer first.
        newest = sorted(said, reverse=True) if asks_now(query) else []
        lexical = fuse([lexical, said, newest])
        earliest = sorted(said)[:OLDEST] if asks_before(query) else []
    if query.strip() and (dense := await source.dense(query)):
        lexical = fuse([lexical, dense])
    return lexical, earliest, anchors
