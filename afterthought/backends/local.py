"""The embedded backend: a durable SQLite file with users, threads, messages, facts and
full-text search. Used without ``ZEP_API_KEY``; safe to share between the agent and the
worker processes (WAL mode)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import sqlite3
import threading
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from afterthought import templates
from afterthought.backends import ranking
from afterthought.backends.base import (
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
from afterthought.backends.ranking import run_now
from afterthought.backends.retrieval import (
    CONSTRAINTS,
    Statement,
    fuse,
    informativeness,
    match_expression,
    query_stems,
    query_terms,
    question_in,
    render_block,
    scoped,
    split_by_frequency,
    whole_lines,
    with_follow_ups,
)
from afterthought.contract import checksum, repair_text
from afterthought.facts import Fact, StoredFact, statement
from afterthought.search import SearchHit, SearchRequest
from afterthought.validation import detect

if TYPE_CHECKING:
    from afterthought.backends.embeddings import DenseIndex, Embedder

T = TypeVar("T")
log = logging.getLogger("afterthought.local")

#: A message's key is unique in its thread, not in the file: two deployments (two backend
#: users) that import one ADK session store it each in their own thread (the keys are made
#: from ADK's ids alone, ``contract.message_key``). An id is never given twice, even once
#: the newest row is deleted (a forgotten memory): synthesis reads a user's messages after
#: a watermark of ids, which a reused id would be behind.
MESSAGES_COLUMNS = """
  id INTEGER PRIMARY KEY AUTOINCREMENT, uuid TEXT UNIQUE NOT NULL,
  thread_uuid TEXT NOT NULL REFERENCES threads(uuid) ON DELETE CASCADE,
  message_key TEXT, role TEXT NOT NULL, name TEXT, content TEXT NOT NULL,
  metadata TEXT NOT NULL, reference_time TEXT, ingested INTEGER NOT NULL,
  created_at TEXT NOT NULL, user_uuid TEXT, clean INTEGER NOT NULL DEFAULT 0,
  eligible INTEGER NOT NULL DEFAULT 0, informative INTEGER NOT NULL DEFAULT 0, replied TEXT"""
MESSAGES_INDEXES = (
    "CREATE INDEX IF NOT EXISTS messages_thread ON messages(thread_uuid, id)",
    "CREATE UNIQUE INDEX IF NOT EXISTS messages_key ON messages(thread_uuid, message_key)",
)
#: A call's key is kept per thread, as Zep keeps it per request path: the same call to
#: another thread is another call. Gone with the thread.
IDEMPOTENCY_COLUMNS = """
  thread_uuid TEXT NOT NULL REFERENCES threads(uuid) ON DELETE CASCADE, key TEXT NOT NULL,
  created_at TEXT NOT NULL, PRIMARY KEY (thread_uuid, key)"""

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS users (
  uuid TEXT PRIMARY KEY, user_id TEXT UNIQUE NOT NULL, graph_uuid TEXT NOT NULL,
  first_name TEXT, last_name TEXT, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS threads (
  uuid TEXT PRIMARY KEY, user_uuid TEXT NOT NULL REFERENCES users(uuid) ON DELETE CASCADE,
  idempotency_key TEXT UNIQUE, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages (MESSAGES_COLUMNS);
MESSAGES_INDEXES;
CREATE TABLE IF NOT EXISTS facts (
  uuid TEXT PRIMARY KEY, user_uuid TEXT NOT NULL REFERENCES users(uuid) ON DELETE CASCADE,
  subject TEXT NOT NULL, predicate TEXT NOT NULL, value TEXT NOT NULL,
  kind TEXT, confidence REAL, importance REAL, trust TEXT, source_keys TEXT NOT NULL,
  valid_at TEXT NOT NULL, invalid_at TEXT, created_at TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS facts_user ON facts(user_uuid, invalid_at);
CREATE UNIQUE INDEX IF NOT EXISTS facts_unique
  ON facts(user_uuid, subject, predicate, value, source_keys);
CREATE TABLE IF NOT EXISTS idempotency (IDEMPOTENCY_COLUMNS);
-- One id per file: agent and worker compare theirs (``afterthought.shared_store``).
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('store_id', lower(hex(randomblob(16))));
CREATE TABLE IF NOT EXISTS templates (
  uuid TEXT PRIMARY KEY, name TEXT UNIQUE NOT NULL, template TEXT NOT NULL,
  created_at TEXT NOT NULL);
""".replace("MESSAGES_COLUMNS", MESSAGES_COLUMNS)
    .replace("MESSAGES_INDEXES", ";\n".join(MESSAGES_INDEXES))
    .replace("IDEMPOTENCY_COLUMNS", IDEMPOTENCY_COLUMNS)
)

#: ``PRAGMA user_version`` once the retrieval schema below is in place. Files written
#: before it are at 0; version 1 indexed no ``replied`` column; version 2 indexed words
#: unscoped; version 3 indexed an owner column too; version 4 left case and what a letter
#: is to the SQLite build; version 5 kept message keys and call keys unique in the whole
#: file; version 6 gave the id of a deleted newest message again. An older file's messages
#: gain the columns (before 2), its keys their thread (before 6), ids never reused (before
#: 7), and are indexed afresh, once.
SCHEMA_VERSION = 7
#: How far past its greatest id a file of version 6 or before goes on giving ids: more
#: than the rows it can have given and deleted since (SQLite's ids go to 2**63).
ID_GAP = 2**32
#: Columns added to ``messages`` by the retrieval schema: ``user_uuid`` (the owner, so
#: retrieval never joins threads), ``clean`` (``validation.detect`` found nothing,
#: decided at write time), ``eligible`` (a clean, ingested user turn: the only rows
#: retrieval may return), ``informative`` (``retrieval.informativeness``) and ``replied``
#: (for a statement, the question the clean assistant turn just before it asked: what a short
#: answer answers).
ADDED_COLUMNS = (
    "user_uuid TEXT",
    "clean INTEGER NOT NULL DEFAULT 0",
    "eligible INTEGER NOT NULL DEFAULT 0",
    "informative INTEGER NOT NULL DEFAULT 0",
    "replied TEXT",
)
# Statements are indexed in their owner's scope (``retrieval.scoped``: every word prefixed
# with the user's scope), so a term's postings are one user's rows: counting, ranking and
# BM25's statistics cost what that user's history costs, not the file's. A second column
# holds the question a statement replied to ("What was your dog called?" -> "Max"), weighed
# less than the user's own words. Contentless: the text lives once, in ``messages``; a
# deleted row's terms are removed by the trigger, which scopes them with the same Python
# function (registered on every connection, ``_connect``), and purged from old segments by
# ``optimize`` in ``_scrub``.
RETRIEVAL_SCHEMA = (
    "DROP TRIGGER IF EXISTS messages_ai",
    "DROP TRIGGER IF EXISTS messages_ad",
    "DROP TABLE IF EXISTS messages_fts",
    # Every statement is indexed again below: an older index (another column set) goes.
    "DROP TRIGGER IF EXISTS statements_ad",
    "DROP TABLE IF EXISTS statements_fts",
    "CREATE VIRTUAL TABLE IF NOT EXISTS statements_fts USING fts5(content, replied,"
    " content='', tokenize='porter unicode61 remove_diacritics 2')",
    # The newest statements of one user, without walking past other users' newer rows.
    "CREATE INDEX IF NOT EXISTS messages_eligible ON messages(user_uuid, id) WHERE eligible = 1",
    "CREATE INDEX IF NOT EXISTS messages_informative ON messages(user_uuid, id)"
    " WHERE eligible = 1 AND informative > 0",
    "CREATE TABLE IF NOT EXISTS vectors (message_id INTEGER PRIMARY KEY REFERENCES"
    " messages(id) ON DELETE CASCADE, user_uuid TEXT NOT NULL, model TEXT NOT NULL,"
    " vector BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS vectors_user ON vectors(user_uuid, model, message_id)",
    # Bumped by every deletion of a statement, in any process: in-memory vector matrices
    # are dropped when it moves, so forgotten statements never linger in memory.
    "CREATE TABLE IF NOT EXISTS retrieval_epoch (deletions INTEGER NOT NULL)",
    "INSERT INTO retrieval_epoch SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM retrieval_epoch)",
    "CREATE TRIGGER IF NOT EXISTS statements_ad AFTER DELETE ON messages"
    " WHEN old.eligible = 1 BEGIN"
    " INSERT INTO statements_fts(statements_fts, rowid, content, replied) VALUES"
    " ('delete', old.id, afterthought_scoped(old.user_uuid, old.content),"
    " afterthought_scoped(old.user_uuid, old.replied));"
    " UPDATE retrieval_epoch SET deletions = deletions + 1; END",
)
#: Messages per page of a thread's history (``message_page``).
MESSAGE_PAGE = 1000
#: Candidates per ranking (BM25, dense) and from the informative ranking.
RELEVANT = 20
#: Changed facts whose statements (old and new) every block is offered.
CHANGED_FACTS = 5
#: The facts that limit advice whose statements a request for advice is offered.
MAX_CONSTRAINTS = 6
#: At most about this many rows are scored by BM25 per query (see ``_lexical``).
RANKED_ROWS = 500
#: When every word of a query is common, the newest rows holding the least common of them
#: are ranked: BM25 counts every row of each word it is given.
COMMON_TERMS = 4
INFORMATIVE = 40
#: The newest statements, whatever they hold, that fill what room is left.
RECENT = 40
#: How much the question a statement replied to weighs in BM25 against its own words.
REPLIED_WEIGHT = 0.4
#: How many of the user's newest informative statements the informative ranking reads.
INFORMATIVE_POOL = 200
#: The newest statements a follow-up is looked for in.
FOLLOW_UP_POOL = 100


@dataclass(frozen=True, slots=True)
class _Verdict:
    """What is decided about a message once, when it is written."""

    clean: bool
    eligible: bool
    informative: int


def _verdict(role: str | None, content: str, ingested: bool) -> _Verdict:
    clean = detect(content) is None
    eligible = role == "user" and ingested and clean
    return _Verdict(clean, eligible, informativeness(content) if eligible else 0)


def _now() -> str:
    return datetime.now(UTC).isoformat()


#: The least score of a statement that holds a word of the query.
MATCHED = 0.001


class LocalBackend(MemoryBackend):
    name = "local"
    capabilities = Capabilities(
        extracts_facts=False,
        ignores_roles=False,
        async_deletes=False,
        ingests_async=False,
        replays_thread_creates=True,
    )

    def __init__(
        self,
        path: Path | str,
        embedder: Embedder | None = None,
        *,
        max_chars: int = 4000,
        upgrade: bool = True,
        busy_seconds: float = 10.0,
    ) -> None:
        """``max_chars``: the size of the blocks the store returns unasked (a write's
        ``return_context``, the ``context`` search scope): ``context_max_chars``.
        ``upgrade``: migrate a file of an older schema on open; without it such a file is
        "unavailable" (code ``schema_upgrade_pending``) until a process that may has.
        ``busy_seconds``: how long a statement waits for another process's lock or read
        (SQLite's busy timeout) before the store is busy."""
        self.path = Path(path)
        self.max_chars = max_chars
        self.upgrade = upgrade
        self.busy_seconds = busy_seconds
        self._lock = threading.Lock()
        # Which read holds the connection (its abandon flag), so a timed-out read can be
        # interrupted without interrupting anything else.
        self._running_lock = threading.Lock()
        self._running: threading.Event | None = None
        self._db: sqlite3.Connection | None = None
        self._embedder = embedder
        self._dense: DenseIndex | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        if str(self.path) != ":memory:":
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:  # a file in the way, a place that takes no directory
                why = "a file is in the way" if isinstance(exc, FileExistsError) else _reason(exc)
                raise self._unopenable(exc, f"cannot create {exc.filename} ({why})") from None
            try:
                # Memory is personal data: the file is created private to its owner. Only
                # when it is not there: closing a descriptor of a file drops every POSIX
                # lock this process holds on it, so another connection of ours to an
                # existing store would lose its locks (and other processes would then
                # checkpoint or delete its WAL under it: a corrupt store).
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
            except FileExistsError:
                pass
            except OSError as exc:
                raise self._unopenable(exc, _reason(exc)) from None
        try:
            return self._open()
        except sqlite3.DatabaseError as exc:  # not a database, read-only, locked, ...
            raise self._unopenable(exc, str(exc)) from None

    def _unopenable(self, exc: Exception, why: str) -> BackendError:
        return BackendError(
            "unavailable",
            code=type(exc).__name__,
            detail=f"cannot open the local store {self.path}: {why}",
        )

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, timeout=self.busy_seconds)
        # interrupt() stops the statement running when a read is given up on; this stops
        # the read's next ones too (an interrupt between two statements is forgotten).
        db.set_progress_handler(self._given_up, 10_000)
        # The index's delete trigger scopes words as the writes did (see RETRIEVAL_SCHEMA);
        # a build that distrusts schemas would refuse functions in triggers.
        db.create_function("afterthought_scoped", 2, scoped, deterministic=True)
        try:
            db.execute("PRAGMA trusted_schema=ON")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA foreign_keys=ON")
            # Deleted rows are overwritten, not left in free pages: forgetting is for real.
            db.execute("PRAGMA secure_delete=ON")
            db.executescript(SCHEMA)
            _migrate(db, upgrade=self.upgrade)
            if self._embedder is not None:
                from afterthought.backends.embeddings import DenseIndex

                self._backfill_vectors(db, self._embedder)
                self._dense = DenseIndex(self._embedder.name)
        except BaseException:
            db.close()  # the next call opens it afresh; nothing is left half set up
            raise
        self._db = db
        return db

    @staticmethod
    def _backfill_vectors(db: sqlite3.Connection, embedder: Embedder) -> None:
        """Vectors for the statements that have none in the configured model's space (a
        file written without embeddings, or with another model), once, at open."""
        with db:
            db.execute("DELETE FROM vectors WHERE model != ?", (embedder.name,))
        while True:
            rows = db.execute(
                "SELECT id, content, user_uuid FROM messages m WHERE eligible = 1 AND NOT"
                " EXISTS (SELECT 1 FROM vectors v WHERE v.message_id = m.id) LIMIT 1024"
            ).fetchall()
            if not rows:
                return
            with db:
                LocalBackend._store_vectors(
                    db, embedder, [(r[0], r[2]) for r in rows], [r[1] for r in rows]
                )

    @staticmethod
    def _store_vectors(
        db: sqlite3.Connection,
        embedder: Embedder,
        owners: Sequence[tuple[int, str]],
        texts: Sequence[str],
    ) -> None:
        """``owners``: (message id, user uuid) of each text."""
        from afterthought.backends.embeddings import to_blob, unit_rows

        vectors = unit_rows(embedder.embed(texts))
        db.executemany(
            "INSERT OR REPLACE INTO vectors VALUES (?, ?, ?, ?)",
            [
                (message_id, user_uuid, embedder.name, to_blob(vector))
                for (message_id, user_uuid), vector in zip(owners, vectors, strict=True)
            ],
        )

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.to_thread(self._locked, work, None)

    async def _read(self, work: Callable[[sqlite3.Connection], T], timeout: float) -> T:
        """A read within ``timeout``. A thread cannot be cancelled, so a read given up on
        must not go on holding the connection (every later read would queue behind it):
        one still waiting for the lock is skipped, one running is interrupted."""
        abandoned = threading.Event()
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.to_thread(self._locked, work, abandoned)
        except (TimeoutError, asyncio.CancelledError):
            with self._running_lock:
                abandoned.set()
                if self._running is abandoned and self._db is not None:
                    self._db.interrupt()
            raise

    def _given_up(self) -> int:
        running = self._running
        return int(running is not None and running.is_set())

    def _locked(
        self, work: Callable[[sqlite3.Connection], T], abandoned: threading.Event | None
    ) -> T:
        with self._lock:
            with self._running_lock:
                if abandoned is not None and abandoned.is_set():
                    raise BackendError("timeout", code="abandoned")
                self._running = abandoned
            try:
                db = self._connect()
                with db:
                    return work(db)
            except (sqlite3.OperationalError, sqlite3.DatabaseError) as exc:
                # Locked, busy, read-only, full, not a database, or a read interrupted:
                # nothing was written.
                raise BackendError("unavailable", code=type(exc).__name__) from None
            finally:
                with self._running_lock:
                    self._running = None

    async def ensure_user(
        self, *, zep_user_id: str, first_name: str | None = None, last_name: str | None = None
    ) -> tuple[UserRef, bool]:
        def work(db: sqlite3.Connection) -> tuple[UserRef, bool]:
            inserted = db.execute(
                "INSERT OR IGNORE INTO users VALUES (?, ?, ?, ?, ?, ?)",
                (str(uuid.uuid4()), zep_user_id, str(uuid.uuid4()), first_name, last_name, _now()),
            )
            row = db.execute(
                "SELECT uuid, graph_uuid FROM users WHERE user_id = ?", (zep_user_id,)
            ).fetchone()
            return UserRef(user_uuid=row[0], graph_uuid=row[1]), inserted.rowcount == 1

        return await self._run(work)

    async def find_user(self, *, zep_user_id: str) -> UserRef | None:
        found = await self._run(
            lambda db: db.execute(
                "SELECT uuid, graph_uuid FROM users WHERE user_id = ?", (zep_user_id,)
            ).fetchone()
        )
        return UserRef(found[0], found[1]) if found else None

    async def create_thread(self, *, user: UserRef, idempotency_key: str) -> str:
        def work(db: sqlite3.Connection) -> str:
            if not db.execute("SELECT 1 FROM users WHERE uuid = ?", (user.user_uuid,)).fetchone():
                raise BackendError("not_found", status=404, code="user")
            db.execute(
                "INSERT OR IGNORE INTO threads VALUES (?, ?, ?, ?)",
                (str(uuid.uuid4()), user.user_uuid, idempotency_key, _now()),
            )
            row = db.execute(
                "SELECT uuid, user_uuid FROM threads WHERE idempotency_key = ?", (idempotency_key,)
            ).fetchone()
            if row[1] != user.user_uuid:  # never hand one user's thread to another
                raise BackendError("conflict", status=409, code="thread of another user")
            return str(row[0])

        return await self._run(work)

    async def thread_owner(self, *, thread_uuid: str) -> str | None:
        def work(db: sqlite3.Connection) -> str | None:
            row = db.execute(
                "SELECT user_uuid FROM threads WHERE uuid = ?", (thread_uuid,)
            ).fetchone()
            return str(row[0]) if row else None

        return await self._run(work)

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
        # No timeout: the write is one SQLite transaction, and cutting the await would leave
        # it running in its thread, to commit after we had called it failed.
        if any(repair_text(m.content)[1] for m in messages):
            # The queue repairs text before it gets here (``contract.repair_text``); a
            # direct caller is told, rather than have the text changed unseen.
            raise BackendError("bad_request", status=400, code="invalid_unicode")
        # Validation is the costly part of a write: done before taking the connection lock.
        verdicts = await asyncio.to_thread(
            lambda: [_verdict(m.role, m.content, m.role not in ignore_roles) for m in messages]
        )

        def work(db: sqlite3.Connection) -> str | None:
            found = db.execute(
                "SELECT t.user_uuid, u.graph_uuid FROM threads t JOIN users u"
                " ON u.uuid = t.user_uuid WHERE t.uuid = ?",
                (thread_uuid,),
            ).fetchone()
            if not found:
                raise BackendError("not_found", status=404, code="thread")
            seen = db.execute(
                "INSERT OR IGNORE INTO idempotency VALUES (?, ?, ?)",
                (thread_uuid, idempotency_key, _now()),
            )
            if seen.rowcount:
                self._insert(db, thread_uuid, found[0], messages, verdicts, ignore_roles)
            if not return_context:
                return None
            query = " ".join(m.content for m in messages if m.role == "user")
            return self._context(db, UserRef(found[0], found[1]), query, self.max_chars)

        return await self._run(work)

    def _insert(
        self,
        db: sqlite3.Connection,
        thread_uuid: str,
        user_uuid: str,
        messages: Sequence[OutgoingMessage],
        verdicts: Sequence[_Verdict],
        ignore_roles: Sequence[str],
    ) -> None:
        """Store a batch and index its eligible statements (full text, and vectors when an
        embedder is set), in the caller's transaction: a statement is searchable exactly
        when it is stored."""
        indexed: list[tuple[int, str]] = []
        texts: list[str] = []
        before = db.execute(
            "SELECT role, content, clean FROM messages WHERE thread_uuid = ?"
            " ORDER BY id DESC LIMIT 1",
            (thread_uuid,),
        ).fetchone()
        previous = (before[0], before[1], bool(before[2])) if before else None
        for m, verdict in zip(messages, verdicts, strict=True):
            replied = _reply_context(previous) if verdict.eligible else None
            # A turn not ingested (an ignored role) is no question a statement answers.
            previous = (m.role or "", m.content, verdict.clean and m.role not in ignore_roles)
            # The message key, unique in the thread, makes a replay under a new batch key a
            # no-op too.
            key = _stored_key(db, thread_uuid, m.metadata.get(MESSAGE_KEY_FIELD), m.content)
            inserted = db.execute(
                "INSERT OR IGNORE INTO messages (uuid, thread_uuid, message_key, role, name,"
                " content, metadata, reference_time, ingested, created_at, user_uuid, clean,"
                " eligible, informative, replied)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    str(uuid.uuid4()),
                    thread_uuid,
                    key,
                    m.role or "",
                    m.name,
                    m.content,
                    json.dumps(dict(m.metadata)),
                    m.reference_time,
                    int(m.role not in ignore_roles),
                    _now(),
                    user_uuid,
                    int(verdict.clean),
                    int(verdict.eligible),
                    verdict.informative,
                    replied,
                ),
            )
            if inserted.rowcount and verdict.eligible and inserted.lastrowid is not None:
                _index(db, inserted.lastrowid, user_uuid, m.content, replied)
                indexed.append((inserted.lastrowid, user_uuid))
                texts.append(m.content)
        if self._embedder is not None and texts:
            self._store_vectors(db, self._embedder, indexed, texts)

    async def remove_copy(self, *, thread_uuid: str, copy: LateCopy, last_chance: bool) -> str:
        """Deleted. A message key, unique in its thread, keeps a late call from storing a copy
        at all; one found all the same (written by another tool) goes like any other."""

        def work(db: sqlite3.Connection) -> None:
            db.execute(
                "DELETE FROM messages WHERE uuid = ? AND thread_uuid = ?", (copy.uuid, thread_uuid)
            )

        await self._run(work)
        await self._scrub()
        return "deleted"

    async def recent_messages(
        self, *, thread_uuid: str, limit: int, timeout: float | None = None
    ) -> list[StoredMessage]:
        found, _ = await self._page(thread_uuid, below=None, limit=limit)
        return found

    async def message_page(
        self, *, thread_uuid: str, cursor: str | None, timeout: float | None = None
    ) -> tuple[list[StoredMessage], str | None]:
        below = int(cursor) if cursor else None
        found, last = await self._page(thread_uuid, below=below, limit=MESSAGE_PAGE)
        return found, (str(last) if len(found) == MESSAGE_PAGE else None)

    async def _page(
        self, thread_uuid: str, *, below: int | None, limit: int
    ) -> tuple[list[StoredMessage], int | None]:
        """Up to ``limit`` of the thread's messages, newest first, older than row ``below``;
        and the row id of the last."""

        def work(db: sqlite3.Connection) -> tuple[list[StoredMessage], int | None]:
            rows = db.execute(
                "SELECT uuid, role, content, metadata, id FROM messages WHERE thread_uuid = ?"
                " AND id < ? ORDER BY id DESC LIMIT ?",
                (thread_uuid, below if below is not None else 2**63 - 1, limit),
            ).fetchall()
            found = [StoredMessage(r[0], r[1], r[2], json.loads(r[3])) for r in rows]
            return found, (rows[-1][4] if rows else None)

        return await self._run(work)

    async def get_context(
        self,
        *,
        user: UserRef,
        query: str,
        max_chars: int,
        timeout: float,
        template_uuid: str | None = None,
    ) -> str:
        return await self._read(
            lambda db: self._context(db, user, query, max_chars, template_uuid), timeout
        )

    def _context(
        self,
        db: sqlite3.Connection,
        user: UserRef,
        query: str,
        max_chars: int,
        template_uuid: str | None = None,
    ) -> str:
        facts = [
            (statement(subject, predicate, value), at)
            for subject, predicate, value, at in db.execute(
                "SELECT subject, predicate, value, valid_at FROM facts WHERE user_uuid = ?"
                " AND invalid_at IS NULL ORDER BY importance DESC, valid_at DESC LIMIT 1000",
                (user.user_uuid,),
            )
        ]
        if template_uuid is None:
            statements = self._statements(db, user.user_uuid, query, limit=None)
            return render_block(fact_lines(facts), statements, max_chars)
        row = db.execute("SELECT template FROM templates WHERE uuid = ?", (template_uuid,))
        found = row.fetchone()
        if found is None:
            raise BackendError("not_found", status=404, code="template")
        return render_template(found[0], facts, max_chars, self.name)

    async def create_template(self, *, name: str, template: str) -> str:
        def work(db: sqlite3.Connection) -> str:
            db.execute(
                "INSERT OR IGNORE INTO templates VALUES (?, ?, ?, ?)",
                (str(uuid.uuid4()), name, template, _now()),
            )
            row = db.execute("SELECT uuid FROM templates WHERE name = ?", (name,)).fetchone()
            return str(row[0])

        return await self._run(work)

    async def get_template(self, template_uuid: str) -> tuple[str, str]:
        def work(db: sqlite3.Connection) -> tuple[str, str]:
            row = db.execute(
                "SELECT name, template FROM templates WHERE uuid = ?", (template_uuid,)
            ).fetchone()
            if row is None:
                raise BackendError("not_found", status=404, code="template")
            return str(row[0]), str(row[1])

        return await self._run(work)

    async def update_template(self, template_uuid: str, *, name: str, template: str) -> None:
        await self._run(
            lambda db: db.execute(
                "UPDATE templates SET name = ?, template = ? WHERE uuid = ?",
                (name, template, template_uuid),
            )
        )

    async def delete_template(self, template_uuid: str) -> None:
        await self._run(
            lambda db: db.execute("DELETE FROM templates WHERE uuid = ?", (template_uuid,))
        )

    def _statements(
        self,
        db: sqlite3.Connection,
        user_uuid: str,
        query: str,
        limit: int | None,
        *,
        fill: bool = True,
    ) -> list[Statement]:
        """The user's past statements, best first: those most relevant to the query (BM25,
        fused with the dense ranking when an embedder is set), then the most informative
        recent ones, then (``fill``: for a block, not a search) the newest; each once (by
        row and by text), each followed by the newest later word on the same thing, with
        the turn it replied to."""
        replaced = _replaced(db, user_uuid)
        ranked = [
            *self._relevant(db, user_uuid, query),
            *replaced,
            *self._informative(db, user_uuid),
            *(self._recent(db, user_uuid) if fill else ()),
        ]
        ids = list(dict.fromkeys(ranked))
        if not ids:
            return []
        # The candidates, and the user's newest statements as the follow-ups' pool (two
        # queries: as one OR, the planner walks every statement of the user).
        columns = "SELECT id, replied, content, COALESCE(reference_time, created_at) FROM messages"
        rows = {
            r[0]: r[1:]
            for r in db.execute(
                f"{columns} WHERE id IN ({','.join('?' * len(ids))})"
                " AND user_uuid = ? AND eligible = 1",
                (*ids, user_uuid),
            )
        }
        rows.update(
            (r[0], r[1:])
            for r in db.execute(
                f"{columns} WHERE user_uuid = ? AND eligible = 1 ORDER BY id DESC LIMIT ?",
                (user_uuid, FOLLOW_UP_POOL),
            )
        )
        return assemble_statements(ids, rows, replaced, limit)

    def _relevant(self, db: sqlite3.Connection, user_uuid: str, query: str) -> list[int]:
        return run_now(ranking.relevant(_Source(db, user_uuid, self._embedder, self._dense), query))

    @staticmethod
    def _informative(db: sqlite3.Connection, user_uuid: str) -> list[int]:
        """What the user disclosed about themselves lately: the more signals the better,
        the newer the better (a score halves over the newest 50 statements)."""
        rows = db.execute(
            "SELECT id, informative FROM messages WHERE user_uuid = ? AND eligible = 1"
            " AND informative > 0 ORDER BY id DESC LIMIT ?",
            (user_uuid, INFORMATIVE_POOL),
        ).fetchall()
        return informative_order(rows)

    @staticmethod
    def _recent(db: sqlite3.Connection, user_uuid: str) -> list[int]:
        """The user's newest statements, whatever they hold: what fills a block that the
        relevant and informative ones leave room in."""
        rows = db.execute(
            "SELECT id FROM messages WHERE user_uuid = ? AND eligible = 1 ORDER BY id DESC LIMIT ?",
            (user_uuid, RECENT),
        )
        return [int(r[0]) for r in rows]

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
        # ``facts_unique`` holds the replay out while the fact is held; once deleted, its
        # row is gone and the fact added again is a row again: ``said_ms`` is not needed.
        await self._run(
            lambda db: db.execute(
                "INSERT OR IGNORE INTO facts (uuid, user_uuid, subject, predicate, value, kind,"
                " confidence, importance, trust, source_keys, valid_at, created_at)"
                " VALUES (?, ?, 'user', 'noted', ?, 'note', 1.0, 0.5, ?, ?, ?, ?)",
                (
                    str(uuid.uuid4()),
                    user.user_uuid,
                    text,
                    trust,
                    json.dumps([key]),
                    reference_time,
                    _now(),
                ),
            )
        )

    async def delete_user(self, *, user: UserRef) -> None:
        await self._run(
            lambda db: db.execute("DELETE FROM users WHERE uuid = ?", (user.user_uuid,))
        )
        await self._scrub()

    async def _scrub(self) -> None:
        """After a deletion, leave none of the deleted text in the files: the full-text
        index keeps deleted terms in old segments until they are merged, and the WAL keeps
        old page images until it is checkpointed (``secure_delete`` covers the rest)."""

        def work(db: sqlite3.Connection) -> None:
            db.execute("INSERT INTO statements_fts(statements_fts) VALUES ('optimize')")

        def checkpoint(db: sqlite3.Connection) -> bool:
            busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            return not busy

        await self._run(work)
        # The checkpoint waits out readers in other processes (the busy timeout); if one
        # still holds the WAL open, old page images remain: say so, so it is retried.
        if not await self._run(checkpoint):
            raise BackendError("unavailable", code="scrub_busy")

    async def delete_memory(self, *, user: UserRef, memory_uuid: str) -> bool:
        """A fact goes with the messages it was read from: the block quotes what the user
        said, so forgetting a fact that a quote still says would forget nothing (other facts
        read from the same messages stay, as facts). A question kept beside an answer that
        names the value goes from it ("Do you like living in Lisbon?" -> "yes very much");
        the forgetter deletes the user's later statements that say the fact again. So do
        the assistant's replies that repeat it (``repeating``): a reply that quoted the
        block is stored too. A message id deletes that message."""

        def work(db: sqlite3.Connection) -> bool:
            found = db.execute(
                "SELECT source_keys, value, predicate FROM facts WHERE uuid = ? AND user_uuid = ?",
                (memory_uuid, user.user_uuid),
            ).fetchone()
            sources: list[str] = json.loads(found[0]) if found else []
            repeats: list[int] = []
            if found:
                for answer in _asked_about(db, user.user_uuid, found[1]):
                    _drop_reply(db, answer)
                said = [
                    row[0]
                    for row in db.execute(
                        "SELECT m.content FROM messages m JOIN threads t ON t.uuid = m.thread_uuid"
                        " WHERE t.user_uuid = ? AND m.role != 'assistant'"
                        f" AND m.message_key IN ({','.join('?' * len(sources))})",
                        (user.user_uuid, *sources),
                    )
                ]
                replies = db.execute(
                    "SELECT m.id, m.content FROM messages m"
                    " JOIN threads t ON t.uuid = m.thread_uuid"
                    " WHERE t.user_uuid = ? AND m.role = 'assistant'",
                    (user.user_uuid,),
                ).fetchall()
                repeats = repeating(said, replies, predicate=found[2], value=found[1])
            for reply in repeats:
                _unlink_reply(db, reply)
                db.execute("DELETE FROM messages WHERE id = ?", (reply,))
            facts = db.execute(
                "DELETE FROM facts WHERE uuid = ? AND user_uuid = ?", (memory_uuid, user.user_uuid)
            )
            selected = (
                f"user_uuid = ? AND (uuid = ? OR message_key IN ({','.join('?' * len(sources))}))"
            )
            arguments = (user.user_uuid, memory_uuid, *sources)
            for (asked,) in db.execute(
                f"SELECT id FROM messages WHERE role = 'assistant' AND {selected}", arguments
            ).fetchall():
                _unlink_reply(db, asked)
            messages = db.execute(f"DELETE FROM messages WHERE {selected}", arguments)
            return facts.rowcount + messages.rowcount > 0

        deleted = await self._run(work)
        await self._scrub()
        return deleted

    async def user_messages(
        self, *, user: UserRef, after: str | None, limit: int
    ) -> tuple[list[HistoryMessage], str | None]:
        def work(db: sqlite3.Connection) -> tuple[list[HistoryMessage], str | None]:
            rows = db.execute(
                "SELECT m.id, m.message_key, m.role, m.content, m.reference_time"
                " FROM messages m JOIN threads t ON t.uuid = m.thread_uuid"
                " WHERE t.user_uuid = ? AND m.id > ? ORDER BY m.id LIMIT ?",
                (user.user_uuid, int(after or 0), limit),
            ).fetchall()
            found = [HistoryMessage(r[1] or str(r[0]), r[2], r[3], r[4] or "") for r in rows]
            return found, (str(rows[-1][0]) if rows else None)

        return await self._run(work)

    async def list_facts(self, *, user: UserRef) -> list[StoredFact]:
        def work(db: sqlite3.Connection) -> list[StoredFact]:
            rows = db.execute(
                "SELECT uuid, subject, predicate, value, kind, importance, trust, valid_at,"
                " invalid_at, source_keys FROM facts WHERE user_uuid = ? ORDER BY valid_at",
                (user.user_uuid,),
            ).fetchall()
            return [stored_fact(r) for r in rows]

        return await self._run(work)

    async def write_facts(
        self, *, user: UserRef, add: Sequence[Fact], invalidate: Sequence[str], at: str
    ) -> None:
        def work(db: sqlite3.Connection) -> None:  # one transaction: all or nothing
            # A user deleted meanwhile (a forget) is Zep's 404, not a foreign key failure.
            if not db.execute("SELECT 1 FROM users WHERE uuid = ?", (user.user_uuid,)).fetchone():
                raise BackendError("not_found", status=404, code="user")
            for fact_uuid in invalidate:
                db.execute(
                    "UPDATE facts SET invalid_at = ? WHERE uuid = ? AND user_uuid = ?"
                    " AND invalid_at IS NULL",
                    (at, fact_uuid, user.user_uuid),
                )
            for fact in add:
                db.execute(
                    "INSERT OR IGNORE INTO facts (uuid, user_uuid, subject, predicate, value,"
                    " kind, confidence, importance, trust, source_keys, valid_at, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
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
                    ),
                )

        await self._run(work)

    async def search(
        self, *, graph_uuid: str, request: SearchRequest, timeout: float
    ) -> list[SearchHit]:
        """Facts for ``edges``, what users said for ``episodes``, the block for ``context``;
        the store has no nodes, observations or thread summaries (empty, not an error)."""

        def work(db: sqlite3.Connection) -> list[SearchHit]:
            user = db.execute(
                "SELECT uuid FROM users WHERE graph_uuid = ? OR uuid = ?", (graph_uuid, graph_uuid)
            ).fetchone()
            if user is None:
                return []
            if request.scope == "context":
                text = self._context(
                    db, UserRef(user[0], graph_uuid), request.query, self.max_chars
                )
                return [SearchHit(uuid="context", text=text)] if text else []
            if request.scope == "edges":
                return self._facts(db, user[0], request.query, request.limit)
            if request.scope == "episodes":
                return self._said(db, user[0], request.query, request.limit)
            return []

        return await self._read(work, timeout)

    def _said(
        self, db: sqlite3.Connection, user_uuid: str, query: str, limit: int
    ) -> list[SearchHit]:
        """The user's statements about ``query``, most relevant first, each once (by text):
        those holding any of its words (as the index reads them: case, accents, plurals and
        other endings folded), and with an embedder those nearest it in meaning. Nothing for
        a query without content words (no embedder) or an empty one.

        ``score`` is 0..1, higher more relevant: the larger of ``b / (1 + b)``, where ``b``
        is the statement's BM25 for all the query's words (FTS5's ``bm25`` negated; the
        question it answered weighs ``REPLIED_WEIGHT``; at least ``MATCHED`` for a
        statement holding a word of the query), and its cosine similarity to the query
        (with an embedder, when positive). BM25 weighs a word by how rare it is in the
        store, so scores compare within one search, not across stores."""
        terms = query_terms(query)
        ranked = _lexical(db, user_uuid, terms, {})
        vector = None
        if self._embedder is not None and self._dense is not None and query.strip():
            from afterthought.backends.embeddings import unit_rows

            vector = unit_rows(self._embedder.embed([query]))[0]
            ranked = fuse([ranked, self._dense.search(db, user_uuid, vector, RELEVANT)])
        if not ranked:
            return []
        marks = ",".join("?" * len(ranked))
        scores: dict[int, float] = {}
        if terms:
            for rowid, bm25 in db.execute(
                f"SELECT rowid, bm25(statements_fts, 1.0, {REPLIED_WEIGHT}) FROM statements_fts"
                f" WHERE statements_fts MATCH ? AND rowid IN ({marks})",
                (match_expression(user_uuid, terms), *ranked),
            ):
                scores[int(rowid)] = match_score(-bm25)
        if vector is not None and self._embedder is not None:
            import numpy as np

            for message_id, blob in db.execute(
                "SELECT message_id, vector FROM vectors"
                f" WHERE model = ? AND message_id IN ({marks})",
                (self._embedder.name, *ranked),
            ):
                cosine = min(1.0, float(np.frombuffer(blob, dtype=np.float32) @ vector))
                if cosine > scores.get(message_id, 0.0):
                    scores[int(message_id)] = cosine
        rows = db.execute(
            "SELECT id, uuid, content, COALESCE(reference_time, created_at) FROM messages"
            f" WHERE id IN ({marks}) AND user_uuid = ? AND eligible = 1",
            (*ranked, user_uuid),
        ).fetchall()
        return said_hits(rows, scores, ranked, limit)

    @staticmethod
    def _facts(db: sqlite3.Connection, user_uuid: str, query: str, limit: int) -> list[SearchHit]:
        """Current facts as statements, by the share of the query's words each holds
        (``score``, 0..1: 1 holds them all, 0 none, as for a query without content words),
        then the newest. Words are compared as statement search reads them
        (``query_stems``: case, accents, plurals and other endings folded, so "Seat" finds
        "prefers: window seats"); the predicate counts ("seat" finds "prefers seat:
        aisle")."""
        rows = db.execute(
            "SELECT uuid, subject, predicate, value, valid_at FROM facts WHERE user_uuid = ?"
            " AND invalid_at IS NULL ORDER BY valid_at DESC",
            (user_uuid,),
        ).fetchall()
        return fact_hits(rows, query, limit)

    async def store_id(self) -> str:
        """This file's id, made with it: two paths to one file give one id."""
        return await self._run(
            lambda db: str(
                db.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()[0]
            )
        )

    async def kept_secret(self, name: str) -> str | None:
        made = secrets.token_hex(32)

        def work(db: sqlite3.Connection) -> str:
            db.execute("INSERT OR IGNORE INTO meta VALUES (?, ?)", (f"secret:{name}", made))
            found = db.execute("SELECT value FROM meta WHERE key = ?", (f"secret:{name}",))
            return str(found.fetchone()[0])

        return await self._run(work)

    async def prepare(self) -> None:
        """Load the embedding model (it may be fetched) and open, or upgrade, the store."""
        if self._embedder is not None:
            try:
                await asyncio.to_thread(self._embedder.embed, ["ready"])
            except ModuleNotFoundError:  # the extra is not installed: said as such
                raise
            except Exception as exc:  # not found, not downloadable, not a model
                raise BackendError(
                    "unavailable", code=f"embedding_model:{type(exc).__name__}"
                ) from None
        await self._run(lambda db: None)

    async def aclose(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


@dataclass(frozen=True, slots=True)
class _Source:
    """``ranking.StatementSource`` on one read's connection: answers at once (``run_now``)."""

    db: sqlite3.Connection
    user_uuid: str
    embedder: Embedder | None
    index: DenseIndex | None
    frequency: dict[str, int] = field(default_factory=dict)
    """Terms counted in this read: each hop asks again for words the last counted."""

    async def lexical(self, queries: Sequence[Sequence[str]]) -> list[list[int]]:
        return [_lexical(self.db, self.user_uuid, terms, self.frequency) for terms in queries]

    async def counts(self, terms: Sequence[str]) -> dict[str, int]:
        return _counts(self.db, self.user_uuid, terms, self.frequency)

    async def contents(self, ids: Sequence[int]) -> dict[int, str]:
        marks = ",".join("?" * len(ids))
        return dict(self.db.execute(f"SELECT id, content FROM messages WHERE id IN ({marks})", ids))

    async def dense(self, query: str) -> list[int]:
        if self.embedder is None or self.index is None:
            return []
        from afterthought.backends.embeddings import unit_rows

        vector = unit_rows(self.embedder.embed([query]))[0]
        return self.index.search(self.db, self.user_uuid, vector, RELEVANT)

    async def constraints(self) -> list[int]:
        return _constraints(self.db, self.user_uuid)

    async def changes(self, predicates: Sequence[str]) -> list[int]:
        return list(_replaced(self.db, self.user_uuid, predicates))


class Row(Protocol):
    """A selected row, by position: SQLite's tuple, asyncpg's ``Record``."""

    def __getitem__(self, index: int, /) -> Any: ...


def stored_fact(row: Row) -> StoredFact:
    """A fact as both stores select it (``uuid, subject, predicate, value, kind,
    importance, trust, valid_at, invalid_at, source_keys``): a row older than a column
    holds NULL there."""
    return StoredFact(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4] or "",
        0.5 if row[5] is None else row[5],
        row[6] or "",
        row[7],
        row[8],
        json.loads(row[9]),
    )


def changed_keys(changed: Sequence[tuple[str, str | None, str]]) -> dict[str, str | None]:
    """Of changed facts (``(old source keys, replaced on, new source keys)``, the newest
    change first), the keys of the messages read: the old ones -> when they were
    replaced, the new ones -> None."""
    keys: dict[str, str | None] = {}
    for old_keys, replaced_on, new_keys in changed:
        for key in json.loads(old_keys):
            keys.setdefault(key, replaced_on)
        for key in json.loads(new_keys):
            keys.setdefault(key, None)
    return keys


def informative_order(rows: Sequence[tuple[int, int]]) -> list[int]:
    """``(id, informativeness)`` of the user's newest informative statements, newest
    first, ranked: the more signals the better, the newer the better (a score halves over
    the newest 50 statements)."""
    scored = sorted(enumerate(rows), key=lambda pair: -pair[1][1] / (1 + pair[0] / 50))
    return [int(row[0]) for _, row in scored[:INFORMATIVE]]


def assemble_statements(
    ids: Sequence[int],
    rows: dict[int, tuple[str | None, str, str]],
    replaced: dict[int, str | None],
    limit: int | None,
) -> list[Statement]:
    """The ranked ``ids`` as statements, each followed by its follow-up (``rows``: id ->
    (replied, content, said at) of the candidates and of the newest statements), each
    once by text; ids no longer in ``rows`` (deleted since ranked) are skipped."""
    pool = {i: (content, said_at) for i, (_, content, said_at) in rows.items()}
    seen: set[str] = set()
    found: list[Statement] = []
    for message_id in with_follow_ups(ids, pool)[:limit]:
        if message_id not in rows:
            continue
        replied, content, said_at = rows[message_id]
        text_key = " ".join(content.split()).casefold()
        if text_key in seen:
            continue
        seen.add(text_key)
        found.append(Statement(message_id, content, said_at, replied, replaced.get(message_id)))
    return found


def match_score(bm25: float) -> float:
    """A search hit's lexical score, 0..1, from its BM25 (positive: higher is better).
    Held a word of the query: a match, however common the word (BM25 gives a word in half
    the store's statements no weight at all)."""
    return max(MATCHED, bm25 / (1.0 + bm25) if bm25 > 0 else 0.0)


def said_hits(
    rows: Sequence[tuple[int, str, str, str]],
    scores: dict[int, float],
    ranked: Sequence[int],
    limit: int,
) -> list[SearchHit]:
    """``(id, uuid, content, said at)`` of ranked statements as search hits, by score then
    rank, each once by text, none without a score."""
    place = {message_id: rank for rank, message_id in enumerate(ranked)}
    ordered = sorted(rows, key=lambda row: (-scores.get(row[0], 0.0), place[row[0]]))
    seen: set[str] = set()
    hits: list[SearchHit] = []
    for message_id, message_uuid, content, said_at in ordered:
        text_key = " ".join(content.split()).casefold()
        if scores.get(message_id, 0.0) <= 0 or text_key in seen:
            continue
        seen.add(text_key)
        score = round(scores[message_id], 4)
        hits.append(SearchHit(message_uuid, content, said_at, score, said_by="user"))
    return hits[:limit]


def fact_hits(
    rows: Sequence[tuple[str, str, str, str, str]], query: str, limit: int
) -> list[SearchHit]:
    """Current facts (``(uuid, subject, predicate, value, valid at)``, newest first) as
    statements, by the share of the query's words each holds (``score``, 0..1: 1 holds
    them all, 0 none, as for a query without content words), then the newest. Words are
    compared as statement search reads them (``query_stems``: case, accents, plurals and
    other endings folded, so "Seat" finds "prefers: window seats"); the predicate counts
    ("seat" finds "prefers seat: aisle")."""
    words = query_stems(query)
    hits = []
    for u, subject, predicate, value, at in rows:
        text = statement(subject, predicate, value)
        shared = len(words & query_stems(text.replace("_", " ")))
        score = round(shared / len(words), 3) if words else 0.0
        hits.append(SearchHit(u, text, at, score, {"predicate": predicate}))
    hits.sort(key=lambda hit: -(hit.score or 0.0))  # stable: the newest first among equals
    return hits[:limit]


def fact_lines(facts: Sequence[tuple[str, str]]) -> list[str]:
    """``(statement, valid at)`` of current facts as the block's lines."""
    return [f"- {value} (since {at[:10]})" for value, at in facts]


def render_template(
    template: str, facts: Sequence[tuple[str, str]], max_chars: int, store: str
) -> str:
    """A stored template rendered with the user's current facts. The store has facts (for
    %{edges}); a user summary only once synthesis writes one. Past statements have no
    variable: Zep's template language has none for them, and ``templates.check`` refuses
    unknown variables, so a template shows facts only."""
    text, missing = templates.render(template, {"edges": fact_lines(facts)})
    if missing:
        log.warning("%s backend renders empty: %s", store, ",".join(sorted(set(missing))))
    return whole_lines(text, max_chars)


def _reason(exc: OSError) -> str:
    """The system's reason, as a clause ("permission denied")."""
    return (exc.strerror or type(exc).__name__).lower()


def _counts(
    db: sqlite3.Connection, user_uuid: str, terms: Sequence[str], known: dict[str, int]
) -> dict[str, int]:
    """The user's statements holding each term (those not in ``known``, counted in this
    read, are counted and added to it). Counted in the user's own rows (another user's
    many "Leeds" must not make the word common for this one), and only as far as decides
    ``split_by_frequency``: the count stops there."""
    enough = 10 * RANKED_ROWS + 1
    for term in terms:
        if term not in known:
            known[term] = db.execute(
                "SELECT count(*) FROM (SELECT rowid FROM statements_fts WHERE statements_fts"
                " MATCH ? LIMIT ?)",
                (match_expression(user_uuid, [term]), enough),
            ).fetchone()[0]
    return {term: known[term] for term in terms}


def _lexical(
    db: sqlite3.Connection, user_uuid: str, terms: Sequence[str], known: dict[str, int]
) -> list[int]:
    """The user's statements ranked by BM25 for the terms, best first. Ranking is bounded
    to about ``RANKED_ROWS`` rows whatever the history's length: the rarest terms (in the
    user's own statements) select the rows, the common ones only weigh in
    (``split_by_frequency``). When every term is common, the newest matches are ranked."""
    frequency = _counts(db, user_uuid, terms, known)
    selective, boosts = split_by_frequency(terms, frequency, RANKED_ROWS)
    if selective:
        rows = db.execute(
            "SELECT rowid FROM statements_fts WHERE statements_fts MATCH ?"
            f" ORDER BY bm25(statements_fts, 1.0, {REPLIED_WEIGHT}) LIMIT ?",
            (match_expression(user_uuid, selective, boosts), RELEVANT),
        )
    elif found := sorted((t for t in terms if frequency[t]), key=frequency.__getitem__)[
        :COMMON_TERMS
    ]:
        rows = db.execute(
            "SELECT rowid FROM (SELECT rowid,"
            f" bm25(statements_fts, 1.0, {REPLIED_WEIGHT}) AS score"
            " FROM statements_fts WHERE statements_fts MATCH ? ORDER BY rowid DESC LIMIT ?)"
            " ORDER BY score LIMIT ?",
            (match_expression(user_uuid, found), RANKED_ROWS, RELEVANT),
        )
    else:
        return []
    return [int(r[0]) for r in rows]


def _replaced(
    db: sqlite3.Connection, user_uuid: str, predicates: Sequence[str] = ()
) -> dict[int, str | None]:
    """The history of the user's facts that changed (of ``predicates`` only, the user's
    own, when given), as statements: those a replaced fact was read from (-> when it was
    replaced), then those its replacement was (-> None), the newest change first. "Which
    city did I live in before the move?" needs both, and neither says "before"."""
    topic = (
        f" AND old.subject = 'user' AND old.predicate IN ({','.join('?' * len(predicates))})"
        if predicates
        else ""
    )
    changed = db.execute(
        "SELECT old.source_keys, old.invalid_at, new.source_keys FROM facts old JOIN facts new"
        " ON new.user_uuid = old.user_uuid AND new.subject = old.subject"
        " AND new.predicate = old.predicate AND new.invalid_at IS NULL"
        f" WHERE old.user_uuid = ? AND old.invalid_at IS NOT NULL{topic}"
        " ORDER BY old.invalid_at DESC LIMIT ?",
        (user_uuid, *predicates, CHANGED_FACTS),
    ).fetchall()
    keys = changed_keys(changed)
    if not keys:
        return {}
    marks = ",".join("?" * len(keys))
    rows = db.execute(
        f"SELECT id, message_key FROM messages WHERE user_uuid = ? AND eligible = 1"
        f" AND message_key IN ({marks})",
        (user_uuid, *keys),
    ).fetchall()
    by_key = {key: message_id for message_id, key in rows}
    return {by_key[key]: on for key, on in keys.items() if key in by_key}


def _constraints(db: sqlite3.Connection, user_uuid: str) -> list[int]:
    """The eligible statements the user's current facts of ``CONSTRAINTS`` were read from,
    the most important fact's first (``ranking.relevant``)."""
    marks = ",".join("?" * len(CONSTRAINTS))
    facts = db.execute(
        "SELECT source_keys FROM facts WHERE user_uuid = ? AND subject = 'user'"
        f" AND invalid_at IS NULL AND predicate IN ({marks})"
        " ORDER BY importance DESC, valid_at DESC LIMIT ?",
        (user_uuid, *sorted(CONSTRAINTS), MAX_CONSTRAINTS),
    ).fetchall()
    keys = constraint_keys(row[0] for row in facts)
    if not keys:
        return []
    rows = db.execute(
        f"SELECT id, message_key FROM messages WHERE user_uuid = ? AND eligible = 1"
        f" AND message_key IN ({','.join('?' * len(keys))})",
        (user_uuid, *keys),
    ).fetchall()
    by_key = {key: message_id for message_id, key in rows}
    return [by_key[key] for key in keys if key in by_key]


def constraint_keys(source_keys: Iterable[str]) -> list[str]:
    """The message keys of facts' ``source_keys`` (JSON lists), in order, each once."""
    return list(dict.fromkeys(key for keys in source_keys for key in json.loads(keys)))


def _stored_key(db: sqlite3.Connection, thread_uuid: str, key: object, content: str) -> object:
    """The message key a message is stored under in its thread. Another text under a
    stored key is another message (a client reused an invocation id: the queue keeps
    both), stored under the key and its text's checksum; the same text again is the same
    message."""
    if key is None:
        return None
    found = db.execute(
        "SELECT content FROM messages WHERE thread_uuid = ? AND message_key = ?",
        (thread_uuid, key),
    ).fetchone()
    if found is None or found[0] == content:
        return key
    return f"{key}#{checksum(content)}"


def _asked_about(db: sqlite3.Connection, user_uuid: str, value: str) -> list[int]:
    """The user's statements whose kept question names ``value`` (as whole words)."""
    if not value.strip():
        return []
    words = re.compile(rf"(?<!\w){re.escape(value.casefold())}(?!\w)")
    rows = db.execute(
        "SELECT id, replied FROM messages WHERE user_uuid = ? AND replied IS NOT NULL",
        (user_uuid,),
    )
    return [int(row[0]) for row in rows if words.search(row[1].casefold())]


#: The shortest statement (normalised, ``_normal``) whose repetition marks a reply as
#: repeating it: a shorter one ("yes", "in Oslo") is in replies that never quoted it.
MIN_REPEATED = 12


def _normal(text: str) -> str:
    """Text as compared for repetition: NFKC, casefolded, its words one space apart and
    padded by one (so containment is of whole words), whatever quotes, punctuation, line
    breaks or list marks a model re-rendered it with."""
    words = re.findall(r"\w+", unicodedata.normalize("NFKC", text).casefold())
    return f" {' '.join(words)} " if words else ""


def repeating(
    said: list[str], replies: Iterable[tuple[int, str]], *, predicate: str, value: str
) -> list[int]:
    """The ids of the user's stored assistant ``replies`` (id, text) that repeat a fact: one
    of the statements it was read from (``said``, normalised, at least ``MIN_REPEATED``
    characters), or the fact itself, its value and its predicate each there as whole words
    ("allergic to: peanuts", "you are allergic to peanuts": a predicate is stored
    ``allergic_to`` and said as the block says it, with spaces)."""
    quotes = [q for q in map(_normal, said) if len(q.strip()) >= MIN_REPEATED]
    named, relation = _normal(value), _normal(predicate.replace("_", " "))
    found = []
    for message_id, content in replies:
        text = _normal(content)
        if any(q in text for q in quotes) or (
            named and named in text and (not relation or relation in text)
        ):
            found.append(int(message_id))
    return found


def _unlink_reply(db: sqlite3.Connection, asked: int) -> None:
    """Before the assistant turn ``asked`` is deleted: the statement that replied to it
    keeps a copy of it (``replied``, shown and indexed with it), which goes too."""
    found = db.execute(
        "SELECT id FROM messages WHERE thread_uuid ="
        " (SELECT thread_uuid FROM messages WHERE id = ?) AND id > ? ORDER BY id LIMIT 1",
        (asked, asked),
    ).fetchone()
    if found is not None:
        _drop_reply(db, found[0])


def _drop_reply(db: sqlite3.Connection, reply: int) -> None:
    """The statement ``reply`` no longer keeps the question it answered (row and index)."""
    found = db.execute(
        "SELECT content, user_uuid, replied, eligible FROM messages WHERE id = ?", (reply,)
    ).fetchone()
    if found is None or found[2] is None:
        return
    content, user_uuid, replied, eligible = found
    db.execute("UPDATE messages SET replied = NULL WHERE id = ?", (reply,))
    if eligible:
        _index(db, reply, user_uuid, content, replied, delete=True)
        _index(db, reply, user_uuid, content, None)


def _index(
    db: sqlite3.Connection,
    message_id: int,
    user_uuid: str,
    content: str,
    replied: str | None,
    *,
    delete: bool = False,
) -> None:
    """Add a statement to the index in its owner's scope, or (``delete``) remove it: a
    contentless index must be told the very terms it was given."""
    values = (message_id, scoped(user_uuid, content), scoped(user_uuid, replied))
    if delete:
        db.execute(
            "INSERT INTO statements_fts(statements_fts, rowid, content, replied)"
            " VALUES ('delete', ?, ?, ?)",
            values,
        )
    else:
        db.execute("INSERT INTO statements_fts(rowid, content, replied) VALUES (?, ?, ?)", values)


def _reply_context(previous: tuple[str, str, bool] | None) -> str | None:
    """The question a statement replies to, as stored with it: the one the assistant's
    turn just before asked (``question_in``: never a long reply, never a memory block),
    if that turn passed validation too (it enters the block and the index)."""
    if previous is None or previous[0] != "assistant" or not previous[2]:
        return None
    return question_in(previous[1])


def _migrate(db: sqlite3.Connection, *, upgrade: bool) -> None:
    """Bring a file to the current schema, once, in one transaction (another process may
    be doing the same: the write lock decides, the loser finds it done): a file from
    before version 2 has the columns decided at write time computed for every stored
    message; every older file has its eligible statements indexed afresh. A new file
    takes the same path, with nothing to do."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version >= SCHEMA_VERSION:
        return
    if not upgrade and db.execute("SELECT 1 FROM messages LIMIT 1").fetchone():
        raise BackendError("unavailable", code="schema_upgrade_pending")
    # Validation costs about a millisecond a message: it is done before the write lock is
    # taken, so other processes keep writing meanwhile (what they add is judged inside).
    verdicts = {
        message_id: _verdict(role, content, bool(ingested))
        for message_id, role, content, ingested in (
            db.execute("SELECT id, role, content, ingested FROM messages") if version < 2 else ()
        )
    }
    # Off while the messages table is rebuilt (version 7): dropping it would otherwise
    # delete its vectors (it can be changed only outside a transaction).
    db.execute("PRAGMA foreign_keys=OFF")
    db.execute("BEGIN IMMEDIATE")
    try:
        if db.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
            if version < 2:
                _add_columns(db, verdicts)
            _rebuild_messages(db)
            if version < 6:
                _keys_per_thread(db)
            for statement in RETRIEVAL_SCHEMA:
                db.execute(statement)
            rows = db.execute(
                "SELECT id, user_uuid, content, replied FROM messages WHERE eligible = 1"
            ).fetchall()
            for message_id, user_uuid, content, replied in rows:
                _index(db, message_id, user_uuid, content, replied)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.commit()
    except BaseException:
        db.rollback()
        raise
    finally:
        db.execute("PRAGMA foreign_keys=ON")


def _rebuild_messages(db: sqlite3.Connection) -> None:
    """Version 7 (and, with it, 6): the messages table made again with ids that are never
    reused, and a key unique in its thread where it was unique in the file (another
    deployment's import of the same session was taken for a replay and stored nothing).
    The messages keep their ids (the index's and the vectors' rowids). The ids go on far
    past the greatest kept (``ID_GAP``): the file does not say which ids were given to rows
    deleted since, and a synthesis watermark may be one of them. A table that already has
    both is left."""
    (made,) = db.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'messages'"
    ).fetchone()
    if "AUTOINCREMENT" not in made.upper():
        columns = ", ".join(r[1] for r in db.execute("PRAGMA table_info(messages)"))
        db.execute(f"CREATE TABLE messages_rebuilt ({MESSAGES_COLUMNS})")
        db.execute(f"INSERT INTO messages_rebuilt ({columns}) SELECT {columns} FROM messages")
        db.execute("DROP TABLE messages")
        db.execute("ALTER TABLE messages_rebuilt RENAME TO messages")
        db.execute("DELETE FROM sqlite_sequence WHERE name = 'messages'")
        db.execute(
            "INSERT INTO sqlite_sequence (name, seq)"
            " SELECT 'messages', coalesce(max(id), 0) + ? FROM messages",
            (ID_GAP,),
        )
    for index in MESSAGES_INDEXES:
        db.execute(index)


def _keys_per_thread(db: sqlite3.Connection) -> None:
    """Version 6: a call's key kept per thread, where it was unique in the file. The
    file-wide call keys go: which thread each was for is not recorded, and a call sent
    again is stored once all the same, by its messages' keys, which every writer's
    messages carry."""
    if "thread_uuid" not in {r[1] for r in db.execute("PRAGMA table_info(idempotency)")}:
        db.execute("DROP TABLE idempotency")
        db.execute(f"CREATE TABLE idempotency ({IDEMPOTENCY_COLUMNS})")


def _add_columns(db: sqlite3.Connection, verdicts: dict[int, _Verdict]) -> None:
    """The columns of version 2, computed for every stored message (``verdicts``: those
    judged before the lock was taken)."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(messages)")}
    for column in ADDED_COLUMNS:
        if column.split()[0] not in columns:
            db.execute(f"ALTER TABLE messages ADD COLUMN {column}")
    db.execute(
        "UPDATE messages SET user_uuid ="
        " (SELECT user_uuid FROM threads WHERE uuid = messages.thread_uuid)"
    )
    rows = db.execute(
        "SELECT id, role, content, ingested, thread_uuid FROM messages ORDER BY thread_uuid, id"
    ).fetchall()
    previous: tuple[str, str, bool] | None = None
    thread = None
    for message_id, role, content, ingested, thread_uuid in rows:
        if thread_uuid != thread:
            previous, thread = None, thread_uuid
        verdict = verdicts.get(message_id) or _verdict(role, content, bool(ingested))
        replied = _reply_context(previous) if verdict.eligible else None
        previous = (role, content, verdict.clean)
        db.execute(
            "UPDATE messages SET clean = ?, eligible = ?, informative = ?, replied = ?"
            " WHERE id = ?",
            (int(verdict.clean), int(verdict.eligible), verdict.informative, replied, message_id),
        )
