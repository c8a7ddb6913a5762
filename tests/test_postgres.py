"""The PostgreSQL store on the machine's real PostgreSQL (shared: each test has a schema of
its own, dropped after it): the local store's blocks and searches on the same history,
exactly once under concurrent writers, migrations, a forget that leaves nothing in any
row, and a bad database URL said in one line without its password. The contract tests
the local store passes run on it too (``any_settings`` in tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from afterthought.backends import postgres
from afterthought.backends.base import MESSAGE_KEY_FIELD, BackendError, OutgoingMessage, UserRef
from afterthought.backends.local import LocalBackend
from afterthought.backends.postgres import PostgresBackend, _lexeme
from afterthought.backends.retrieval import scoped_stem, words
from afterthought.facts import Fact
from afterthought.search import SearchRequest
from afterthought.settings import Settings, SettingsError
from afterthought.shared_store import store_name
from tests.conftest import DATABASE_URL

FIXTURE = Path(__file__).parent / "fixtures" / "memory" / "heldout"


@pytest.fixture
async def store(postgres_schema: str) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(DATABASE_URL, schema=postgres_schema)
    yield backend
    await backend.aclose()


def said(role: str, text: str, key: str, at: str = "2026-03-02T10:00:00+00:00") -> OutgoingMessage:
    return OutgoingMessage(role, text, at, metadata={MESSAGE_KEY_FIELD: key})


async def rows_of_every_table(schema: str) -> list[str]:
    """Every row of every table of the schema, as text."""
    db = await asyncpg.connect(DATABASE_URL)
    try:
        tables = [
            r[0]
            for r in await db.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
                schema,
            )
        ]
        assert {"messages", "facts", "users", "threads", "idempotency"} <= set(tables)
        found = []
        for table in tables:
            found += [
                str(r[0]) for r in await db.fetch(f'SELECT t::text FROM "{schema}"."{table}" t')
            ]
        return found
    finally:
        await db.close()


async def fill(
    backend: LocalBackend | PostgresBackend, people: list[dict[str, object]]
) -> dict[str, UserRef]:
    users = {}
    for person in people:
        name = str(person["user"])
        user, _ = await backend.ensure_user(zep_user_id=name)
        users[name] = user
        for number, session in enumerate(person["sessions"]):  # type: ignore[arg-type]
            thread = await backend.create_thread(user=user, idempotency_key=f"{name}-{number}")
            batch = [
                said(turn["role"], turn["text"], f"{name}-{turn['id']}", session["date"])
                for turn in session["turns"]
            ]
            await backend.add_messages(thread_uuid=thread, messages=batch, idempotency_key="b")
        # A changed fact, read from two of the user's turns: the block shows both.
        turns = [t for s in person["sessions"] for t in s["turns"] if t["role"] == "user"]  # type: ignore[attr-defined]
        first, last = (f"{name}-{turns[0]['id']}",), (f"{name}-{turns[-1]['id']}",)
        at = "2026-03-01T00:00:00+00:00"
        await backend.write_facts(
            user=user,
            add=[
                Fact(subject="user", predicate="lives_in", value="Leeds", source_keys=list(first))
            ],
            invalidate=[],
            at=at,
        )
        old = (await backend.list_facts(user=user))[0]
        await backend.write_facts(
            user=user,
            add=[
                Fact(
                    subject="user", predicate="lives_in", value="Manchester", source_keys=list(last)
                )
            ],
            invalidate=[old.uuid],
            at="2026-03-02T00:00:00+00:00",
        )
        # A fact that limits advice: a request for advice is shown the turn it came from.
        middle = f"{name}-{turns[len(turns) // 2]['id']}"
        await backend.write_facts(
            user=user,
            add=[Fact(subject="user", predicate="diet", value="vegan", source_keys=[middle])],
            invalidate=[],
            at=at,
        )
    return users


async def test_blocks_and_searches_are_the_local_stores_on_the_same_history(
    store: PostgresBackend, tmp_path: Path
) -> None:
    people = [json.loads(p.read_text()) for p in sorted(FIXTURE.glob("*.json"))[:6]]
    local = LocalBackend(tmp_path / "memory.sqlite3")
    try:
        ours, theirs = await fill(store, people), await fill(local, people)
        compared = 0
        for person in people:
            name = str(person["user"])
            for question in person["questions"]:  # type: ignore[attr-defined]
                query = question["text"]
                assert await store.get_context(
                    user=ours[name], query=query, max_chars=4000, timeout=30
                ) == await local.get_context(
                    user=theirs[name], query=query, max_chars=4000, timeout=30
                )
                for scope in ("episodes", "edges"):
                    request = SearchRequest(query=query, scope=scope, limit=10)
                    mine = await store.search(
                        graph_uuid=ours[name].graph_uuid, request=request, timeout=30
                    )
                    local_hits = await local.search(
                        graph_uuid=theirs[name].graph_uuid, request=request, timeout=30
                    )
                    assert [(h.text, h.score) for h in mine] == [
                        (h.text, h.score) for h in local_hits
                    ]
                compared += 1
        assert compared >= 30
    finally:
        await local.aclose()


async def test_a_store_indexed_before_postings_answers_as_before_once_upgraded(
    postgres_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store written at schema version 1 (a GIN index over the words) is re-indexed by
    the worker that upgrades it: its postings and term counts, built from the statements'
    words, rank as the local store does, and a forget after it leaves none behind."""
    people = [json.loads(p.read_text()) for p in sorted(FIXTURE.glob("*.json"))[:2]]
    with monkeypatch.context() as released:
        released.setattr(postgres, "MIGRATIONS", postgres.MIGRATIONS[:1])
        released.setattr(postgres, "SCHEMA_VERSION", 1)
        old = PostgresBackend(DATABASE_URL, schema=postgres_schema)
        await fill(old, people)
        await old.aclose()
    upgraded = PostgresBackend(DATABASE_URL, schema=postgres_schema)
    local = LocalBackend(tmp_path / "memory.sqlite3")
    try:
        ours = await fill(local, people)
        for person in people:
            name = str(person["user"])
            user = await upgraded.find_user(zep_user_id=name)
            assert user is not None
            for question in person["questions"]:  # type: ignore[attr-defined]
                assert await upgraded.get_context(
                    user=user, query=question["text"], max_chars=4000, timeout=30
                ) == await local.get_context(
                    user=ours[name], query=question["text"], max_chars=4000, timeout=30
                )
            await upgraded.delete_user(user=user)
        db = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": postgres_schema})
        try:
            versions = await db.fetch("SELECT version FROM schema_migrations ORDER BY 1")
            assert [r[0] for r in versions] == list(range(1, postgres.SCHEMA_VERSION + 1))
            assert await db.fetchval("SELECT count(*) FROM postings") == 0
            assert await db.fetchval("SELECT count(*) FROM term_counts") == 0
        finally:
            await db.close()
    finally:
        await upgraded.aclose()
        await local.aclose()


async def test_writers_on_many_connections_store_each_message_once(postgres_schema: str) -> None:
    """Eight backends (eight pools: as many machines) send one session's batches at once,
    under one call key and under keys of their own: each message is stored once."""
    writers = [PostgresBackend(DATABASE_URL, schema=postgres_schema) for _ in range(8)]
    try:
        user, _ = await writers[0].ensure_user(zep_user_id="alice")
        thread = await writers[0].create_thread(user=user, idempotency_key="s1")
        batches = [
            [said("user", f"turn {n} of {b}", f"k{b}-{n}") for n in range(20)] for b in range(5)
        ]

        async def send(writer: PostgresBackend, number: int) -> None:
            for b, batch in enumerate(batches):
                key = f"call-{b}" if number % 2 else f"call-{b}-by-{number}"
                await writer.add_messages(thread_uuid=thread, messages=batch, idempotency_key=key)

        await asyncio.gather(*(send(w, n) for n, w in enumerate(writers)))
        stored: list[str] = []
        cursor = None
        while True:
            page, cursor = await writers[0].message_page(thread_uuid=thread, cursor=cursor)
            stored += [m.content for m in page]
            if cursor is None:
                break
        assert sorted(stored) == sorted(m.content for batch in batches for m in batch)
        # In the order sent: batch by batch, each in its own order.
        assert list(reversed(stored)) == [m.content for batch in batches for m in batch]
    finally:
        for writer in writers:
            await writer.aclose()


async def test_a_users_messages_are_numbered_in_the_order_their_writers_commit(
    postgres_schema: str,
) -> None:
    """Synthesis reads a user's messages after a watermark (``user_messages``' cursor): a
    batch that commits after a later-numbered one would be behind a watermark already
    read past, and never synthesized. So one user's writers take turns: the later one
    waits for the earlier one's commit, and numbers its messages after them."""
    first, second = (PostgresBackend(DATABASE_URL, schema=postgres_schema) for _ in range(2))
    try:
        user, _ = await first.ensure_user(zep_user_id="alice")
        one = await first.create_thread(user=user, idempotency_key="s1")
        two = await first.create_thread(user=user, idempotency_key="s2")
        inserted, release = asyncio.Event(), asyncio.Event()

        async def open_batch(db: postgres.Db) -> None:
            early = said("user", "I moved to Leeds", "e")
            verdict = postgres._verdict(early.role, early.content, True)
            await first._insert(db, one, "a", [early], [verdict], ())
            inserted.set()
            await release.wait()  # numbered, not yet committed

        held = asyncio.create_task(first._run(open_batch))
        await inserted.wait()
        late = asyncio.create_task(
            second.add_messages(
                # The assistant's: nothing of the store's statistics to wait for either.
                thread_uuid=two,
                messages=[said("assistant", "What is the cat called?", "l")],
                idempotency_key="b",
            )
        )
        await _committed_or_waiting(late)
        seen, cursor = await second.user_messages(user=user, after=None, limit=100)
        release.set()
        await asyncio.gather(held, late)
        rest, _ = await second.user_messages(user=user, after=cursor, limit=100)
        assert sorted(m.content for m in [*seen, *rest]) == [
            "I moved to Leeds",
            "What is the cat called?",
        ]
    finally:
        await first.aclose()
        await second.aclose()


async def _committed_or_waiting(write: asyncio.Task[object]) -> None:
    """Until ``write`` is done or its statement waits for a lock."""
    db = await asyncpg.connect(DATABASE_URL)
    try:
        for _ in range(1000):  # a bound, not a pace: either comes within milliseconds
            if write.done() or await db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'afterthought'"
                " AND wait_event_type = 'Lock'"
            ):
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the write neither ended nor waited")
    finally:
        await db.close()


async def test_a_reused_key_with_another_text_is_another_message(store: PostgresBackend) -> None:
    user, _ = await store.ensure_user(zep_user_id="alice")
    thread = await store.create_thread(user=user, idempotency_key="s1")
    await store.add_messages(
        thread_uuid=thread, messages=[said("user", "one", "k")], idempotency_key="a"
    )
    await store.add_messages(
        thread_uuid=thread, messages=[said("user", "two", "k")], idempotency_key="b"
    )
    await store.add_messages(
        thread_uuid=thread, messages=[said("user", "two", "k")], idempotency_key="c"
    )
    found = await store.recent_messages(thread_uuid=thread, limit=10)
    assert [m.content for m in found] == ["two", "one"]


async def test_the_first_of_many_processes_migrates_and_an_agent_waits_for_a_worker(
    postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    openers = [PostgresBackend(DATABASE_URL, schema=postgres_schema) for _ in range(4)]
    try:
        await asyncio.gather(*(o.prepare() for o in openers))  # one applies, three find it done
        db = await asyncpg.connect(DATABASE_URL)
        try:
            versions = await db.fetch(f'SELECT version FROM "{postgres_schema}".schema_migrations')
            released = list(range(1, postgres.SCHEMA_VERSION + 1))
            assert [r[0] for r in versions] == released
            # A release with another migration: an agent (no upgrade) waits for a worker.
            added = (*postgres.MIGRATIONS, ("CREATE TABLE later (x integer)",))
            monkeypatch.setattr(postgres, "MIGRATIONS", added)
            monkeypatch.setattr(postgres, "SCHEMA_VERSION", len(added))
            agent = PostgresBackend(DATABASE_URL, schema=postgres_schema, upgrade=False)
            with pytest.raises(BackendError) as refused:
                await agent.find_user(zep_user_id="x")
            assert refused.value.code == "schema_upgrade_pending"
            worker = PostgresBackend(DATABASE_URL, schema=postgres_schema)
            assert await worker.find_user(zep_user_id="x") is None
            assert await agent.find_user(zep_user_id="x") is None
            versions = await db.fetch(f'SELECT version FROM "{postgres_schema}".schema_migrations')
            assert [r[0] for r in versions] == [*released, len(added)]
            await worker.aclose()
            await agent.aclose()
        finally:
            await db.close()
    finally:
        for opener in openers:
            await opener.aclose()


async def test_a_forget_leaves_nothing_of_what_was_forgotten_in_any_row(
    store: PostgresBackend, postgres_schema: str
) -> None:
    alice, _ = await store.ensure_user(zep_user_id="alice")
    bob, _ = await store.ensure_user(zep_user_id="bob")
    alice_thread = await store.create_thread(user=alice, idempotency_key="a1")
    bob_thread = await store.create_thread(user=bob, idempotency_key="b1")
    await store.add_messages(
        thread_uuid=alice_thread,
        messages=[
            said("assistant", "Where do you live these days?", "a0"),
            said("user", "Quillonby, near the Zanthorpe viaduct", "a1"),
            said("user", "my cat Marrowbone hates the Vostrikov vet", "a2"),
        ],
        idempotency_key="x",
    )
    await store.add_messages(
        thread_uuid=bob_thread,
        messages=[said("user", "I keep bees in Harrowgate", "b1")],
        idempotency_key="x",
    )
    await store.write_facts(
        user=alice,
        add=[Fact(subject="user", predicate="lives_in", value="Quillonby", source_keys=["a1"])],
        invalidate=[],
        at="2026-03-02",
    )
    await store.add_fact(
        user=alice,
        text="has a cat called Marrowbone",
        key="n1",
        trust="user",
        reference_time="2026-03-02",
    )
    fact = next(f for f in await store.list_facts(user=alice) if f.value == "Quillonby")
    key = await _key_of(postgres_schema, alice.user_uuid)
    lexemes = {_lexeme(key, scoped_stem(w)) for w in words("Quillonby Zanthorpe viaduct")}
    postings = {str(postgres._posting(lexeme)) for lexeme in lexemes}
    before = "\n".join(await rows_of_every_table(postgres_schema))
    assert all(posting in before for posting in postings)  # what is looked for is there

    assert await store.delete_memory(user=alice, memory_uuid=fact.uuid)
    rows = "\n".join(await rows_of_every_table(postgres_schema))
    assert "Quillonby" not in rows and "Zanthorpe" not in rows
    assert not any(lexeme in rows for lexeme in lexemes | postings)
    assert "Marrowbone" in rows  # the rest of alice's memory stays

    await store.delete_user(user=alice)
    rows = "\n".join(await rows_of_every_table(postgres_schema))
    for forgotten in ("Marrowbone", "Vostrikov", alice.user_uuid, key.hex()):
        assert forgotten not in rows
    assert "Harrowgate" in rows
    # The statistics count what is left: bob's one statement of five words.
    assert await _totals(postgres_schema) == (1, 5)


@pytest.mark.parametrize("backend", ["local", "postgres"])
async def test_forgetting_a_fact_deletes_the_replies_that_repeated_it_on_either_store(
    backend: str, postgres_schema: str, tmp_path: Path
) -> None:
    """The assistant said the fact back — a reply that quotes the statement it was read
    from, one that says its predicate and value in the block's words ("allergic to:
    brindlenuts"), one in its own ("you are allergic to brindlenuts"): each goes with the
    fact, on PostgreSQL as on the local store (whose behaviour it claims), though the
    predicate is stored as ``allergic_to``; the reply that never said it stays."""
    store: LocalBackend | PostgresBackend = (
        LocalBackend(tmp_path / "memory.sqlite3")
        if backend == "local"
        else PostgresBackend(DATABASE_URL, schema=postgres_schema)
    )
    try:
        alice, _ = await store.ensure_user(zep_user_id="alice")
        thread = await store.create_thread(user=alice, idempotency_key="a1")
        await store.add_messages(
            thread_uuid=thread,
            messages=[
                said("user", "Nothing with brindlenuts please, I'm allergic to brindlenuts", "u1"),
                said(
                    "assistant",
                    'You said: "Nothing with brindlenuts please, I\'m allergic to brindlenuts"',
                    "r1",
                ),
                said("user", "What do you know about me?", "u2"),
                said("assistant", "My memory of you: - allergic to: brindlenuts", "r2"),
                said("user", "Any dessert ideas?", "u3"),
                said("assistant", "As you are allergic to brindlenuts, try a sorbet", "r3"),
                said("assistant", "Enjoy your dinner!", "r4"),
            ],
            idempotency_key="x",
        )
        await store.write_facts(
            user=alice,
            add=[
                Fact(
                    subject="user", predicate="allergic_to", value="brindlenuts", source_keys=["u1"]
                )
            ],
            invalidate=[],
            at="2026-03-02",
        )
        (fact,) = await store.list_facts(user=alice)

        assert await store.delete_memory(user=alice, memory_uuid=fact.uuid)
        page, _ = await store.user_messages(user=alice, after=None, limit=100)
        assert [m.content for m in page if "brindlenut" in m.content] == []
        assert "Enjoy your dinner!" in [m.content for m in page]
    finally:
        await store.aclose()


async def _key_of(schema: str, user_uuid: str) -> bytes:
    db = await asyncpg.connect(DATABASE_URL)
    try:
        key: bytes = await db.fetchval(
            f'SELECT term_key FROM "{schema}".users WHERE uuid = $1', user_uuid
        )
        return key
    finally:
        await db.close()


async def _totals(schema: str) -> tuple[int, int]:
    db = await asyncpg.connect(DATABASE_URL)
    try:
        row = await db.fetchrow(
            f'SELECT sum(statements), sum(tokens) FROM "{schema}".retrieval_totals'
        )
        assert row is not None
        return int(row[0]), int(row[1])
    finally:
        await db.close()


async def test_one_users_query_reads_only_that_users_rows(
    store: PostgresBackend, postgres_schema: str
) -> None:
    """A word every other user says often costs this user's query nothing: the postings'
    index finds the user's own rows (each user's words are their own lexemes), in the
    ranking of the newest matches and of the rarest alike."""
    alice, _ = await store.ensure_user(zep_user_id="alice")
    bob, _ = await store.ensure_user(zep_user_id="bob")
    thread = await store.create_thread(user=bob, idempotency_key="b")
    await store.add_messages(
        thread_uuid=thread,
        messages=[
            said("user", f"Leeds again, day {n} with w{n % 97} and v{n % 89}", f"k{n}")
            for n in range(3000)
        ],
        idempotency_key="x",
    )
    key = await _key_of(postgres_schema, alice.user_uuid)
    leeds = postgres._posting(_lexeme(key, scoped_stem("leeds")))
    db = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": postgres_schema})
    try:
        await db.execute("ANALYZE postings")
        assert await db.fetchval("SELECT count(*) FROM term_counts WHERE lexeme = $1", leeds) == 0
        for newest in ([], [0]):
            plan = await db.fetchval(
                f"EXPLAIN (ANALYZE, FORMAT JSON) {postgres._RANKED}",
                *([0], [leeds], [1.0], [True], newest, 5.0, 1000, 20, alice.user_uuid, [], True),
            )
            assert "Seq Scan" not in json.dumps(json.loads(plan))
            nodes = _nodes(json.loads(plan)[0]["Plan"])
            scans = [n for n in nodes if n.get("Relation Name") == "postings"]
            assert scans and all(n["Actual Rows"] == 0 for n in scans)
    finally:
        await db.close()


def _nodes(plan: dict[str, object]) -> list[dict[str, object]]:
    """A plan's nodes, the top one first."""
    below = plan.get("Plans", [])
    assert isinstance(below, list)
    return [plan, *(n for child in below for n in _nodes(child))]


def test_a_bad_database_url_is_refused_without_its_password() -> None:
    for url in (
        "mysql://u:hunter2secret@db/x",
        "postgresql://u:hunter2secret@:5432x/db",
        "hunter2secret",
    ):
        with pytest.raises(SettingsError) as refused:
            Settings(backend="postgres", database_url=url)
        assert "hunter2secret" not in str(refused.value)
        assert "database_url" in str(refused.value)
    with pytest.raises(SettingsError, match="needs AFTERTHOUGHT_DATABASE_URL"):
        Settings(backend="postgres")


def test_a_worker_that_cannot_reach_the_database_says_so_in_one_line(tmp_path: Path) -> None:
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AFTERTHOUGHT_", "ZEP_"))},
        "AFTERTHOUGHT_BACKEND": "postgres",
        "AFTERTHOUGHT_DATABASE_URL": "postgresql://someone:hunter2secret@127.0.0.1:1/test",
        "AFTERTHOUGHT_SPOOL_PATH": str(tmp_path / "spool"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "afterthought.cli", "worker"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "afterthought: cannot connect to PostgreSQL at 127.0.0.1:1/test (afterthought):"
        f" {lines[0].split('(afterthought): ', 1)[1]}"
    ]
    assert "hunter2secret" not in done.stderr + done.stdout
    assert "someone" not in lines[0]


def test_schema_names_are_identifiers() -> None:
    with pytest.raises(ValueError):
        PostgresBackend(DATABASE_URL, schema='x"; DROP SCHEMA public; --')
    with pytest.raises(SettingsError, match="database_schema"):
        Settings(database_schema="Robert'); DROP")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:hunter2secret@h1:5432,H2:5433/db", "h1:5432,h2:5433/db"),
        (
            "postgresql:///test?host=/var/run/postgresql",
            "/var/run/postgresql (socket, port 5432)/test",
        ),
        ("postgresql://u:hunter2secret@%2Ftmp%2Fpg:6000/x", "/tmp/pg (socket, port 6000)/x"),
        ("postgresql://u:hunter2secret@[::1]:6000,h/x", "[::1]:6000,h:5432/x"),
    ],
)
def test_multi_host_and_socket_urls_are_taken_and_shown_without_their_password(
    url: str, shown: str
) -> None:
    """What libpq and asyncpg accept: several hosts, a unix socket's directory (in the
    query or percent-encoded in the authority); each named, never ``None:5432``."""
    settings = Settings(backend="postgres", database_url=url)
    where = PostgresBackend(url, schema="afterthought").where
    assert where == f"PostgreSQL at {shown} (afterthought)"
    assert "hunter2secret" not in where + store_name(settings) and "None" not in where


def test_a_bad_host_list_is_refused_in_one_line_without_its_password() -> None:
    for url in (
        "postgresql://u:hunter2secret@h1:5432,:5433/db",
        "postgresql://u:hunter2secret@h1:5432,h2:99999/db",
        "postgresql://u:hunter2secret@/db?host=a,b&port=1,2,3",
    ):
        with pytest.raises(SettingsError) as refused:
            Settings(backend="postgres", database_url=url)
        said = str(refused.value)
        assert "hunter2secret" not in said and "database_url" in said
        assert len([line for line in said.splitlines() if line.strip()]) == 1, said


async def test_the_store_is_reached_through_a_host_list_and_through_its_unix_socket(
    postgres_schema: str,
) -> None:
    """The first host of a list refuses (port 1): the next one serves. And the local
    server's socket, where there is one."""
    parts = urlsplit(DATABASE_URL)
    user = f"{parts.username}@" if parts.username else ""
    urls = [f"postgresql://{user}127.0.0.1:1,{parts.hostname}:{parts.port or 5432}{parts.path}"]
    if Path("/var/run/postgresql/.s.PGSQL.5432").exists():
        urls.append(f"postgresql://{user}{parts.path}?host=/var/run/postgresql")
    for url in urls:
        backend = PostgresBackend(url, schema=postgres_schema)
        try:
            assert len(await backend.store_id()) == 32
        finally:
            await backend.aclose()


async def test_without_pgvector_the_store_says_once_that_it_recalls_by_full_text_only(
    postgres_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    db = await asyncpg.connect(DATABASE_URL)
    try:
        if await db.fetchval("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'"):
            pytest.skip("pgvector is installed on this PostgreSQL: the absent path cannot be had")
    finally:
        await db.close()
    backend = PostgresBackend(
        DATABASE_URL, schema=postgres_schema, embedding_model="minishlab/potion-base-8M"
    )
    try:
        with caplog.at_level("INFO", logger="afterthought.postgres"):
            await backend.prepare()
            await backend.prepare()  # the worker's start and its arq startup both prepare
    finally:
        await backend.aclose()
    said = [r.getMessage() for r in caplog.records if "full-text" in r.getMessage()]
    assert said == [
        f"postgres store {backend.where}: full-text only (pgvector is not installed;"
        " embedding_model is not used)"
    ]
