"""Shared fixtures. Redis is the machine's real one (shared: every test gets its own key
prefix and removes its keys); the Zep fake runs in-process on a free port."""

from __future__ import annotations

import asyncio
import atexit
import inspect
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import redis as syncredis
import redis.asyncio as aioredis

from afterthought.connections import connect
from afterthought.contract import QueuedMessage, Role
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings
from afterthought.testing import RedisServer, ZepFake
from afterthought.testing.redis_server import listening
from afterthought.worker.jobs import create_worker


def _test_redis() -> str:
    """The shared Redis, or a private one for the whole run when none is reachable."""
    if os.environ.get("AFTERTHOUGHT_TEST_REDIS_URL"):
        return os.environ["AFTERTHOUGHT_TEST_REDIS_URL"]
    if listening("127.0.0.1", 6379):
        return "redis://127.0.0.1:6379/0"
    server = RedisServer()
    atexit.register(server.close)
    return server.start()


REDIS_URL = _test_redis()

#: The PostgreSQL the postgres store's tests use (shared: each test its own schema).
DATABASE_URL = os.environ.get(
    "AFTERTHOUGHT_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


def _database_reachable() -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(DATABASE_URL)
    return listening(parts.hostname or "127.0.0.1", parts.port or 5432)


def _drop_schema(schema: str) -> None:
    """Drop one test's schema, and nothing else (the database is shared)."""

    async def drop() -> None:
        import asyncpg

        db = await asyncpg.connect(DATABASE_URL)
        try:
            await db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await db.close()

    # From a thread of its own: a fixture's teardown may run inside the test's loop.
    failure: list[BaseException] = []
    worker = threading.Thread(target=lambda: _into(failure, lambda: asyncio.run(drop())))
    worker.start()
    worker.join()
    if failure:
        raise failure[0]


def _into(failure: list[BaseException], work: Callable[[], object]) -> None:
    try:
        work()
    except BaseException as exc:
        failure.append(exc)


# The Zep fake and the Redis proxy serve on threads of the test's own process: a reply
# waits for the GIL as long as the interpreter's switch interval (5 ms) while the test's
# thread computes, and a long import makes thousands of requests. Handed over sooner, a
# Zep test waits on the fake a third less.
sys.setswitchinterval(0.0005)

pytest_plugins = ["afterthought.testing.pytest_plugin"]

# --- two tiers of one suite --------------------------------------------------------------
# ``./scripts/test --fast`` runs ``-m "not slow"`` with HYPOTHESIS_PROFILE=fast. The slow
# tier is what waits on processes, servers, failovers, wheels or the whole Zep matrix,
# chosen from ``--durations``; it is marked here, by name, so no test file carries it.
FAST_EXAMPLES = 20
hypothesis.settings.register_profile("fast", max_examples=FAST_EXAMPLES)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
FAST = os.environ.get("HYPOTHESIS_PROFILE") == "fast"

#: Modules that are slow throughout: servers of their own, processes, failovers, wheels,
#: the bench's generated fixture and quality targets.
SLOW_MODULES = {
    "test_chaos",
    "test_cluster",
    "test_handover_reads",
    "test_inspector_browser",
    "test_adk_api_server",
    "test_adk_web_browser",
    "test_live",
    "test_memory3_fixture",
    "test_memory_quality",
    "test_packaging",
    "test_sentinel",
    "test_topologies",
}
#: Tests (by function name) of the other modules that start processes or wait seconds.
SLOW_TESTS = {
    "test_a_reader_that_goes_away_ends_the_command_quietly",
    "test_a_worker_rides_out_a_redis_restart_and_stops_with_130_on_ctrl_c",
    "test_backfill_killed_midway_resumes_without_duplicating",
    "test_unknown_variables_and_a_relative_store_are_warned_about_once",
    "test_a_worker_serves_metrics_and_health_and_shows_in_status",
    "test_a_synthesis_process_sigstopped_past_its_mark_writes_nothing_after_sigcont",
    "test_provisioning_raced_from_several_processes_creates_one_user_and_thread",
    "test_an_api_server_stopped_by_a_signal_spools_what_it_buffered_as_the_readme_says",
    "test_a_one_shot_agent_with_redis_down_exits_in_time_and_its_turn_is_stored_once",
    "test_a_one_shot_agent_exits_in_time_while_another_process_holds_the_append_lock",
    "test_the_write_path_loses_and_doubles_nothing_on_redis",
    "test_a_worker_starts_and_drains_redis_at_maxmemory",
    "test_the_verdicts_are_the_recorded_ones",  # 5,734 texts judged: about 20 s
    "test_redis_restarted_without_persistence_under_a_worker_is_reported",
    "test_soak_200_users_then_idle_keeps_no_key_of_idle_sessions",
    "test_the_next_agent_process_replays_the_spool_once_it_reaches_redis",
    "test_a_process_of_one_turn_or_one_search_is_warned_of_another_store",
    "test_messages_a_restarted_redis_lost_are_counted_at_the_threads_next_enqueue",
    "test_a_worker_that_cannot_start_says_why_before_it_takes_work",
    # The 5,400-message thread read, cut and re-read: the fast tier keeps one long import.
    "test_a_reimport_whose_reply_is_lost_reads_only_the_newest_pages_again",
    "test_a_reimport_whose_worker_is_killed_midway_stores_each_message_once",
    "test_a_read_of_the_thread_cut_short_goes_on_where_it_stopped",
}
#: Of these parametrized tests, the cases the fast tier keeps (the rest are slow).
FAST_CASES = {
    # The Zep idempotency matrix: every value of each switch at least once (window, reuse,
    # in-flight, hang).
    "test_the_adapter_survives_every_idempotency_behaviour": {
        "forever-replay-wait-answered",
        "window-422-run_both-answered",
        "forever-409-409-commits-after-timeout",
        "never-commits-after-timeout",
    },
    "test_a_long_session_imported_grown_and_imported_again_is_stored_once": {
        "zep-add_session_to_memory-600",
        "zep-backfill-600",
    },
    "test_late_copies_deep_below_the_top_of_a_long_thread_are_marked": {"600"},
    # Random traffic, as a Hypothesis profile's fewer examples: one seed a policy.
    "test_traffic_with_requests_served_up_to_minutes_late_loses_doubles_reorders_nothing": {
        "keys-honoured-1",
        "keys-ignored-1",
    },
}
#: Tests that watch the shared Redis (MONITOR) or start servers of their own: one xdist
#: worker runs each group, in turn, so they neither see nor starve each other.
GROUPS = {
    "test_slots": "redis-monitor",
    "test_redis_cost": "redis-monitor",
    "test_cluster": "servers",
    "test_sentinel": "servers",
    "test_topologies": "servers",
    "test_chaos": "servers",
}


def pytest_sessionfinish() -> None:
    """An Enqueuer a test left open (its Redis gone, say) still retries in its drain thread,
    and the exit hook spools what it holds: both log, after pytest's summary, lines that read
    as failures. They are ended here, before the summary, and what they say is not printed:
    the tests that made them are over and were judged."""
    from afterthought import enqueue as enqueue_module

    quiet = logging.getLogger("afterthought")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False  # for good: a drain thread that outlives its stop says nothing
    for enqueuer in list(enqueue_module._ENQUEUERS):
        enqueuer._drainer.stop()
    atexit.unregister(enqueue_module._spool_held)
    enqueue_module._spool_held()


def hypothesis_examples(n: int, *, fast: int = FAST_EXAMPLES) -> int:
    """A property test's ``max_examples``: its own, or the fast tier's fewer (``fast``)."""
    return min(n, fast) if FAST else n


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.module.__name__.rpartition(".")[2] if item.module else ""
        name = getattr(item, "originalname", item.name)
        callspec = getattr(item, "callspec", None)
        if (
            module in SLOW_MODULES
            or name in SLOW_TESTS
            or (name in FAST_CASES and callspec is not None and callspec.id not in FAST_CASES[name])
        ):
            item.add_marker(pytest.mark.slow)
        if module in GROUPS:
            item.add_marker(pytest.mark.xdist_group(GROUPS[module]))
        # A test's own @settings(max_examples=...) outranks any profile: capped here.
        given = getattr(item, "obj", None)
        own = getattr(given, "_hypothesis_internal_use_settings", None)
        if FAST and own is not None and own.max_examples > FAST_EXAMPLES:
            given._hypothesis_internal_use_settings = hypothesis.settings(
                own, max_examples=FAST_EXAMPLES
            )


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Tests build their settings explicitly; the developer's environment must not leak in.
    The user data directory (default stores and spools) is the test's own."""
    for name in list(os.environ):
        if name.startswith("AFTERTHOUGHT_") or name in {"REDIS_URL", "ZEP_API_KEY", "ZEP_BASE_URL"}:
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


def remove_prefix(value: str) -> None:
    """Deletes a test deployment's keys from the shared Redis: the flat layout's, arq's,
    and the sharded layout's (``{prefix:s:x}:...``). One pass of SCAN finds all three (the
    prefix is random): each pass reads the whole shared keyspace, the largest part of that
    Redis' CPU."""
    client = syncredis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"*{value}*", count=1000))
    if keys:
        client.delete(*keys)
    # Named by the store, not the prefix: a Zep fake's port is another test's later.
    for sharers in client.scan_iter(match="afterthought:shared:user-ids:*", count=1000):
        client.hdel(sharers, value)
    client.close()


@pytest.fixture
def prefix() -> Iterator[str]:
    value = f"t{uuid.uuid4().hex[:12]}"
    yield value
    remove_prefix(value)


@pytest.fixture
def redis_shards() -> int:
    """The key layout of a test's settings: flat, unless its module parametrizes
    ``redis_shards`` (the core queue tests run sharded on the standalone Redis too)."""
    return 0


#: Run a module's tests in the flat layout and in 8 virtual shards.
BOTH_LAYOUTS = pytest.mark.parametrize("redis_shards", [0, 8], ids=["flat", "sharded"])


@pytest.fixture
def make_settings(prefix: str, tmp_path: Path, redis_shards: int) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "redis_url": REDIS_URL,
            "redis_shards": redis_shards,
            "key_prefix": prefix,
            "local_db_path": tmp_path / "memory.sqlite3",
            "spool_path": tmp_path / "spool",
            "backend": "local",
            "synthesis_idle_seconds": 0,
            "context_settle_seconds": 0,
            # Budgets a loaded machine cannot miss: a test about a budget sets its own.
            "retrieval_budget": 10.0,
            "enqueue_timeout": 5.0,
            "tool_timeout": 30.0,
            "audit_key": "audit-key-of-the-tests",
        }
        values.update(overrides)
        return Settings(**values)

    return make


@pytest.fixture
def local_settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture
def zep_settings(make_settings: Callable[..., Settings], zep_fake: ZepFake) -> Settings:
    return make_settings(backend="zep", zep_api_key="test-key", zep_base_url=zep_fake.base_url)


@pytest.fixture
def postgres_schema() -> Iterator[str]:
    """A schema of the test's own in the shared PostgreSQL, dropped after it."""
    if not _database_reachable():
        pytest.skip("no PostgreSQL reachable (AFTERTHOUGHT_TEST_DATABASE_URL)")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield schema
    _drop_schema(schema)


@pytest.fixture
def postgres_settings(make_settings: Callable[..., Settings], postgres_schema: str) -> Settings:
    return make_settings(
        backend="postgres", database_url=DATABASE_URL, database_schema=postgres_schema
    )


#: The backends every contract test runs on.
BACKENDS = ["local", "postgres", "zep"]


@pytest.fixture(params=BACKENDS)
def any_settings(request: pytest.FixtureRequest) -> Settings:
    """Runs a test once per backend."""
    settings: Settings = request.getfixturevalue(f"{request.param}_settings")
    return settings


@pytest.fixture
async def redis() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


def where(settings: Settings, message: QueuedMessage) -> tuple[Keys, str, int | None]:
    """The deployment's key names, the message's thread reference and that thread's shard."""
    keys = Keys.of(settings)
    ref = keys.thread_ref(message.app, message.user_id, message.session_id)
    return keys, ref, keys.shard_of_ref(ref)


def queued(text: str, n: int, *, session: str = "s1", role: Role = "user") -> QueuedMessage:
    """Alice's n-th message in ``session`` of the test app."""
    return QueuedMessage.build(
        app="memtest",
        user_id="alice",
        session_id=session,
        invocation_id=f"inv-{n}",
        role=role,
        ordinal=0,
        content=text,
    )


async def enqueue(settings: Settings, *messages: QueuedMessage) -> None:
    """Queue straight into Redis with the hooks' script, without their deadline (a loaded
    machine must not fail a test's set-up)."""
    client = connect(settings.redis_url)
    try:
        assert await ThreadQueue(client, settings).enqueue(list(messages), now_ms=_now_ms()) >= 0
    finally:
        await client.aclose()


def _now_ms() -> int:
    return int(time.time() * 1000)


async def run_worker_once(settings: Settings) -> None:
    """One real arq worker in burst mode: it does what is due now, then exits."""
    worker = create_worker(settings, burst=True, handle_signals=False)
    try:
        await worker.main()
    finally:
        await worker.close()


async def drain(settings: Settings, *, timeout: float = 30.0) -> None:
    """Run a real arq worker in burst mode until no thread is ready or deferred."""
    keys = Keys.of(settings)
    client = connect(settings.redis_url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            await run_worker_once(settings)
            if not any([await client.zcard(keys.ready(s)) for s in keys.shard_ids]):
                return
            if time.monotonic() > deadline:
                raise TimeoutError("queue not drained")
            await asyncio.sleep(0.05)
    finally:
        await client.aclose()


class PassingClock:
    """A clock whose sleeps pass at once: a forget's wait of two leases for a holder that
    keeps its lease ends in as many looks, not in real seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


async def until(check: Callable[[], object], *, within: float = 20.0) -> None:
    """Poll ``check`` (its result awaited when it is awaitable) until it is true; the bound
    only stops a broken test."""
    for _ in range(int(within / 0.02)):
        found = check()
        if await found if inspect.isawaitable(found) else found:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def backend_user_id(settings: Settings, *, app: str, user_id: str) -> str:
    """The backend's id of an ADK user, as the deployment's workers name them."""
    client = connect(settings.redis_url)
    try:
        return await IdentityRegistry(client, settings).backend_user_id(app=app, user_id=user_id)
    finally:
        await client.aclose()


def run_cli(
    settings: Settings, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``afterthought ARGS`` in its own process, configured like ``settings``."""
    return subprocess.run(
        [sys.executable, "-m", "afterthought.cli", "--log-level", "ERROR", *args],
        env={**os.environ, **settings.as_env()},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def failover_in_traffic(
    redis_url: str,
    failover: Callable[[], object],
    seed: int,
    *,
    failovers: int = 1,
    messages: int = 240,
    think: float = 0.1,
    **settings: Any,
) -> None:
    """The chaos run (ADK sessions in a stalling loop, two worker processes, ambiguous
    backend faults) of ``messages`` on ``redis_url``, ``think`` seconds between a session's
    turns on average, with ``failover`` done ``failovers`` times (one: a third of the way
    in) and writes confirmed by a replica: nothing lost, doubled, reordered or stray."""
    import json

    from bench import chaos

    result = chaos.run(
        messages=messages,
        sessions=8,
        turns_per_session=10,
        workers=2,
        kills=0,
        fault_rate=0.1,
        stall=True,
        think=think,
        seed=seed,
        redis_url=redis_url,
        timeout=120,
        failover=failover,
        failovers=failovers,
        redis_wait_replicas=1,
        **settings,
    )
    report = json.dumps(result)
    assert result["failovers"] == failovers and result["settled"], report
    found = (result["lost"], result["duplicated"], result["out_of_order"], result["stray"])
    assert found == (0, 0, 0, 0), report
