"""``afterthought migrate --to postgres`` on the machine's real PostgreSQL (a schema of the
test's own): a local store copied whole, the copy's blocks the local store's for the same
questions, a forgotten user nowhere, a second run copying nothing, a run stopped midway
finished by the next, and a dry run that creates nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from afterthought import cli, migrate
from afterthought.backends.local import LocalBackend
from afterthought.backends.postgres import PostgresBackend
from afterthought.search import SearchRequest
from afterthought.tombstones import STORE_SECRET
from tests.conftest import DATABASE_URL
from tests.test_postgres import FIXTURE, fill, rows_of_every_table

PEOPLE = [json.loads(p.read_text()) for p in sorted(FIXTURE.glob("*.json"))[:5]]


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalBackend]:
    backend = LocalBackend(tmp_path / "memory.sqlite3")
    yield backend
    await backend.aclose()


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, postgres_schema: str) -> None:
    for name in ("ZEP_API_KEY", "AFTERTHOUGHT_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AFTERTHOUGHT_LOCAL_DB_PATH", str(tmp_path / "memory.sqlite3"))
    monkeypatch.setenv("AFTERTHOUGHT_DATABASE_URL", DATABASE_URL)
    monkeypatch.setenv("AFTERTHOUGHT_DATABASE_SCHEMA", postgres_schema)


async def main(*flags: str) -> int:
    """The command, from a thread: it runs a loop of its own."""
    return await asyncio.to_thread(cli.main, ["migrate", "--to", "postgres", *flags])


async def run(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, dict[str, Any]]:
    code = await main(*flags)
    out, err = capsys.readouterr()
    assert code != cli.UNREACHABLE, err
    return code, json.loads(out)


def copied(report: dict[str, Any]) -> dict[str, int]:
    return {name: count["copied"] for name, count in report["tables"].items()}


async def test_a_local_store_is_copied_once_and_answers_as_it_did(
    environment: None,
    local: LocalBackend,
    postgres_schema: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    users = await fill(local, PEOPLE)
    forgotten = str(PEOPLE[-1]["user"])
    await local.delete_user(user=users.pop(forgotten))
    secret = await local.kept_secret(STORE_SECRET)
    await local.aclose()

    code, dry = await run(capsys)
    assert code == cli.USAGE and dry["dry_run"]
    db = await asyncpg.connect(DATABASE_URL)
    try:  # a dry run creates nothing
        assert not await db.fetchval(
            "SELECT 1 FROM pg_namespace WHERE nspname = $1", postgres_schema
        )
    finally:
        await db.close()

    code, first = await run(capsys, "--yes")
    assert code == cli.OK, first
    assert copied(first) == copied(dry)
    assert all(c["skipped"] == 0 for c in first["tables"].values())
    messages = first["tables"]["messages"]
    assert messages["copied"] == messages["found"] > 100
    assert first["tables"]["facts"]["copied"] == 3 * len(users)
    assert first["tables"]["users"]["copied"] == len(users)
    said = {t["text"] for p in PEOPLE for s in p["sessions"] for t in s["turns"]}
    printed = json.dumps(first)
    assert not any(text in printed for text in said if len(text) > 3)  # counts, never content

    code, again = await run(capsys, "--yes")
    assert code == cli.OK
    assert set(copied(again).values()) == {0}
    assert again["tables"]["messages"]["present"] == messages["found"]

    rows = "\n".join(await rows_of_every_table(postgres_schema))
    gone = next(p for p in PEOPLE if p["user"] == forgotten)
    assert forgotten not in rows
    assert not any(t["text"] in rows for s in gone["sessions"] for t in s["turns"])

    store = PostgresBackend(DATABASE_URL, schema=postgres_schema)
    reopened = LocalBackend(local.path)
    try:
        assert await store.kept_secret(STORE_SECRET) == secret  # Redis's tombstones still match
        ours = {name: await store.find_user(zep_user_id=name) for name in users}
        compared = 0
        for person in PEOPLE[:-1]:
            name = str(person["user"])
            mine, theirs = ours[name], users[name]
            assert mine is not None and mine.user_uuid == theirs.user_uuid
            for question in person["questions"]:
                query = question["text"]
                assert await store.get_context(
                    user=mine, query=query, max_chars=4000, timeout=30
                ) == await reopened.get_context(
                    user=theirs, query=query, max_chars=4000, timeout=30
                )
                request = SearchRequest(query=query, scope="episodes", limit=10)
                assert [
                    (h.text, h.score)
                    for h in await store.search(
                        graph_uuid=mine.graph_uuid, request=request, timeout=30
                    )
                ] == [
                    (h.text, h.score)
                    for h in await reopened.search(
                        graph_uuid=theirs.graph_uuid, request=request, timeout=30
                    )
                ]
                compared += 1
        assert compared >= 20
    finally:
        await store.aclose()
        await reopened.aclose()


async def test_a_copy_stopped_midway_is_finished_by_the_next_run(
    environment: None,
    local: LocalBackend,
    postgres_schema: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    users = await fill(local, PEOPLE[:3])
    await local.aclose()
    monkeypatch.setattr(migrate, "BATCH", 50)
    real, calls = migrate._terms, []

    def stopped(*args: Any) -> tuple[int, str]:
        calls.append(1)
        if len(calls) == 50:  # a later batch of messages, inside its transaction
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(migrate, "_terms", stopped)
    assert await main("--yes") == cli.INTERRUPTED
    capsys.readouterr()
    monkeypatch.setattr(migrate, "_terms", real)

    code, second = await run(capsys, "--yes")
    assert code == cli.OK
    messages = second["tables"]["messages"]
    assert 0 < messages["present"] < messages["found"]
    assert messages["present"] % 50 == 0  # whole batches, none half written
    assert messages["present"] + messages["copied"] == messages["found"]

    db = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": postgres_schema})
    try:
        assert await db.fetchval("SELECT count(*) FROM messages") == messages["found"]
        totals = await db.fetchrow("SELECT sum(statements), sum(tokens) FROM retrieval_totals")
        indexed = await db.fetchrow("SELECT count(*), sum(tokens) FROM messages WHERE eligible")
        assert tuple(totals) == tuple(indexed)
    finally:
        await db.close()

    store = PostgresBackend(DATABASE_URL, schema=postgres_schema)
    reopened = LocalBackend(local.path)
    try:
        for person in PEOPLE[:3]:
            name = str(person["user"])
            mine = await store.find_user(zep_user_id=name)
            assert mine is not None
            for question in person["questions"][:3]:
                assert await store.get_context(
                    user=mine, query=question["text"], max_chars=4000, timeout=30
                ) == await reopened.get_context(
                    user=users[name], query=question["text"], max_chars=4000, timeout=30
                )
    finally:
        await store.aclose()
        await reopened.aclose()


async def test_a_differing_tombstone_key_in_the_postgres_store_is_said(
    environment: None,
    local: LocalBackend,
    postgres_schema: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await local.kept_secret(STORE_SECRET)
    await local.aclose()
    store = PostgresBackend(DATABASE_URL, schema=postgres_schema)
    try:
        await store.kept_secret(STORE_SECRET)  # a worker opened it first
    finally:
        await store.aclose()
    code = await main("--yes")
    captured = capsys.readouterr()
    assert code == cli.ATTENTION
    assert json.loads(captured.out)["differing_secrets"] == [STORE_SECRET]
    assert "tombstone_key" in captured.err and len(captured.err.splitlines()) == 1
