"""The PostgreSQL store (``backend="postgres"``): the local store's tables, retrieval and
forgetting in one database that workers and agents on any number of machines share. Its
behaviour is the local store's (:mod:`afterthought.backends.local`): the same verdicts at
write time, the same ranking (BM25 computed here over the candidates the database finds,
with the same statistics FTS5 keeps), the same block. What differs is said where it does.

Writes are exactly once across machines: a call's key and a message's key are unique
constraints, written with ``ON CONFLICT DO NOTHING``, so a batch replayed by another
worker (or the same one after a crash) adds nothing, whatever its timing.

Words are indexed per user: each user has a random key (``users.term_key``), and a
statement's words are stored as keyed hashes of their stems (``_lexeme``) in a
``tsvector``, which triggers copy into ``postings``: a B-tree of (lexeme, statement id)
holding each term's weighted frequency and the statement's length, with each lexeme's
count in ``term_counts``. A term's postings are then one user's rows only, read by
index-only scans in id order: counting costs one row a term, ranking the newest matches
costs what it ranks, and BM25 is computed in the statement that finds the rows, never
another user's and never a heap row; and once a user is deleted, nothing left in an index
page or a WAL segment can be tied to a word of theirs (their key went with the row)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from afterthought.backends import ranking
from afterthought.backends.base import (
    LAST_CHECK,
    MESSAGE_KEY_FIELD,
    BackendError,
    Capabilities,
    HistoryMessage,
    LateCopy,
    MemoryBackend,
    OutgoingMessage,
    StoredMessage,
    UserRef,
)
from afterthought.backends.local import (
    CHANGED_FACTS,
    COMMON_TERMS,
    FOLLOW_UP_POOL,
    INFORMATIVE_POOL,
    MAX_CONSTRAINTS,
    MESSAGE_PAGE,
    RANKED_ROWS,
    RECENT,
    RELEVANT,
    REPLIED_WEIGHT,
    Row,
    _reply_context,
    _Verdict,
    _verdict,
    assemble_statements,
    changed_keys,
    constraint_keys,
    fact_hits,
    fact_lines,
    informative_order,
    match_score,
    render_template,
    repeating,
    said_hits,
    stored_fact,
)
from afterthought.backends.retrieval import (
    CONSTRAINTS,
    Statement,
    query_terms,
    render_block,
    scoped_stem,
    split_by_frequency,
    words,
)
from afterthought.contract import checksum, repair_text
from afterthought.facts import Fact, StoredFact, statement
from afterthought.loops import PerLoop
from afterthought.search import SearchHit, SearchRequest
from afterthought.settings import database_address

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

    #: A connection of the pool.
    Db: TypeAlias = PoolConnectionProxy[asyncpg.Record]

T = TypeVar("T")
log = logging.getLogger("afterthought.postgres")

#: Rows of ``retrieval_totals``: the store's statement and token counts (BM25's row count
#: and mean length, as FTS5 keeps them for the whole file) are kept in this many counters,
#: one per group of users, so that writers for different users rarely wait on one row.
TOTALS_SHARDS = 64
#: What FTS5's ``bm25`` uses.
BM25_K1 = 1.2
BM25_B = 0.75
#: A tsvector keeps positions up to this; a longer statement's later words count once.
MAX_POSITION = 16383

_TOTALS_FUNCTION = """
CREATE FUNCTION retrieval_count() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
  IF TG_OP IN ('UPDATE', 'DELETE') THEN
    UPDATE retrieval_totals t SET statements = t.statements - d.n, tokens = t.tokens - d.k
    FROM (SELECT hashtext(user_uuid) & 63 AS shard, count(*) AS n, sum(tokens) AS k
          FROM removed WHERE eligible GROUP BY 1 ORDER BY 1) d
    WHERE t.shard = d.shard;
  END IF;
  IF TG_OP IN ('UPDATE', 'INSERT') THEN
    UPDATE retrieval_totals t SET statements = t.statements + d.n, tokens = t.tokens + d.k
    FROM (SELECT hashtext(user_uuid) & 63 AS shard, count(*) AS n, sum(tokens) AS k
          FROM added WHERE eligible GROUP BY 1 ORDER BY 1) d
    WHERE t.shard = d.shard;
  END IF;
  RETURN NULL;
END $$"""

#: The postings of the statements of ``rows`` (a table of messages): each lexeme of its
#: ``terms`` as a signed 64-bit integer (``_posting``), the statement, the term's frequency
#: and the statement's length.
_POSTED = (
    "SELECT ('x' || t.lexeme)::bit(64)::bigint, r.id, term_frequency(t.weights), r.tokens"
    " FROM {rows} r, unnest(r.terms) t WHERE r.terms IS NOT NULL"
)

# The postings follow the statements' words (inserted, re-indexed without the question a
# reply answered, deleted), each lexeme's count with them; every statement locks the
# counts in lexeme order, so a write and a forget of one user wait for each other, never
# deadlock.
_POSTINGS_FUNCTION = f"""
CREATE FUNCTION retrieval_postings() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE emptied bigint[];
BEGIN
  IF TG_OP IN ('UPDATE', 'DELETE') THEN
    WITH gone AS (
      DELETE FROM postings p USING (
        SELECT ('x' || l)::bit(64)::bigint AS lexeme, r.id
        FROM removed r, unnest(tsvector_to_array(r.terms)) l WHERE r.terms IS NOT NULL) d
      WHERE p.lexeme = d.lexeme AND p.id = d.id RETURNING p.lexeme),
    counted AS (
      INSERT INTO term_counts SELECT lexeme, -count(*) FROM gone GROUP BY 1 ORDER BY 1
      ON CONFLICT (lexeme) DO UPDATE SET statements = term_counts.statements + excluded.statements
      RETURNING lexeme, statements)
    SELECT array_agg(lexeme) INTO emptied FROM counted WHERE statements <= 0;
    DELETE FROM term_counts WHERE lexeme = ANY(emptied);
  END IF;
  IF TG_OP IN ('UPDATE', 'INSERT') THEN
    WITH made AS (INSERT INTO postings {_POSTED.format(rows="added")} RETURNING lexeme)
    INSERT INTO term_counts SELECT lexeme, count(*) FROM made GROUP BY 1 ORDER BY 1
    ON CONFLICT (lexeme) DO UPDATE SET statements = term_counts.statements + excluded.statements;
  END IF;
  RETURN NULL;
END $$"""

#: Versioned migrations, applied in order by the first process that opens the store with
#: ``upgrade`` (a worker), under an advisory lock, each in the one transaction that records
#: it. Never edited once released: a change is a new version.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        "CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL)",
        "INSERT INTO meta VALUES ('store_id', md5(random()::text || clock_timestamp()::text))",
        "CREATE TABLE users (uuid text PRIMARY KEY, user_id text UNIQUE NOT NULL,"
        " graph_uuid text UNIQUE NOT NULL, first_name text, last_name text,"
        " term_key bytea NOT NULL, created_at text NOT NULL)",
        "CREATE TABLE threads (uuid text PRIMARY KEY,"
        " user_uuid text NOT NULL REFERENCES users(uuid) ON DELETE CASCADE,"
        " idempotency_key text UNIQUE, created_at text NOT NULL)",
        "CREATE INDEX threads_user ON threads(user_uuid)",
        # A message's key is unique in its thread (see local.MESSAGES_COLUMNS). Metadata is
        # JSON as text: jsonb holds no NUL, which ids may. ``tokens``
        # and ``terms`` are set for eligible statements only: their length in words and
        # their words as keyed stems (content weighted A, the question replied to B).
        "CREATE TABLE messages (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " uuid text UNIQUE NOT NULL,"
        " thread_uuid text NOT NULL REFERENCES threads(uuid) ON DELETE CASCADE,"
        " message_key text, role text NOT NULL, name text, content text NOT NULL,"
        " metadata text NOT NULL, reference_time text, ingested boolean NOT NULL,"
        " created_at text NOT NULL, user_uuid text NOT NULL, clean boolean NOT NULL,"
        " eligible boolean NOT NULL, informative integer NOT NULL, replied text,"
        " tokens integer NOT NULL DEFAULT 0, terms tsvector,"
        " CONSTRAINT messages_key UNIQUE (thread_uuid, message_key))",
        "CREATE INDEX messages_thread ON messages(thread_uuid, id)",
        "CREATE INDEX messages_user ON messages(user_uuid, id)",
        "CREATE INDEX messages_eligible ON messages(user_uuid, id) WHERE eligible",
        "CREATE INDEX messages_informative ON messages(user_uuid, id)"
        " WHERE eligible AND informative > 0",
        "CREATE INDEX messages_user_key ON messages(user_uuid, message_key)",
        "CREATE INDEX messages_terms ON messages USING gin (terms)",
        "CREATE TABLE facts (uuid text PRIMARY KEY,"
        " user_uuid text NOT NULL REFERENCES users(uuid) ON DELETE CASCADE,"
        " subject text NOT NULL, predicate text NOT NULL, value text NOT NULL, kind text,"
        " confidence double precision, importance double precision, trust text,"
        " source_keys text NOT NULL, valid_at text NOT NULL, invalid_at text,"
        " created_at text NOT NULL)",
        "CREATE INDEX facts_user ON facts(user_uuid, invalid_at)",
        # Hashed: a note's value may be longer than a B-tree entry can be.
        "CREATE UNIQUE INDEX facts_unique ON facts(user_uuid,"
        " md5(subject || chr(31) || predicate || chr(31) || value || chr(31) || source_keys))",
        "CREATE TABLE idempotency (thread_uuid text NOT NULL REFERENCES threads(uuid)"
        " ON DELETE CASCADE, key text NOT NULL, created_at text NOT NULL,"
        " PRIMARY KEY (thread_uuid, key))",
        "CREATE TABLE templates (uuid text PRIMARY KEY, name text UNIQUE NOT NULL,"
        " template text NOT NULL, created_at text NOT NULL)",
        "CREATE TABLE retrieval_totals (shard integer PRIMARY KEY,"
        " statements bigint NOT NULL, tokens bigint NOT NULL)",
        "INSERT INTO retrieval_totals SELECT s, 0, 0"
        f" FROM generate_series(0, {TOTALS_SHARDS - 1}) s",
        _TOTALS_FUNCTION,
        "CREATE TRIGGER messages_added AFTER INSERT ON messages REFERENCING NEW TABLE AS added"
        " FOR EACH STATEMENT EXECUTE FUNCTION retrieval_count()",
        "CREATE TRIGGER messages_removed AFTER DELETE ON messages"
        " REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION retrieval_count()",
        "CREATE TRIGGER messages_changed AFTER UPDATE ON messages"
        " REFERENCING OLD TABLE AS removed NEW TABLE AS added"
        " FOR EACH STATEMENT EXECUTE FUNCTION retrieval_count()",
    ),
    (
        # A term's weighted frequency in a statement, as FTS5 sums it (``local._lexical``):
        # each occurrence in turn, 1 in the statement (weight A), REPLIED_WEIGHT in the
        # question it replied to (positions after the statement's own).
        "CREATE FUNCTION term_frequency(weights text[]) RETURNS double precision"
        " LANGUAGE plpgsql IMMUTABLE STRICT AS $$ DECLARE tf double precision := 0; w text;"
        " BEGIN FOREACH w IN ARRAY weights LOOP"
        f" tf := tf + CASE WHEN w = 'A' THEN 1.0::float8 ELSE {REPLIED_WEIGHT!r}::float8 END;"
        " END LOOP; RETURN tf; END $$",
        # Included columns: ranking reads the index alone (an index-only scan).
        "CREATE TABLE postings (lexeme bigint NOT NULL, id bigint NOT NULL,"
        " tf double precision NOT NULL, tokens integer NOT NULL,"
        " PRIMARY KEY (lexeme, id) INCLUDE (tf, tokens))",
        # An index-only scan reads the heap for rows on pages not yet marked all-visible:
        # vacuumed after every 20,000 postings (about 1,000 statements), not after a fifth
        # of the table (by default), so only the newest postings cost a heap read.
        "ALTER TABLE postings SET (autovacuum_vacuum_insert_threshold = 20000,"
        " autovacuum_vacuum_insert_scale_factor = 0)",
        "CREATE TABLE term_counts (lexeme bigint PRIMARY KEY, statements integer NOT NULL)",
        _POSTINGS_FUNCTION,
        # The triggers first: their lock waits out writers in flight, and what they commit
        # later is posted by the triggers.
        "CREATE TRIGGER postings_added AFTER INSERT ON messages REFERENCING NEW TABLE AS added"
        " FOR EACH STATEMENT EXECUTE FUNCTION retrieval_postings()",
        "CREATE TRIGGER postings_removed AFTER DELETE ON messages REFERENCING OLD TABLE AS"
        " removed FOR EACH STATEMENT EXECUTE FUNCTION retrieval_postings()",
        "CREATE TRIGGER postings_changed AFTER UPDATE ON messages"
        " REFERENCING OLD TABLE AS removed NEW TABLE AS added"
        " FOR EACH STATEMENT EXECUTE FUNCTION retrieval_postings()",
        f"INSERT INTO postings {_POSTED.format(rows='messages')}",
        "INSERT INTO term_counts SELECT lexeme, count(*) FROM postings GROUP BY 1",
        "DROP INDEX messages_terms",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)
#: Every table a user's memory is in: vacuumed after a forget.
TABLES = (
    "messages",
    "postings",
    "term_counts",
    "facts",
    "idempotency",
    "threads",
    "users",
    "retrieval_totals",
)

#: Server errors that say the database is not there to use now (their SQLSTATE class).
_UNAVAILABLE_CLASSES = ("08", "53", "57", "58", "40")


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat()


def _id(value: str) -> str:
    """An id or a name as a text column holds it: PostgreSQL's text holds no NUL, which an
    application's ids may (never read back: compared only, so only its being one-to-one
    matters)."""
    return value.replace("\\", "\\\\").replace("\x00", "\\0")


def _lexeme(key: bytes, word_stem: str) -> str:
    """A stem as the user's index holds it: a keyed hash, so each user's words are their
    own index terms, and none can be read back without the user's key."""
    return hashlib.blake2b(word_stem.encode(), key=key, digest_size=8).hexdigest()


def _terms(key: bytes, content: str, replied: str | None) -> tuple[int, str]:
    """A statement's length in words and its ``tsvector`` (as text): each word's keyed stem
    at its position, weighted A in the statement and B in the question it replied to."""
    positions: dict[str, list[str]] = {}
    position = 0
    for text, weight in ((content, "A"), (replied or "", "B")):
        for word in words(text):
            position += 1
            lexeme = _lexeme(key, scoped_stem(word))
            positions.setdefault(lexeme, []).append(f"{min(position, MAX_POSITION)}{weight}")
    vector = " ".join(f"'{lexeme}':{','.join(at)}" for lexeme, at in positions.items())
    return position, vector


def _posting(lexeme: str) -> int:
    """A lexeme as ``postings`` and ``term_counts`` hold it: its 64 bits (hex) as a signed
    integer, as ``('x' || lexeme)::bit(64)::bigint`` reads them."""
    return int.from_bytes(bytes.fromhex(lexeme), "big", signed=True)


def _weight(count: int, hits: int) -> float:
    """A term's weight in BM25 as FTS5 gives it: its idf among ``count`` statements, a
    term in more than half of them weighing almost nothing."""
    idf = math.log((count - hits + 0.5) / (hits + 0.5))
    return idf if idf > 0 else 1e-6


#: A term's statements counted at most (``local._counts``): enough for
#: ``split_by_frequency`` to decide, and what its weight is computed from.
COUNTED = 10 * RANKED_ROWS + 1


def _bm25(weight: str, mean: str) -> str:
    """A posting's share of a statement's BM25 for a phrase of ``weight`` (the posting's
    ``tf`` and ``tokens``; ``mean``: the mean statement length): FTS5's formula as the
    store has always computed it, operation for operation, so a score is the same double."""
    k1, b = f"{BM25_K1!r}::float8", f"{BM25_B!r}::float8"
    return (
        f"{weight} * tf * {BM25_K1 + 1!r}::float8 / (tf + {k1} * (1 - {b} + {b} * tokens / {mean}))"
    )


#: When a statement was said.
_SAID = "COALESCE(reference_time, created_at)"
#: A statement as a block shows it: id, the question it replied to, text, when said.
_ROW = f"id, replied, content, {_SAID}"

#: The user's (``$1``) facts replaced by a newer one, the newest change first, ``$2`` at
#: most, of the user's own predicates ``$3`` only when any (``local._replaced``): the
#: replaced fact's sources, when replaced, the replacing fact's sources.
_CHANGED_COLUMNS = "old.source_keys, old.invalid_at, new.source_keys"
_CHANGED = (
    "FROM facts old JOIN facts new"
    " ON new.user_uuid = old.user_uuid AND new.subject = old.subject"
    " AND new.predicate = old.predicate AND new.invalid_at IS NULL"
    " WHERE old.user_uuid = $1 AND old.invalid_at IS NOT NULL"
    " AND (cardinality($3::text[]) = 0"
    " OR (old.subject = 'user' AND old.predicate = ANY($3::text[])))"
    " ORDER BY old.invalid_at DESC LIMIT $2"
)

#: The user's (``$1``) rows, for their newest first (``ORDER BY user_uuid DESC, id DESC``),
#: as a range of one value: so read newest first from the user's index. As an equality it
#: would leave the planner the table's own order (by id) to read them in, filtered, which it
#: takes when it guesses that any user has as many of the newest rows as another; a user
#: whose rows are old would then be found at the end of a walk through all the newer ones.
_OWN = "user_uuid >= $1 AND user_uuid <= $1"

#: What a block needs of the user (``$1``) before ranking, in one statement: the user's
#: key (none: no such user), the current facts, the changed ones (``_CHANGED``, ``$2``),
#: the newest ``$4`` informative statements, the newest ``$5`` statements (the follow-ups'
#: pool, and the recent ones), and the store's statement and token counts. It also sets,
#: for the rest of the transaction, that a statement runs on the plan made for it once per
#: connection: a ranking's plan does not depend on its values (arrays of lexemes), and
#: planning one afresh costs as much as running it (statements whose plan does depend on
#: the user, as this one's does, are planned as PostgreSQL chooses).
_OPENING = f"""
SELECT (SELECT term_key FROM users WHERE uuid = $1),
  ARRAY(SELECT ROW(subject, predicate, value, valid_at) FROM facts
    WHERE user_uuid = $1 AND invalid_at IS NULL ORDER BY importance DESC, valid_at DESC
    LIMIT 1000),
  ARRAY(SELECT ROW({_CHANGED_COLUMNS}) {_CHANGED}),
  ARRAY(SELECT ROW(id, informative) FROM messages
    WHERE {_OWN} AND eligible AND informative > 0 ORDER BY user_uuid DESC, id DESC LIMIT $4),
  ARRAY(SELECT ROW({_ROW}) FROM messages
    WHERE {_OWN} AND eligible ORDER BY user_uuid DESC, id DESC LIMIT $5),
  (SELECT ROW(sum(statements)::bigint, sum(tokens)::bigint) FROM retrieval_totals),
  set_config('plan_cache_mode', 'force_generic_plan', true)"""

#: A newest-first query's postings (``q.lexemes``, at most ``COMMON_TERMS``), merged newest
#: first: each branch a backward scan of the index, read only as far as the merge needs.
_MERGED = " UNION ALL ".join(
    f"(SELECT id, {n} AS o, tf, tokens FROM postings WHERE lexeme = q.lexemes[{n}]"
    " ORDER BY id DESC)"
    for n in range(1, COMMON_TERMS + 1)
)

#: The best ``$8`` statements of each of a batch of queries, in one statement. A query's
#: phrases (``$1``: its number, ``$2``: the lexeme, ``$3``: the term's weight, ``$4``:
#: whether it selects the rows) are summed in their order (``o``), a phrase given twice
#: weighing twice; every posting is read from the index alone.
#:
#: A query of ``$5`` ranks the newest ``$7`` rows holding any of its terms (ties: the
#: newer first): its postings merged newest first (a row's in phrase order), each row's
#: summed as they come (they are neighbours in the merge), the merge stopped at the
#: ``$7``-th row, and only the best ``$8`` sorted.
#: The others rank the rows holding a selecting phrase (ties: the older first, as FTS5
#: walks them), the other phrases' postings read from the oldest of these on, the rows
#: reaching each row's sum sorted by phrase (cheaper than a sort in each row's sum).
#: ``OFFSET 0`` keeps each phrase's scan a scan of the index, however few rows the planner
#: expects of the phrases.
#:
#: The rows ranked (the user's eligible statements: ``$9``), and those of ``$10``, come
#: with the rankings, as ``_ROW``s, and with ``$11`` the counts of the words they hold
#: (``term_counts``): no statement of its own to read them, nor to count the words the
#: next rankings are asked for (a hop's terms are the words of a statement ranked here).
_RANKED = f"""
WITH phrase AS MATERIALIZED (
  SELECT * FROM unnest($1::integer[], $2::bigint[], $3::float8[], $4::boolean[])
  WITH ORDINALITY AS p(query, lexeme, weight, selects, o)),
picked AS MATERIALIZED (
  SELECT DISTINCT p.query, t.id FROM phrase p
  CROSS JOIN LATERAL (SELECT id FROM postings WHERE lexeme = p.lexeme OFFSET 0) t
  WHERE p.selects AND p.query <> ALL($5::integer[])),
floor AS (SELECT query, min(id) AS id FROM picked GROUP BY query),
hit AS (
  SELECT p.query, t.id, p.o, p.weight, t.tf, t.tokens
  FROM phrase p JOIN floor f ON f.query = p.query
  CROSS JOIN LATERAL (SELECT id, tf, tokens FROM postings
    WHERE lexeme = p.lexeme AND id >= f.id OFFSET 0) t
  JOIN picked c ON c.query = p.query AND c.id = t.id),
scored AS (
  SELECT query, id, sum(share) AS score
  FROM (SELECT query, id, {_bm25("weight", "$6")} AS share FROM hit ORDER BY query, id, o) s
  GROUP BY query, id),
placed AS (
  SELECT query, id, row_number() OVER (PARTITION BY query ORDER BY score DESC, id) AS place
  FROM scored),
newest AS (
  SELECT query, array_agg(lexeme ORDER BY o) AS lexemes, array_agg(weight ORDER BY o) AS weights
  FROM phrase WHERE query = ANY($5::integer[]) GROUP BY query),
ranked AS (
  SELECT query, array_agg(id ORDER BY place) AS ids FROM placed WHERE place <= $8 GROUP BY query
  UNION ALL
  SELECT q.query, ARRAY(
    SELECT id FROM (
      SELECT id, sum(share) AS score FROM (
        SELECT id, o, {_bm25("q.weights[o]", "$6")} AS share
        FROM ({_MERGED} ORDER BY id DESC, o) m) r
      GROUP BY id ORDER BY id DESC LIMIT $7) s
    ORDER BY score DESC, id DESC LIMIT $8)
  FROM newest q),
shown AS MATERIALIZED (
  SELECT id, replied, content, {_SAID} AS said, terms FROM messages
  WHERE id = ANY(ARRAY(SELECT unnest(ids) FROM ranked) || $10::bigint[])
    AND user_uuid = $9 AND eligible)
SELECT ARRAY(SELECT ROW(query, ids) FROM ranked),
  ARRAY(SELECT ROW(id, replied, content, said) FROM shown),
  ARRAY(SELECT ROW(w.lexeme, (SELECT statements FROM term_counts WHERE lexeme = w.lexeme))
    FROM (SELECT DISTINCT ('x' || l)::bit(64)::bigint AS lexeme
      FROM shown, unnest(tsvector_to_array(terms)) l WHERE $11) w)"""

#: BM25 of the statements ``$3`` for the phrases ``$1`` (weights ``$2``), in their order:
#: a posting looked up for each statement and phrase.
_SCORED = f"""
SELECT id, sum(share) FROM (
  SELECT t.id, {_bm25("weight", "$4")} AS share
  FROM unnest($1::bigint[], $2::float8[]) WITH ORDINALITY AS p(lexeme, weight, o)
  CROSS JOIN unnest($3::bigint[]) AS c(id)
  JOIN postings t ON t.lexeme = p.lexeme AND t.id = c.id
  ORDER BY t.id, p.o) s
GROUP BY id"""


@dataclass
class _Ranker:
    """One read's view of a user's statements (``ranking.StatementSource``): BM25 as FTS5
    computes it (``local._lexical``), in the database, over the user's postings; the
    statistics read once per read."""

    db: Db
    user_uuid: str
    key: bytes
    frequency: dict[str, int] = field(default_factory=dict)
    totals: tuple[int, float] | None = None
    rows: dict[int, tuple[str | None, str, str]] = field(default_factory=dict)
    """(replied, text, said at) of the user's statements read in this read."""
    wanted: set[int] = field(default_factory=set)
    """Statements whose rows the next ranking reads with it."""
    posted: dict[int, int] | None = None
    """Lexeme -> statements holding it, of the words of the statements the first ranking
    ranked (None until then): the hops' terms are counted without asking."""

    def total(self, statements: int | None, tokens: int | None) -> None:
        """The store's statistics, as read (sums: None for an empty store)."""
        count = statements or 0
        self.totals = (count, (tokens or 0) / count if count else 0.0)

    def posting(self, term: str) -> int:
        return _posting(_lexeme(self.key, scoped_stem(term)))

    async def counts(self, terms: Sequence[str]) -> dict[str, int]:
        """Rows of the user holding each term, up to ``COUNTED`` (the user's rows alone:
        the lexemes are theirs); the store's statistics with the first."""
        if self.posted is not None:
            for term in terms:
                if term not in self.frequency and (n := self.posted.get(self.posting(term))):
                    self.frequency[term] = min(n, COUNTED)
        missing = [t for t in dict.fromkeys(terms) if t not in self.frequency]
        if missing or self.totals is None:
            row = await self.db.fetchrow(
                "SELECT (SELECT array_agg(coalesce(c.statements, 0) ORDER BY u.o)"
                " FROM unnest($1::bigint[]) WITH ORDINALITY AS u(lexeme, o)"
                " LEFT JOIN term_counts c ON c.lexeme = u.lexeme),"
                " sum(statements)::bigint, sum(tokens)::bigint FROM retrieval_totals",
                [self.posting(t) for t in missing],
            )
            assert row is not None  # an aggregate's one row
            found = row[0] or []
            self.frequency.update(zip(missing, (min(n, COUNTED) for n in found), strict=True))
            self.total(row[1], row[2])
        return {term: self.frequency[term] for term in terms}

    async def statistics(self) -> tuple[int, float]:
        """The store's statement count and mean statement length (FTS5's, for the file)."""
        if self.totals is None:
            await self.counts([])
        assert self.totals is not None
        return self.totals

    async def scores(self, ids: Sequence[int], terms: Sequence[str]) -> dict[int, float]:
        """Id -> BM25 of the statements ``ids`` holding any of ``terms``."""
        hits = await self.counts(terms)
        count, mean = await self.statistics()
        rows = await self.db.fetch(
            _SCORED,
            [self.posting(t) for t in terms],
            [_weight(count, hits[t]) for t in terms],
            list(ids),
            mean,
        )
        return {int(r[0]): float(r[1]) for r in rows}

    async def lexical(self, queries: Sequence[Sequence[str]]) -> list[list[int]]:
        """``local._lexical`` for each of ``queries``, in one statement: the user's
        statements ranked by BM25 for its terms, best first, bounded to about
        ``RANKED_ROWS`` rows whatever the history's length."""
        frequency = await self.counts([t for terms in queries for t in terms])
        count, mean = await self.statistics()
        phrases: list[tuple[int, str, bool]] = []
        newest: list[int] = []
        for number, terms in enumerate(queries):
            selective, boosts = split_by_frequency(terms, frequency, RANKED_ROWS)
            if selective:
                doubled = [*selective, *selective, *boosts] if boosts else selective
                phrases += [(number, t, i < 2 * len(selective)) for i, t in enumerate(doubled)]
            elif found := sorted((t for t in terms if frequency[t]), key=frequency.__getitem__)[
                :COMMON_TERMS
            ]:
                # Every term is common: the user's newest matches are ranked.
                newest.append(number)
                phrases += [(number, t, True) for t in found]
        if not phrases:
            return [[] for _ in queries]
        wanted, self.wanted = [i for i in self.wanted if i not in self.rows], set()
        answer = await self.db.fetchrow(
            _RANKED,
            [number for number, _, _ in phrases],
            [self.posting(t) for _, t, _ in phrases],
            [_weight(count, frequency[t]) for _, t, _ in phrases],
            [selects for _, _, selects in phrases],
            newest,
            mean,
            RANKED_ROWS,
            RELEVANT,
            self.user_uuid,
            wanted,
            self.posted is None,
        )
        assert answer is not None  # one row of arrays
        ranked = {number: list(ids) for number, ids in answer[0]}
        self.rows.update((r[0], (r[1], r[2], r[3])) for r in answer[1])
        if self.posted is None:
            self.posted = dict(answer[2])
        return [ranked.get(number, []) for number in range(len(queries))]

    async def read(self, ids: Sequence[int]) -> None:
        """The rows of those of ``ids`` not read yet (and of the ``wanted``)."""
        if missing := [i for i in dict.fromkeys([*ids, *self.wanted]) if i not in self.rows]:
            for r in await self.db.fetch(
                f"SELECT {_ROW} FROM messages WHERE id = ANY($1::bigint[]) AND user_uuid = $2"
                " AND eligible",
                missing,
                self.user_uuid,
            ):
                self.rows[r[0]] = (r[1], r[2], r[3])
        self.wanted = set()

    async def contents(self, ids: Sequence[int]) -> dict[int, str]:
        await self.read(ids)
        return {i: self.rows[i][1] for i in ids if i in self.rows}

    async def dense(self, query: str) -> list[int]:
        return []  # no embeddings here: the lexical rankings alone, as on a local store without

    async def constraints(self) -> list[int]:
        """``local._constraints``."""
        facts = await self.db.fetch(
            "SELECT source_keys FROM facts WHERE user_uuid = $1 AND subject = 'user'"
            " AND invalid_at IS NULL AND predicate = ANY($2::text[])"
            " ORDER BY importance DESC, valid_at DESC LIMIT $3",
            self.user_uuid,
            sorted(CONSTRAINTS),
            MAX_CONSTRAINTS,
        )
        keys = constraint_keys(r[0] for r in facts)
        if not keys:
            return []
        rows = await self.db.fetch(
            "SELECT id, message_key FROM messages WHERE user_uuid = $1 AND eligible"
            " AND message_key = ANY($2::text[])",
            self.user_uuid,
            keys,
        )
        by_key = {r["message_key"]: r["id"] for r in rows}
        return [by_key[key] for key in keys if key in by_key]

    async def changes(self, predicates: Sequence[str]) -> list[int]:
        return list(await _replaced(self.db, self.user_uuid, predicates))


class PostgresBackend(MemoryBackend):
    name = "postgres"
    capabilities = Capabilities(
        extracts_facts=False,
        ignores_roles=False,
        async_deletes=False,
        ingests_async=False,
        replays_thread_creates=True,
    )

    def __init__(
        self,
        url: str,
        *,
        schema: str = "afterthought",
        max_chars: int = 4000,
        upgrade: bool = True,
        pool_size: int = 10,
        embedding_model: str | None = None,
    ) -> None:
        """``url``: ``postgresql://…`` (never logged: it may hold a password). ``schema``:
        where the tables are (created on first use). ``max_chars``, ``upgrade``: as for
        :class:`~afterthought.backends.local.LocalBackend`. ``pool_size``: connections
        per event loop at most. ``embedding_model``: the one configured, which this store
        does not use (said at start)."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", schema):
            raise ValueError("schema must be a lower-case SQL identifier")
        self._url = url
        self.schema = schema
        self.max_chars = max_chars
        self.upgrade = upgrade
        self.pool_size = pool_size
        self.embedding_model = embedding_model
        self._pools: PerLoop[_LoopPool] = PerLoop(_LoopPool)
        self._said_retrieval = False

    @property
    def where(self) -> str:
        """The store, for people: host, port, database and schema (no user, no password)."""
        return f"PostgreSQL at {database_address(self._url)} ({self.schema})"

    # --- connections ------------------------------------------------------------------

    async def _pool(self) -> asyncpg.Pool:
        held = self._pools.get()
        if held.pool is not None:
            return held.pool
        async with held.lock:
            if held.pool is None:
                held.pool = await self._open()
        return held.pool

    async def _open(self) -> asyncpg.Pool:
        try:
            import asyncpg
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                "backend postgres needs the postgres extra:"
                " pip install 'afterthought-adk[postgres]'",
                name=exc.name,
            ) from None
        try:
            pool = await asyncpg.create_pool(
                self._url,
                min_size=1,
                max_size=self.pool_size,
                server_settings={"search_path": self.schema, "application_name": "afterthought"},
                # A session is never changed (no SET, LISTEN or session lock): a connection
                # goes back to the pool without a statement to reset it (an open
                # transaction is still rolled back).
                reset=_unchanged,
            )
        except Exception as exc:  # refused, unknown host, bad password, no such database
            raise connect_failure(exc, self.where) from None
        try:
            async with pool.acquire() as db:
                await self._migrate(db)
        except BaseException:
            await pool.close()
            raise
        return pool

    async def _migrate(self, db: Db) -> None:
        """Bring the schema to ``SCHEMA_VERSION``, once: the first process to take the
        advisory lock applies what is missing, each migration in the transaction that
        records it; the others find it done. Without ``upgrade`` (an agent), an older store
        that holds messages is "unavailable" until a worker has upgraded it."""
        version = await self._version(db)
        if version >= SCHEMA_VERSION:
            return
        if not self.upgrade and version > 0:
            raise BackendError("unavailable", code="schema_upgrade_pending")
        async with db.transaction():
            await db.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                f"afterthought.migrate:{self.schema}",
            )
            await db.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            await db.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = await db.fetchval("SELECT coalesce(max(version), 0) FROM schema_migrations")
            for number, statements in enumerate(MIGRATIONS, start=1):
                if number <= done:
                    continue
                for sql in statements:
                    await db.execute(sql)
                await db.execute("INSERT INTO schema_migrations (version) VALUES ($1)", number)
                log.info("postgres store migrated version=%d schema=%s", number, self.schema)

    async def _version(self, db: Db) -> int:
        found = await db.fetchval(
            "SELECT to_regclass(quote_ident($1) || '.schema_migrations') IS NOT NULL", self.schema
        )
        if not found:
            return 0
        return int(await db.fetchval("SELECT coalesce(max(version), 0) FROM schema_migrations"))

    @asynccontextmanager
    async def _connection(self, timeout: float | None = None) -> AsyncIterator[Db]:
        """A connection of the pool, failures classified; ``timeout``: the whole use."""
        import asyncpg

        try:
            async with asyncio.timeout(timeout):
                pool = await self._pool()
                async with pool.acquire() as db:
                    yield db
        except TimeoutError:
            raise BackendError("timeout", code="postgres") from None
        except BackendError:
            raise
        except asyncpg.PostgresError as exc:
            raise _classified(exc) from None
        except (OSError, asyncpg.InterfaceError) as exc:
            raise BackendError("unavailable", code=type(exc).__name__) from None

    async def _run(self, work: Callable[[Db], Awaitable[T]], timeout: float | None = None) -> T:
        """``work`` in one transaction."""
        async with self._connection(timeout) as db, db.transaction():
            return await work(db)

    # --- users and threads ------------------------------------------------------------

    async def ensure_user(
        self, *, zep_user_id: str, first_name: str | None = None, last_name: str | None = None
    ) -> tuple[UserRef, bool]:
        async def work(db: Db) -> tuple[UserRef, bool]:
            inserted = await db.fetchrow(
                "INSERT INTO users VALUES ($1, $2, $3, $4, $5, $6, $7)"
                " ON CONFLICT (user_id) DO NOTHING RETURNING uuid, graph_uuid",
                str(uuid.uuid4()),
                _id(zep_user_id),
                str(uuid.uuid4()),
                first_name and _id(first_name),
                last_name and _id(last_name),
                os.urandom(16),
                _now(),
            )
            row = inserted or await db.fetchrow(
                "SELECT uuid, graph_uuid FROM users WHERE user_id = $1", _id(zep_user_id)
            )
            if row is None:  # deleted between the two statements (a forget): asked again
                raise BackendError("conflict", status=409, code="user deleted meanwhile")
            return UserRef(user_uuid=row["uuid"], graph_uuid=row["graph_uuid"]), bool(inserted)

        return await self._run(work)

    async def find_user(self, *, zep_user_id: str) -> UserRef | None:
        async def work(db: Db) -> UserRef | None:
            row = await db.fetchrow(
                "SELECT uuid, graph_uuid FROM users WHERE user_id = $1", _id(zep_user_id)
            )
            return UserRef(row["uuid"], row["graph_uuid"]) if row else None

        return await self._run(work)

    async def create_thread(self, *, user: UserRef, idempotency_key: str) -> str:
        async def work(db: Db) -> str:
            if not await db.fetchval("SELECT 1 FROM users WHERE uuid = $1", user.user_uuid):
                raise BackendError("not_found", status=404, code="user")
            await db.execute(
                "INSERT INTO threads VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                str(uuid.uuid4()),
                user.user_uuid,
                _id(idempotency_key),
                _now(),
            )
            row = await db.fetchrow(
                "SELECT uuid, user_uuid FROM threads WHERE idempotency_key = $1",
                _id(idempotency_key),
            )
            if row is None:  # the user's forget deleted it meanwhile
                raise BackendError("not_found", status=404, code="user")
            if row["user_uuid"] != user.user_uuid:  # never hand one user's thread to another
                raise BackendError("conflict", status=409, code="thread of another user")
            return str(row["uuid"])

        return await self._run(work)

    async def thread_owner(self, *, thread_uuid: str) -> str | None:
        async def work(db: Db) -> str | None:
            found = await db.fetchval("SELECT user_uuid FROM threads WHERE uuid = $1", thread_uuid)
            return str(found) if found is not None else None

        return await self._run(work)

    # --- messages ---------------------------------------------------------------------

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
        if any(repair_text(m.content)[1] for m in messages):
            raise BackendError("bad_request", status=400, code="invalid_unicode")
        if any("\x00" in m.content for m in messages):  # PostgreSQL text holds no NUL
            raise BackendError("bad_request", status=400, code="nul_character")
        verdicts = await asyncio.to_thread(
            lambda: [_verdict(m.role, m.content, m.role not in ignore_roles) for m in messages]
        )

        async def work(db: Db) -> str | None:
            user = await self._insert(
                db, thread_uuid, idempotency_key, messages, verdicts, ignore_roles
            )
            context = None
            if return_context:
                query = " ".join(m.content for m in messages if m.role == "user")
                context = await self._context(db, user, query, self.max_chars)
            check = LAST_CHECK.get()
            if check is not None:  # the worker's lease, checked as late as can be: at commit
                check()
            return context

        return await self._run(work, timeout)

    async def _insert(
        self,
        db: Db,
        thread_uuid: str,
        idempotency_key: str,
        messages: Sequence[OutgoingMessage],
        verdicts: Sequence[_Verdict],
        ignore_roles: Sequence[str],
    ) -> UserRef:
        """Store a batch once (its call's key) in two statements, its eligible statements
        indexed in it (as ``LocalBackend._insert``); a message whose key the thread holds
        adds nothing. The thread's owner, returned, cannot be deleted before commit.

        One user's writers take turns (a lock of the user's, held to commit): ids are
        numbered as the batches commit, so a reader of the user's messages after an id
        (synthesis, ``user_messages``) never reads past one still being written."""
        given = [m.metadata.get(MESSAGE_KEY_FIELD) for m in messages]
        found = await db.fetchrow(
            "SELECT t.user_uuid, u.graph_uuid, u.term_key,"
            " pg_advisory_xact_lock(hashtextextended('afterthought.messages:' || t.user_uuid, 0)),"
            " (SELECT ROW(role, content, clean)"
            " FROM messages WHERE thread_uuid = $1 ORDER BY id DESC LIMIT 1),"
            " ARRAY(SELECT ROW(message_key, content) FROM messages WHERE thread_uuid = $1"
            " AND message_key = ANY($2::text[]))"
            " FROM threads t JOIN users u ON u.uuid = t.user_uuid WHERE t.uuid = $1"
            " FOR SHARE OF t",
            thread_uuid,
            [str(k) for k in given if k is not None],
        )
        if not found:
            raise BackendError("not_found", status=404, code="thread")
        user = UserRef(found[0], found[1])
        previous: tuple[str, str, bool] | None = found[4]
        stored = dict(found[5])
        rows: list[tuple[object, ...]] = []
        for m, verdict, message_key in zip(messages, verdicts, given, strict=True):
            replied = _reply_context(previous) if verdict.eligible else None
            ingested = m.role not in ignore_roles
            # A turn not ingested (an ignored role) is no question a statement answers.
            previous = (m.role or "", m.content, verdict.clean and ingested)
            if message_key is not None:
                message_key = str(message_key)
                # Another text under a stored key is another message (local._stored_key).
                if stored.get(message_key, m.content) != m.content:
                    message_key = f"{message_key}#{checksum(m.content)}"
            tokens, terms = _terms(found[2], m.content, replied) if verdict.eligible else (0, None)
            rows.append(
                (
                    str(uuid.uuid4()),
                    message_key,
                    m.role or "",
                    m.name and _id(m.name),
                    m.content,
                    json.dumps(dict(m.metadata)),
                    m.reference_time,
                    ingested,
                    _now(),
                    verdict.clean,
                    verdict.eligible,
                    verdict.informative,
                    replied,
                    tokens,
                    terms,
                )
            )
        # The call's key first: another worker's transaction with the same key waits here
        # until it commits (then this one adds nothing) or rolls back (then this one stores
        # the batch).
        await db.execute(
            "WITH new AS (INSERT INTO idempotency VALUES ($1, $3, $4) ON CONFLICT DO NOTHING"
            " RETURNING 1)"
            " INSERT INTO messages (uuid, thread_uuid, message_key, role, name, content,"
            " metadata, reference_time, ingested, created_at, user_uuid, clean, eligible,"
            " informative, replied, tokens, terms)"
            " SELECT u, $1, k, r, n, c, md, rt, i, ca, $2, cl, e, inf, rp, tk, tv::tsvector"
            " FROM unnest($5::text[], $6::text[], $7::text[], $8::text[], $9::text[],"
            " $10::text[], $11::text[], $12::boolean[], $13::text[], $14::boolean[],"
            " $15::boolean[], $16::integer[], $17::text[], $18::integer[], $19::text[])"
            " WITH ORDINALITY AS b(u, k, r, n, c, md, rt, i, ca, cl, e, inf, rp, tk, tv, o)"
            " WHERE EXISTS (SELECT FROM new)"
            " ORDER BY o ON CONFLICT (thread_uuid, message_key) DO NOTHING",
            thread_uuid,
            user.user_uuid,
            _id(idempotency_key),
            _now(),
            *(list(column) for column in zip(*rows, strict=True))
            if rows
            else ([] for _ in range(15)),
        )
        return user

    async def remove_copy(self, *, thread_uuid: str, copy: LateCopy, last_chance: bool) -> str:
        """Deleted (as on the local store)."""

        async def work(db: Db) -> None:
            await db.execute(
                "DELETE FROM messages WHERE uuid = $1 AND thread_uuid = $2", copy.uuid, thread_uuid
            )

        await self._run(work)
        await self._scrub()
        return "deleted"

    async def recent_messages(
        self, *, thread_uuid: str, limit: int, timeout: float | None = None
    ) -> list[StoredMessage]:
        found, _ = await self._page(thread_uuid, below=None, limit=limit, timeout=timeout)
        return found

    async def message_page(
        self, *, thread_uuid: str, cursor: str | None, timeout: float | None = None
    ) -> tuple[list[StoredMessage], str | None]:
        below = int(cursor) if cursor else None
        found, last = await self._page(
            thread_uuid, below=below, limit=MESSAGE_PAGE, timeout=timeout
        )
        return found, (str(last) if len(found) == MESSAGE_PAGE else None)

    async def _page(
        self, thread_uuid: str, *, below: int | None, limit: int, timeout: float | None
    ) -> tuple[list[StoredMessage], int | None]:
        async def work(db: Db) -> tuple[list[StoredMessage], int | None]:
            rows = await db.fetch(
                "SELECT uuid, role, content, metadata, id FROM messages WHERE thread_uuid = $1"
                " AND id < $2 ORDER BY id DESC LIMIT $3",
                thread_uuid,
                below if below is not None else 2**63 - 1,
                limit,
            )
            found = [StoredMessage(r[0], r[1], r[2], json.loads(r[3])) for r in rows]
            return found, (rows[-1]["id"] if rows else None)

        return await self._run(work, timeout)

    async def user_messages(
        self, *, user: UserRef, after: str | None, limit: int
    ) -> tuple[list[HistoryMessage], str | None]:
        async def work(db: Db) -> tuple[list[HistoryMessage], str | None]:
            rows = await db.fetch(
                "SELECT id, message_key, role, content, reference_time FROM messages"
                " WHERE user_uuid = $1 AND id > $2 ORDER BY id LIMIT $3",
                user.user_uuid,
                int(after or 0),
                limit,
            )
            found = [HistoryMessage(r[1] or str(r[0]), r[2], r[3], r[4] or "") for r in rows]
            return found, (str(rows[-1]["id"]) if rows else None)

        return await self._run(work)

    # --- reading memory ---------------------------------------------------------------

    async def get_context(
        self,
        *,
        user: UserRef,
        query: str,
        max_chars: int,
        timeout: float,
        template_uuid: str | None = None,
    ) -> str:
        async def work(db: Db) -> str:
            return await self._context(db, user, query, max_chars, template_uuid)

        return await self._read(work, timeout)

    async def _read(self, work: Callable[[Db], Awaitable[T]], timeout: float) -> T:
        """A read in one snapshot (a forget committed meanwhile is seen whole or not at
        all), given up on after ``timeout``: its query is cancelled in the server."""
        async with (
            self._connection(timeout) as db,
            db.transaction(isolation="repeatable_read", readonly=True),
        ):
            return await work(db)

    async def _context(
        self,
        db: Db,
        user: UserRef,
        query: str,
        max_chars: int,
        template_uuid: str | None = None,
    ) -> str:
        """The user's block for ``query`` (nothing when there is no such user)."""
        opening = await db.fetchrow(
            _OPENING, user.user_uuid, CHANGED_FACTS, [], INFORMATIVE_POOL, FOLLOW_UP_POOL
        )
        if opening is None or opening[0] is None:
            return ""
        facts = [(statement(r[0], r[1], r[2]), r[3]) for r in opening[1]]
        if template_uuid is None:
            ranker = _Ranker(db, user.user_uuid, opening[0])
            ranker.total(*opening[5])
            statements = await self._statements(ranker, opening, query)
            return render_block(fact_lines(facts), statements, max_chars)
        found = await db.fetchval("SELECT template FROM templates WHERE uuid = $1", template_uuid)
        if found is None:
            raise BackendError("not_found", status=404, code="template")
        return render_template(found, facts, max_chars, self.name)

    @staticmethod
    async def _statements(ranker: _Ranker, opening: asyncpg.Record, query: str) -> list[Statement]:
        """``LocalBackend._statements`` for a block, from what ``_OPENING`` read: the rows
        of the informative and the changed statements are read with the first ranking."""
        replaced = await _changed_statements(ranker.db, ranker.user_uuid, opening[2])
        informative = informative_order([(r[0], r[1]) for r in opening[3]])
        pool = {r[0]: (r[1], r[2], r[3]) for r in opening[4]}
        ranker.rows.update(pool)
        ranker.wanted.update([*replaced, *informative])
        recent = list(pool)[:RECENT]
        relevant = await ranking.relevant(ranker, query)
        ids = list(dict.fromkeys([*relevant, *replaced, *informative, *recent]))
        if not ids:
            return []
        await ranker.read(ids)
        # The candidates' rows, and the user's newest statements as the follow-ups' pool.
        rows = {i: ranker.rows[i] for i in ids if i in ranker.rows} | pool
        return assemble_statements(ids, rows, replaced, None)

    async def search(
        self, *, graph_uuid: str, request: SearchRequest, timeout: float
    ) -> list[SearchHit]:
        """As on the local store: facts for ``edges``, statements for ``episodes``, the
        block for ``context``; nothing for the scopes the store does not have."""

        async def work(db: Db) -> list[SearchHit]:
            user = await db.fetchrow(
                "SELECT uuid, term_key FROM users WHERE graph_uuid = $1 OR uuid = $1", graph_uuid
            )
            if user is None:
                return []
            if request.scope == "context":
                ref = UserRef(user["uuid"], graph_uuid)
                text = await self._context(db, ref, request.query, self.max_chars)
                return [SearchHit(uuid="context", text=text)] if text else []
            if request.scope == "edges":
                rows = await db.fetch(
                    "SELECT uuid, subject, predicate, value, valid_at FROM facts"
                    " WHERE user_uuid = $1 AND invalid_at IS NULL ORDER BY valid_at DESC",
                    user["uuid"],
                )
                return fact_hits([tuple(r) for r in rows], request.query, request.limit)
            if request.scope == "episodes":
                ranker = _Ranker(db, user["uuid"], user["term_key"])
                return await self._said(ranker, request.query, request.limit)
            return []

        return await self._read(work, timeout)

    @staticmethod
    async def _said(ranker: _Ranker, query: str, limit: int) -> list[SearchHit]:
        """``LocalBackend._said`` (without dense recall)."""
        terms = query_terms(query)
        (ranked,) = await ranker.lexical([terms])
        if not ranked:
            return []
        found = await ranker.scores(ranked, terms)
        scores = {message_id: match_score(found.get(message_id, 0.0)) for message_id in ranked}
        rows = await ranker.db.fetch(
            "SELECT id, uuid, content, COALESCE(reference_time, created_at) FROM messages"
            " WHERE id = ANY($1::bigint[]) AND user_uuid = $2 AND eligible",
            ranked,
            ranker.user_uuid,
        )
        return said_hits([tuple(r) for r in rows], scores, ranked, limit)

    # --- templates --------------------------------------------------------------------

    async def create_template(self, *, name: str, template: str) -> str:
        async def work(db: Db) -> str:
            await db.execute(
                "INSERT INTO templates VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING",
                str(uuid.uuid4()),
                name,
                template,
                _now(),
            )
            return str(await db.fetchval("SELECT uuid FROM templates WHERE name = $1", name))

        return await self._run(work)

    async def get_template(self, template_uuid: str) -> tuple[str, str]:
        async def work(db: Db) -> tuple[str, str]:
            row = await db.fetchrow(
                "SELECT name, template FROM templates WHERE uuid = $1", template_uuid
            )
            if row is None:
                raise BackendError("not_found", status=404, code="template")
            return str(row[0]), str(row[1])

        return await self._run(work)

    async def update_template(self, template_uuid: str, *, name: str, template: str) -> None:
        async def work(db: Db) -> None:
            await db.execute(
                "UPDATE templates SET name = $1, template = $2 WHERE uuid = $3",
                name,
                template,
                template_uuid,
            )

        await self._run(work)

    async def delete_template(self, template_uuid: str) -> None:
        async def work(db: Db) -> None:
            await db.execute("DELETE FROM templates WHERE uuid = $1", template_uuid)

        await self._run(work)

    # --- facts ------------------------------------------------------------------------

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
        async def work(db: Db) -> None:
            await db.execute(
                "INSERT INTO facts (uuid, user_uuid, subject, predicate, value, kind,"
                " confidence, importance, trust, source_keys, valid_at, created_at)"
                " VALUES ($1, $2, 'user', 'noted', $3, 'note', 1.0, 0.5, $4, $5, $6, $7)"
                " ON CONFLICT DO NOTHING",
                str(uuid.uuid4()),
                user.user_uuid,
                text,
                trust,
                json.dumps([key]),
                reference_time,
                _now(),
            )

        await self._run(work)

    async def list_facts(self, *, user: UserRef) -> list[StoredFact]:
        async def work(db: Db) -> list[StoredFact]:
            rows = await db.fetch(
                "SELECT uuid, subject, predicate, value, kind, importance, trust, valid_at,"
                " invalid_at, source_keys FROM facts WHERE user_uuid = $1 ORDER BY valid_at",
                user.user_uuid,
            )
            return [stored_fact(r) for r in rows]

        return await self._run(work)

    async def write_facts(
        self, *, user: UserRef, add: Sequence[Fact], invalidate: Sequence[str], at: str
    ) -> None:
        async def work(db: Db) -> None:  # one transaction: all or nothing
            # Held until commit: a forget of the user waits, or went first (then 404).
            if not await db.fetchval(
                "SELECT 1 FROM users WHERE uuid = $1 FOR SHARE", user.user_uuid
            ):
                raise BackendError("not_found", status=404, code="user")
            for fact_uuid in invalidate:
                await db.execute(
                    "UPDATE facts SET invalid_at = $1 WHERE uuid = $2 AND user_uuid = $3"
                    " AND invalid_at IS NULL",
                    at,
                    fact_uuid,
                    user.user_uuid,
                )
            for fact in add:
                await db.execute(
                    "INSERT INTO facts (uuid, user_uuid, subject, predicate, value, kind,"
                    " confidence, importance, trust, source_keys, valid_at, created_at)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
                    " ON CONFLICT DO NOTHING",
                    str(uuid.uuid4()),
                    user.user_uuid,
                    fact.subject,
                    fact.predicate,
                    fact.value,
                    fact.kind,
                    fact.confidence,
                    fact.importance,
                    fact.trust,
                    json.dumps(sorted(fact.source_keys)),
                    fact.valid_at or at,
                    _now(),
                )

        await self._run(work)

    # --- forgetting -------------------------------------------------------------------

    async def delete_memory(self, *, user: UserRef, memory_uuid: str) -> bool:
        """As ``LocalBackend.delete_memory``, in one transaction: a fact with the messages
        it was read from, the questions kept beside answers that name its value, the
        assistant's replies that repeat it (``local.repeating``), and what the index held of
        each; a message id deletes that message."""

        async def work(db: Db) -> bool:
            found = await db.fetchrow(
                "SELECT source_keys, value, predicate FROM facts"
                " WHERE uuid = $1 AND user_uuid = $2",
                memory_uuid,
                user.user_uuid,
            )
            sources: list[str] = json.loads(found[0]) if found else []
            key = await db.fetchval("SELECT term_key FROM users WHERE uuid = $1", user.user_uuid)
            if found and key is not None:
                for answer in await _asked_about(db, user.user_uuid, found[1]):
                    await _drop_reply(db, key, answer)
                said = await db.fetch(
                    "SELECT content FROM messages WHERE user_uuid = $1 AND role != 'assistant'"
                    " AND message_key = ANY($2::text[])",
                    user.user_uuid,
                    sources,
                )
                replies = await db.fetch(
                    "SELECT id, content FROM messages WHERE user_uuid = $1 AND role = 'assistant'",
                    user.user_uuid,
                )
                for reply in repeating(
                    [r[0] for r in said],
                    [(r[0], r[1]) for r in replies],
                    predicate=found[2],
                    value=found[1],
                ):
                    await _unlink_reply(db, key, reply)
                    await db.execute("DELETE FROM messages WHERE id = $1", reply)
            facts = await db.execute(
                "DELETE FROM facts WHERE uuid = $1 AND user_uuid = $2", memory_uuid, user.user_uuid
            )
            selected = "user_uuid = $1 AND (uuid = $2 OR message_key = ANY($3::text[]))"
            arguments = (user.user_uuid, memory_uuid, sources)
            if key is not None:
                for row in await db.fetch(
                    f"SELECT id FROM messages WHERE role = 'assistant' AND {selected}", *arguments
                ):
                    await _unlink_reply(db, key, row[0])
            messages = await db.execute(f"DELETE FROM messages WHERE {selected}", *arguments)
            return _count(facts) + _count(messages) > 0

        deleted = await self._run(work)
        await self._scrub()
        return deleted

    async def delete_user(self, *, user: UserRef) -> None:
        async def work(db: Db) -> None:
            await db.execute("DELETE FROM users WHERE uuid = $1", user.user_uuid)

        await self._run(work)
        await self._scrub()

    async def _scrub(self) -> None:
        """After a deletion: VACUUM the tables a user's memory is in, so the deleted rows'
        tuples, their TOAST chunks and their index entries (B-tree and GIN, the GIN
        pending list included) are removed now, not at autovacuum's next pass. What no
        application can scrub (WAL not yet recycled, backups, replicas) is said in
        docs/STORES.md."""
        async with self._connection() as db:
            await db.execute(f"VACUUM (INDEX_CLEANUP ON) {', '.join(TABLES)}")

    # --- the process ------------------------------------------------------------------

    async def store_id(self) -> str:
        """The store's id, made with it: every process that names it gets the same."""

        async def work(db: Db) -> str:
            return str(await db.fetchval("SELECT value FROM meta WHERE key = 'store_id'"))

        return await self._run(work)

    async def kept_secret(self, name: str) -> str | None:
        made = secrets.token_hex(32)

        async def work(db: Db) -> str:
            await db.execute(
                "INSERT INTO meta VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
                f"secret:{name}",
                made,
            )
            return str(await db.fetchval("SELECT value FROM meta WHERE key = $1", f"secret:{name}"))

        return await self._run(work)

    async def prepare(self) -> None:
        """Connect, migrate, and say once what retrieval uses."""

        async def work(db: Db) -> bool:
            return bool(
                await db.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector')"
                )
            )

        vector = await self._run(work)
        if not self._said_retrieval:
            self._said_retrieval = True
            why = (
                "pgvector is available, but this store has no dense recall yet"
                if vector
                else "pgvector is not installed"
            )
            if self.embedding_model is not None:  # a setting that would otherwise do nothing
                why += "; embedding_model is not used"
            log.info("postgres store %s: full-text only (%s)", self.where, why)

    async def aclose(self) -> None:
        held = self._pools.pop_current()
        if held is not None and held.pool is not None:
            await held.pool.close()


async def _unchanged(db: asyncpg.Connection[asyncpg.Record]) -> None:
    """What a connection needs before another use: nothing (see ``_open``)."""


@dataclass
class _LoopPool:
    pool: asyncpg.Pool | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


async def _replaced(
    db: Db, user_uuid: str, predicates: Sequence[str] = ()
) -> dict[int, str | None]:
    """``local._replaced``."""
    changed = await db.fetch(
        f"SELECT {_CHANGED_COLUMNS} {_CHANGED}", user_uuid, CHANGED_FACTS, list(predicates)
    )
    return await _changed_statements(db, user_uuid, changed)


async def _changed_statements(
    db: Db, user_uuid: str, changed: Sequence[Row]
) -> dict[int, str | None]:
    """The statements of the changes ``changed`` (``_CHANGED``'s rows), as
    ``local._replaced`` gives them."""
    keys = changed_keys([(r[0], r[1], r[2]) for r in changed])
    if not keys:
        return {}
    rows = await db.fetch(
        "SELECT id, message_key FROM messages WHERE user_uuid = $1 AND eligible"
        " AND message_key = ANY($2::text[])",
        user_uuid,
        list(keys),
    )
    by_key = {r["message_key"]: r["id"] for r in rows}
    return {by_key[key]: on for key, on in keys.items() if key in by_key}


async def _asked_about(db: Db, user_uuid: str, value: str) -> list[int]:
    """``local._asked_about``."""
    if not value.strip():
        return []
    pattern = re.compile(rf"(?<!\w){re.escape(value.casefold())}(?!\w)")
    rows = await db.fetch(
        "SELECT id, replied FROM messages WHERE user_uuid = $1 AND replied IS NOT NULL",
        user_uuid,
    )
    return [int(r[0]) for r in rows if pattern.search(r[1].casefold())]


async def _unlink_reply(db: Db, key: bytes, asked: int) -> None:
    """``local._unlink_reply``."""
    found = await db.fetchval(
        "SELECT id FROM messages WHERE thread_uuid ="
        " (SELECT thread_uuid FROM messages WHERE id = $1) AND id > $1 ORDER BY id LIMIT 1",
        asked,
    )
    if found is not None:
        await _drop_reply(db, key, found)


async def _drop_reply(db: Db, key: bytes, reply: int) -> None:
    """The statement ``reply`` no longer keeps the question it answered (row and index)."""
    found = await db.fetchrow(
        "SELECT content, replied, eligible FROM messages WHERE id = $1", reply
    )
    if found is None or found["replied"] is None:
        return
    tokens, terms = _terms(key, found["content"], None) if found["eligible"] else (0, None)
    await db.execute(
        "UPDATE messages SET replied = NULL, tokens = $2, terms = $3::tsvector WHERE id = $1",
        reply,
        tokens,
        terms,
    )


def _count(status: str) -> int:
    """The row count of a command's status ("DELETE 3")."""
    return int(status.rsplit(" ", 1)[-1])


def connect_failure(exc: BaseException, where: str) -> BackendError:
    """A failed connection (refused, unknown host, bad password, no such database) as the
    store says it: in one line naming the server, never the password."""
    return BackendError(
        "unauthorized" if getattr(exc, "sqlstate", "") in ("28P01", "28000") else "unavailable",
        code=type(exc).__name__,
        detail=f"cannot connect to {where}: {_reason(exc)}",
    )


def _reason(exc: BaseException) -> str:
    """Why a connection failed, in a clause: the server's message (it names a user or a
    database, never a password), else the system's."""
    if isinstance(exc, OSError):
        return (exc.strerror or type(exc).__name__).lower()
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


def _classified(exc: Exception) -> BackendError:
    """A server error as the worker's retry table knows them: the database not there to
    use now (connection, resources, shutdown, a serialisation failure or deadlock) is
    "unavailable" and retried; a statement cancelled (its timeout) is "timeout"; a user
    deleted under a write is "not found"; the rest is a bug of ours, "unavailable" with its
    SQLSTATE to act on."""
    state = str(getattr(exc, "sqlstate", "") or "")
    if state == "57014":
        return BackendError("timeout", code=state)
    if state == "23503":  # a foreign key: what it was written for is gone (a forget)
        return BackendError("not_found", status=404, code=state)
    if state.startswith("22"):  # data the database cannot hold
        return BackendError("bad_request", status=400, code=state)
    if state[:2] in _UNAVAILABLE_CLASSES:
        return BackendError("unavailable", code=state)
    return BackendError("unavailable", code=state or type(exc).__name__)
