"""Shared fixtures. Redis is the machine's real one (shared: every test gets its own key
prefix and removes its keys); the Zep fake runs in-process on a free port."""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import subprocess
import sys
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

pytest_plugins = ["afterthought.testing.pytest_plugin"]

# --- two tiers of one suite --------------------------------------------------------------
# ``./scripts/test --fast`` runs ``-m "not slow"`` with HYPOTHESIS_PROFILE=fast. The slow
# tier is what waits on processes, servers, failovers, wheels or the whole Zep matrix,
# chosen from ``--durations``; it is marked here, by name, so no test file carries it.
FAST_EXAMPLES = 20
hypothesis.settings.register_profile("fast", max_examples=FAST_EXAMPLES)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
FAST = os.environ.get("HYPOTHESIS_PROFILE") == "fast"

#: Modules that are slow throughout: servers of their own, processes, failovers, wheels.
SLOW_MODULES = {
    "test_chaos",
    "test_cluster",
    "test_live",
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
}
#: The Zep idempotency matrix's combinations the fast tier keeps: every value of each
#: switch at least once (window, reuse, in-flight, hang), the rest are slow.
FAST_MATRIX = {
    "forever-replay-wait-answered",
    "window-422-run_both-answered",
    "forever-409-409-commits-after-timeout",
    "never-commits-after-timeout",
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
    atexit.unregister(enqueue_module._spool_at_exit)
    enqueue_module._spool_at_exit()


def hypothesis_examples(n: int) -> int:
    """A property test's ``max_examples``: its own, or the fast tier's fewer."""
    return min(n, FAST_EXAMPLES) if FAST else n


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.module.__name__.rpartition(".")[2] if item.module else ""
        name = getattr(item, "originalname", item.name)
        callspec = getattr(item, "callspec", None)
        if (
            module in SLOW_MODULES
            or name in SLOW_TESTS
            or (
                name == "test_the_adapter_survives_every_idempotency_behaviour"
                and callspec is not None
                and callspec.id not in FAST_MATRIX
            )
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
    and the sharded layout's (``{prefix:s:x}:...``)."""
    client = syncredis.Redis.from_url(REDIS_URL)
    for pattern in (f"{value}:*", f"arq:*{value}:*", f"{{{value}:*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
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


@pytest.fixture(params=["local", "zep"])
def any_settings(request: pytest.FixtureRequest) -> Settings:
    """Runs a test once per backend."""
    name = "local_settings" if request.param == "local" else "zep_settings"
    settings: Settings = request.getfixturevalue(name)
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
