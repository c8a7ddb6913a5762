"""The embedded backend: a durable SQLite file with users, threads, messages, facts and
full-text search. Used without ``ZEP_API_KEY``; safe to share between the agent and the
worker processes (WAL mode)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sqlite3
import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from afterthought import templates
from afterthought.backends.base import (
    MESSAGE_KEY_FIELD,
    BackendError,
    Capabilities,
    HistoryMessage,
    MemoryBackend,
    OutgoingMessage,
    StoredMessage,
    UserRef,
)
from afterthought.facts import Fact, StoredFact
from afterthought.search import SearchHit, SearchRequest

T = TypeVar("T")
log = logging.getLogger("afterthought.local")

SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
  uuid TEXT PRIMARY KEY, user_id TEXT UNIQUE NOT NULL, graph_uuid TEXT NOT NULL,
  first_name TEXT, last_name TEXT, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS threads (
  uuid TEXT PRIMARY KEY, user_uuid TEXT NOT NULL REFERENCES users(uuid) ON DELETE CASCADE,
  idempotency_key TEXT UNIQUE, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
  id INTEGER PRIMARY KEY, uuid TEXT UNIQUE NOT NULL,
  thread_uuid TEXT NOT NULL REFERENCES threads(uuid) ON DELETE CASCADE,
  message_key TEXT UNIQUE, role TEXT NOT NULL, name TEXT, content TEXT NOT NULL,
  metadata TEXT NOT NULL, reference_time TEXT, ingested INTEGER NOT NULL,
  created_at TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS messages_thread ON messages(thread_uuid, id);
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
  content, content='messages', content_rowid='id');
CREATE TRIGGER IF NOT EXISTS messages_ai AFTER INSERT ON messages BEGIN
  INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END;
CREATE TRIGGER IF NOT EXISTS messages_ad AFTER DELETE ON messages BEGIN
  INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TABLE IF NOT EXISTS facts (
  uuid TEXT PRIMARY KEY, user_uuid TEXT NOT NULL REFERENCES users(uuid) ON DELETE CASCADE,
  subject TEXT NOT NULL, predicate TEXT NOT NULL, value TEXT NOT NULL,
  kind TEXT, confidence REAL, importance REAL, trust TEXT, source_keys TEXT NOT NULL,
  valid_at TEXT NOT NULL, invalid_at TEXT, created_at TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS facts_user ON facts(user_uuid, invalid_at);
CREATE UNIQUE INDEX IF NOT EXISTS facts_unique
  ON facts(user_uuid, subject, predicate, value, source_keys);
CREATE TABLE IF NOT EXISTS idempotency (key TEXT PRIMARY KEY, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS templates (
  uuid TEXT PRIMARY KEY, name TEXT UNIQUE NOT NULL, template TEXT NOT NULL,
  created_at TEXT NOT NULL);
"""

_WORD = re.compile(r"\w{3,}", re.UNICODE)


def _now() -> str:
    return datetime.now(UTC).isoformat()


class LocalBackend(MemoryBackend):
    name = "local"
    capabilities = Capabilities(
        extracts_facts=False, ignores_roles=False, async_deletes=False, ingests_async=False
    )

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            if str(self.path) != ":memory:":
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                # Memory is personal data: the file is created private to its owner.
                os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
            db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA foreign_keys=ON")
            # Deleted rows are overwritten, not left in free pages: forgetting is for real.
            db.execute("PRAGMA secure_delete=ON")
            db.executescript(SCHEMA)
            self._db = db
        return self._db

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def locked() -> T:
            with self._lock:
                db = self._connect()
                try:
                    with db:
                        return work(db)
                except sqlite3.OperationalError as exc:
                    raise BackendError("unavailable", code=type(exc).__name__) from None

        return await asyncio.to_thread(locked)

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
        def work(db: sqlite3.Connection) -> str | None:
            found = db.execute(
                "SELECT t.user_uuid, u.graph_uuid FROM threads t JOIN users u"
                " ON u.uuid = t.user_uuid WHERE t.uuid = ?",
                (thread_uuid,),
            ).fetchone()
            if not found:
                raise BackendError("not_found", status=404, code="thread")
            seen = db.execute(
                "INSERT OR IGNORE INTO idempotency VALUES (?, ?)", (idempotency_key, _now())
            )
            for m in messages if seen.rowcount else ():
                # The unique message key makes a replay under a new batch key a no-op too.
                db.execute(
                    "INSERT OR IGNORE INTO messages (uuid, thread_uuid, message_key, role, name,"
                    " content, metadata, reference_time, ingested, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        str(uuid.uuid4()),
                        thread_uuid,
                        m.metadata.get(MESSAGE_KEY_FIELD),
                        m.role or "",
                        m.name,
                        m.content,
                        json.dumps(dict(m.metadata)),
                        m.reference_time,
                        int(m.role not in ignore_roles),
                        _now(),
                    ),
                )
            if not return_context:
                return None
            query = " ".join(m.content for m in messages if m.role == "user")
            return self._context(db, UserRef(found[0], found[1]), query, 4000)

        return await self._run(work)

    async def recent_messages(
        self, *, thread_uuid: str, limit: int, timeout: float | None = None
    ) -> list[StoredMessage]:
        def work(db: sqlite3.Connection) -> list[StoredMessage]:
            rows = db.execute(
                "SELECT uuid, role, content, metadata FROM messages WHERE thread_uuid = ?"
                " ORDER BY id DESC LIMIT ?",
                (thread_uuid, limit),
            ).fetchall()
            return [StoredMessage(r[0], r[1], r[2], json.loads(r[3])) for r in rows]

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
        async with asyncio.timeout(timeout):
            return await self._run(
                lambda db: self._context(db, user, query, max_chars, template_uuid)
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
            (value if predicate == "noted" else f"{predicate.replace('_', ' ')}: {value}", at)
            for predicate, value, at in db.execute(
                "SELECT predicate, value, valid_at FROM facts WHERE user_uuid = ?"
                " AND invalid_at IS NULL ORDER BY importance DESC, valid_at DESC LIMIT 1000",
                (user.user_uuid,),
            )
        ]
        if template_uuid is None:
            return _render(facts, max_chars)
        row = db.execute("SELECT template FROM templates WHERE uuid = ?", (template_uuid,))
        found = row.fetchone()
        if found is None:
            raise BackendError("not_found", status=404, code="template")
        # The store has facts (for %{edges}); a user summary only once synthesis writes one.
        text, missing = templates.render(
            found[0], {"edges": [f"- {v} (since {at[:10]})" for v, at in facts]}
        )
        if missing:
            log.warning("local backend renders empty: %s", ",".join(sorted(set(missing))))
        return text[:max_chars]

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

    @staticmethod
    def _user_statements(
        db: sqlite3.Connection, user_uuid: str, query: str
    ) -> list[tuple[str, str, str]]:
        """What the user said before: matches for the query first, then the most recent;
        ``(uuid, content, at)``."""
        base = (
            "SELECT m.id, m.content, m.reference_time, m.uuid FROM messages m"
            " JOIN threads t ON t.uuid = m.thread_uuid"
            " WHERE t.user_uuid = ? AND m.role = 'user' AND m.ingested = 1"
        )
        words = sorted({w.lower() for w in _WORD.findall(query)})[:16]
        matched: list[tuple[int, str, str]] = []
        if words:
            expression = " OR ".join(f'"{w}"' for w in words)
            matched = db.execute(
                f"{base} AND m.id IN (SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?"
                " ORDER BY bm25(messages_fts) LIMIT 10)",
                (user_uuid, expression),
            ).fetchall()
        recent = db.execute(f"{base} ORDER BY m.id DESC LIMIT 10", (user_uuid,)).fetchall()
        seen: set[int] = set()
        ordered: list[tuple[str, str, str]] = []
        for row_id, content, at, message_uuid in [*matched, *recent]:
            if row_id not in seen:
                seen.add(row_id)
                ordered.append((message_uuid, content, at or ""))
        return ordered

    async def add_fact(
        self, *, user: UserRef, text: str, key: str, trust: str, reference_time: str
    ) -> None:
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
            db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('optimize')")

        def checkpoint(db: sqlite3.Connection) -> bool:
            busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            return not busy

        await self._run(work)
        # The checkpoint waits out readers in other processes (the busy timeout); if one
        # still holds the WAL open, old page images remain: say so, so it is retried.
        if not await self._run(checkpoint):
            raise BackendError("unavailable", code="scrub_busy")

    async def delete_memory(self, *, user: UserRef, memory_uuid: str) -> bool:
        def work(db: sqlite3.Connection) -> bool:
            facts = db.execute(
                "DELETE FROM facts WHERE uuid = ? AND user_uuid = ?", (memory_uuid, user.user_uuid)
            )
            messages = db.execute(
                "DELETE FROM messages WHERE uuid = ? AND thread_uuid IN"
                " (SELECT uuid FROM threads WHERE user_uuid = ?)",
                (memory_uuid, user.user_uuid),
            )
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
            return [
                StoredFact(
                    r[0],
                    r[1],
                    r[2],
                    r[3],
                    r[4] or "",
                    0.5 if r[5] is None else r[5],
                    r[6] or "",
                    r[7],
                    r[8],
                    json.loads(r[9]),
                )
                for r in rows
            ]

        return await self._run(work)

    async def write_facts(
        self, *, user: UserRef, add: Sequence[Fact], invalidate: Sequence[str], at: str
    ) -> None:
        def work(db: sqlite3.Connection) -> None:  # one transaction: all or nothing
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
                text = self._context(db, UserRef(user[0], graph_uuid), request.query, 4000)
                return [SearchHit(uuid="context", text=text)] if text else []
            if request.scope == "edges":
                return self._facts(db, user[0], request.query, request.limit)
            if request.scope == "episodes":
                rows = self._user_statements(db, user[0], request.query)
                return [SearchHit(uuid=i, text=c, created_at=at) for i, c, at in rows][
                    : request.limit
                ]
            return []

        async with asyncio.timeout(timeout):
            return await self._run(work)

    @staticmethod
    def _facts(db: sqlite3.Connection, user_uuid: str, query: str, limit: int) -> list[SearchHit]:
        rows = db.execute(
            "SELECT uuid, value, valid_at FROM facts WHERE user_uuid = ? AND invalid_at IS NULL"
            " ORDER BY valid_at DESC",
            (user_uuid,),
        ).fetchall()
        words = {w.lower() for w in _WORD.findall(query)}
        ranked = sorted(rows, key=lambda r: -len(words & {w.lower() for w in _WORD.findall(r[1])}))
        return [SearchHit(uuid=u, text=v, created_at=at) for u, v, at in ranked[:limit]]

    async def aclose(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def _render(facts: list[tuple[str, str]], max_chars: int) -> str:
    """Current facts only (R3: the block carries validated facts, never raw statements);
    whole lines only, so the block never ends mid-sentence."""
    out: list[str] = []
    size = 0
    for value, at in facts:
        line = f"- {value} (since {at[:10]})"
        if size + len(line) + 1 > max_chars:
            break
        out.append(line)
        size += len(line) + 1
    return "\n".join(["# Facts about the user", *out]) if out else ""
