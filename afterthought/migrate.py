"""``afterthought migrate --to postgres``: a local store's memory copied into the
PostgreSQL store, row for row: users, threads, call keys, messages (keys, reference times,
the verdicts made when they were written), facts with their validity and provenance,
templates, and the secrets the store keeps (the tombstone key: Redis's tombstones stay
readable).

Every row keeps its uuid, so a run adds only what the PostgreSQL store does not hold yet
(``ON CONFLICT DO NOTHING``): run it again after an interruption, and it goes on where it
stopped. Messages are copied in the order they were written, a batch a transaction, so a
run stopped anywhere leaves a prefix, and the next run appends the rest in order: ranking
ties and "newest first" are then the local store's. Each statement is indexed as the
PostgreSQL store indexes what it is given (``postgres._terms``, under a new key of the
user's). What is copied is counted, never shown."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from afterthought.backends.local import LocalBackend
from afterthought.backends.postgres import (
    PostgresBackend,
    _id,
    _terms,
    connect_failure,
)

if TYPE_CHECKING:
    from afterthought.backends.postgres import Db

#: Rows read and written per transaction.
BATCH = 1000

Row = tuple[Any, ...]
Key = tuple[str, ...]


@dataclass
class Count:
    """One table's rows: in the local store, already in the PostgreSQL store, copied (in a
    dry run: to be copied), and skipped (the PostgreSQL store holds another row under one
    of its unique values, or cannot hold the text)."""

    found: int = 0
    present: int = 0
    copied: int = 0
    skipped: int = 0


@dataclass
class Report:
    dry_run: bool
    store: str
    tables: dict[str, Count] = field(default_factory=dict)
    #: Secrets the PostgreSQL store keeps with another value than the local store's.
    differing_secrets: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "to": "postgres",
            "store": self.store,
            "dry_run": self.dry_run,
            "tables": {name: vars(count) for name, count in self.tables.items()},
            "differing_secrets": self.differing_secrets,
        }

    @property
    def complete(self) -> bool:
        return not self.differing_secrets and not any(c.skipped for c in self.tables.values())


@dataclass(frozen=True)
class _Table:
    """How one table is copied. ``source``: the local rows after a rowid, its first column
    the rowid; ``key``: a row's identity in the PostgreSQL store; ``present``: which of the
    keys given (one text array per key column) the PostgreSQL store holds; ``insert``: the
    rows given (one array per column, in ``types``), those whose owner was copied, returning
    the key of each row added."""

    name: str
    source: str
    key: Callable[[Row], Key]
    present: str
    insert: str
    types: tuple[str, ...]


def _unnest(types: Sequence[str]) -> str:
    return ", ".join(f"${n}::{t}[]" for n, t in enumerate(types, start=1))


_USER_TYPES = ("text", "text", "text", "text", "text", "bytea", "text")
_THREAD_TYPES = ("text", "text", "text", "text")
_CALL_TYPES = ("text", "text", "text")
_MESSAGE_TYPES = (
    *("text",) * 8,
    "boolean",
    "text",
    "text",
    "boolean",
    "boolean",
    "integer",
    "text",
    "integer",
    "text",
)
_FACT_TYPES = (*("text",) * 6, "float8", "float8", *("text",) * 5)
_TEMPLATE_TYPES = ("text", "text", "text", "text")
_SECRET_TYPES = ("text", "text")

TABLES = (
    _Table(
        "users",
        "SELECT rowid, uuid, user_id, graph_uuid, first_name, last_name, created_at"
        " FROM users WHERE rowid > ? ORDER BY rowid LIMIT ?",
        lambda r: (r[1],),
        "SELECT uuid FROM users WHERE uuid = ANY($1::text[])",
        f"INSERT INTO users SELECT * FROM unnest({_unnest(_USER_TYPES)})"
        " ON CONFLICT DO NOTHING RETURNING uuid",
        _USER_TYPES,
    ),
    _Table(
        "threads",
        "SELECT rowid, uuid, user_uuid, idempotency_key, created_at"
        " FROM threads WHERE rowid > ? ORDER BY rowid LIMIT ?",
        lambda r: (r[1],),
        "SELECT uuid FROM threads WHERE uuid = ANY($1::text[])",
        f"INSERT INTO threads SELECT * FROM unnest({_unnest(_THREAD_TYPES)}) AS b(u, o, k, c)"
        " WHERE EXISTS (SELECT 1 FROM users WHERE uuid = b.o)"
        " ON CONFLICT DO NOTHING RETURNING uuid",
        _THREAD_TYPES,
    ),
    _Table(
        "idempotency",
        "SELECT rowid, thread_uuid, key, created_at"
        " FROM idempotency WHERE rowid > ? ORDER BY rowid LIMIT ?",
        lambda r: (r[1], _id(r[2])),
        "SELECT i.thread_uuid, i.key FROM idempotency i"
        " JOIN unnest($1::text[], $2::text[]) AS b(t, k) ON i.thread_uuid = b.t AND i.key = b.k",
        f"INSERT INTO idempotency SELECT * FROM unnest({_unnest(_CALL_TYPES)}) AS b(t, k, c)"
        " WHERE EXISTS (SELECT 1 FROM threads WHERE uuid = b.t)"
        " ON CONFLICT DO NOTHING RETURNING thread_uuid, key",
        _CALL_TYPES,
    ),
    _Table(
        "messages",
        # The owner from the thread: the column is the thread's owner, kept for retrieval.
        "SELECT m.id, m.uuid, m.thread_uuid, m.message_key, m.role, m.name, m.content,"
        " m.metadata, m.reference_time, m.ingested, m.created_at, t.user_uuid, m.clean,"
        " m.eligible, m.informative, m.replied FROM messages m"
        " JOIN threads t ON t.uuid = m.thread_uuid WHERE m.id > ? ORDER BY m.id LIMIT ?",
        lambda r: (r[1],),
        "SELECT uuid FROM messages WHERE uuid = ANY($1::text[])",
        "INSERT INTO messages (uuid, thread_uuid, message_key, role, name, content, metadata,"
        " reference_time, ingested, created_at, user_uuid, clean, eligible, informative,"
        " replied, tokens, terms)"
        " SELECT u, t, k, r, n, c, md, rt, i, ca, us, cl, e, inf, rp, tk, tv::tsvector"
        f" FROM unnest({_unnest(_MESSAGE_TYPES)}) WITH ORDINALITY"
        " AS b(u, t, k, r, n, c, md, rt, i, ca, us, cl, e, inf, rp, tk, tv, o)"
        " WHERE EXISTS (SELECT 1 FROM threads th WHERE th.uuid = b.t AND th.user_uuid = b.us)"
        " ORDER BY o ON CONFLICT DO NOTHING RETURNING uuid",
        _MESSAGE_TYPES,
    ),
    _Table(
        "facts",
        "SELECT rowid, uuid, user_uuid, subject, predicate, value, kind, confidence,"
        " importance, trust, source_keys, valid_at, invalid_at, created_at"
        " FROM facts WHERE rowid > ? ORDER BY rowid LIMIT ?",
        lambda r: (r[1],),
        "SELECT uuid FROM facts WHERE uuid = ANY($1::text[])",
        f"INSERT INTO facts SELECT * FROM unnest({_unnest(_FACT_TYPES)})"
        " AS b(u, o, s, p, v, k, c, i, t, sk, va, ia, ca)"
        " WHERE EXISTS (SELECT 1 FROM users WHERE uuid = b.o)"
        " ON CONFLICT DO NOTHING RETURNING uuid",
        _FACT_TYPES,
    ),
    _Table(
        "templates",
        "SELECT rowid, uuid, name, template, created_at"
        " FROM templates WHERE rowid > ? ORDER BY rowid LIMIT ?",
        lambda r: (r[1],),
        "SELECT uuid FROM templates WHERE uuid = ANY($1::text[])",
        f"INSERT INTO templates SELECT * FROM unnest({_unnest(_TEMPLATE_TYPES)})"
        " ON CONFLICT DO NOTHING RETURNING uuid",
        _TEMPLATE_TYPES,
    ),
    _Table(
        "secrets",
        # The store's id is not copied: it names the store, and the PostgreSQL store has its own.
        "SELECT rowid, key, value FROM meta WHERE key LIKE 'secret:%' AND rowid > ?"
        " ORDER BY rowid LIMIT ?",
        lambda r: (r[1],),
        "SELECT key FROM meta WHERE key = ANY($1::text[])",
        f"INSERT INTO meta SELECT * FROM unnest({_unnest(_SECRET_TYPES)})"
        " ON CONFLICT DO NOTHING RETURNING key",
        _SECRET_TYPES,
    ),
)


def _batches(source: sqlite3.Connection, sql: str) -> Iterator[list[Row]]:
    after = 0
    while rows := source.execute(sql, (after, BATCH)).fetchall():
        yield rows
        after = rows[-1][0]


async def _columns(db: Db, table: str, rows: Sequence[Row]) -> list[Row]:
    """The rows of ``table`` as the PostgreSQL store holds them, less the messages it cannot
    hold (a NUL character)."""
    if table == "users":
        return [
            (u, _id(i), g, f and _id(f), n and _id(n), os.urandom(16), c)
            for _, u, i, g, f, n, c in rows
        ]
    if table == "threads":
        return [(u, o, k and _id(k), c) for _, u, o, k, c in rows]
    if table == "idempotency":
        return [(t, _id(k), c) for _, t, k, c in rows]
    if table != "messages":
        return [tuple(r[1:]) for r in rows]
    keys = {
        r[0]: r[1]
        for r in await db.fetch(
            "SELECT uuid, term_key FROM users WHERE uuid = ANY($1::text[])",
            list({r[11] for r in rows}),
        )
    }
    out: list[Row] = []
    for _, u, t, k, role, name, content, md, rt, ing, ca, us, clean, elig, inf, rp in rows:
        if "\x00" in content or (k is not None and "\x00" in k):  # text holds no NUL
            continue
        term_key = keys.get(us)
        tokens, terms = _terms(term_key, content, rp) if elig and term_key else (0, None)
        written = (u, t, k, role, name and _id(name), content, md, rt, bool(ing), ca, us)
        out.append((*written, bool(clean), bool(elig), inf, rp, tokens, terms))
    return out


async def _copy_batch(
    target: PostgresBackend, table: _Table, rows: Sequence[Row], count: Count, apply: bool
) -> None:
    keys = [table.key(r) for r in rows]

    async def work(db: Db) -> None:
        held = {
            tuple(r) for r in await db.fetch(table.present, *map(list, zip(*keys, strict=True)))
        }
        new = [r for r, k in zip(rows, keys, strict=True) if k not in held]
        count.present += len(rows) - len(new)
        if not apply:
            count.copied += len(new)
            return
        columns = await _columns(db, table.name, new)
        added = (
            await db.fetch(table.insert, *map(list, zip(*columns, strict=True))) if columns else []
        )
        count.copied += len(added)
        count.skipped += len(new) - len(added)

    await target._run(work)


async def _differing(target: PostgresBackend, source: sqlite3.Connection) -> list[str]:
    mine = dict(source.execute("SELECT key, value FROM meta WHERE key LIKE 'secret:%'").fetchall())

    async def work(db: Db) -> list[str]:
        theirs = await db.fetch(
            "SELECT key, value FROM meta WHERE key = ANY($1::text[])", list(mine)
        )
        return sorted(r[0].removeprefix("secret:") for r in theirs if r[1] != mine[r[0]])

    return await target._run(work)


async def _schema_exists(target: PostgresBackend) -> bool:
    """Whether the PostgreSQL store was ever created (a dry run creates nothing)."""
    import asyncpg

    try:
        db = await asyncpg.connect(target._url)
    except Exception as exc:  # refused, unknown host, bad password: as the store says it
        raise connect_failure(exc, target.where) from None
    try:
        return bool(
            await db.fetchval(
                "SELECT to_regclass(quote_ident($1) || '.schema_migrations') IS NOT NULL",
                target.schema,
            )
        )
    finally:
        await db.close()


async def to_postgres(path: Path, target: PostgresBackend, *, apply: bool) -> Report:
    """Copy the local store at ``path`` into ``target`` (``apply``), or count what a copy
    would add. The local store is brought to its current schema first, as every command
    that opens it does."""
    if not path.exists():
        raise ValueError(f"no local store at {path} (local_db_path, AFTERTHOUGHT_LOCAL_DB_PATH)")
    local = LocalBackend(path, upgrade=True)
    try:
        await local.prepare()
    finally:
        await local.aclose()
    report = Report(dry_run=not apply, store=target.where)
    exists = apply or await _schema_exists(target)
    source = sqlite3.connect(path)
    try:
        for table in TABLES:
            count = report.tables.setdefault(table.name, Count())
            for rows in _batches(source, table.source):
                count.found += len(rows)
                if exists:
                    await _copy_batch(target, table, rows, count, apply)
                else:
                    count.copied += len(rows)
        if exists:
            report.differing_secrets = await _differing(target, source)
    finally:
        source.close()
    return report
