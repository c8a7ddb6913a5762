"""The two read modes (R2) through a real ADK Runner and a real worker: ``cached`` serves
what the worker built (the batch's block for its session, a user-level block for new
sessions); ``query``, the default, retrieves for the user's message within the budget and
falls back to the cached block when the retrieval is slow, fails, or the user is being
forgotten."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from afterthought.agent_hooks import TurnMemory, create_callbacks
from afterthought.backends import open_backend
from afterthought.backends.base import BackendError, UserRef
from afterthought.backends.local import LocalBackend
from afterthought.context_cache import PENDING, CachedBlock
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.testing import ZepFake
from afterthought.testing.stand_in_model import StandInLlm, memory_lines
from tests.adk_support import APP, make_runner, new_session, say
from tests.conftest import drain


class Scripted(LocalBackend):
    """The real local store, with a turn-path read that can stall or fail on demand."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.queries: list[str] = []
        self.stall = False
        self.fail = False

    async def get_context(
        self,
        *,
        user: UserRef,
        query: str,
        max_chars: int,
        timeout: float,
        template_uuid: str | None = None,
    ) -> str:
        self.queries.append(query)
        if self.stall:
            await asyncio.Event().wait()  # never answers: only the budget ends it
        if self.fail:
            raise BackendError("unavailable", status=503)
        return f"retrieved for: {query}"


async def _history(settings: Settings, user: str = "alice") -> None:
    runner, _ = make_runner(create_callbacks(settings=settings))
    await say(runner, user, await new_session(runner, user), "I moved to Porto last spring.")
    await drain(settings)


async def _block_for(settings: Settings, backend: Scripted, text: str, user: str = "alice") -> str:
    model = StandInLlm()
    memory = create_callbacks(TurnMemory(settings, backend=backend))
    runner, _ = make_runner(memory, model)
    await say(runner, user, await new_session(runner, user), text)
    return "\n".join(memory_lines(model.requests[-1]))


async def _cached_user_block(settings: Settings, user: str = "alice") -> str | None:
    client = aioredis.Redis.from_url(settings.redis_url)
    raw = await client.get(Keys(settings.key_prefix).context_user(APP, user))
    await client.aclose()
    return CachedBlock.parse(raw).block if raw else None


async def test_the_default_injects_the_block_retrieved_for_the_message(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings()
    await _history(settings)
    backend = Scripted(tmp_path / "memory.sqlite3")

    block = await _block_for(settings, backend, "Any tram tips for my city?")

    assert backend.queries == ["Any tram tips for my city?"]
    assert "retrieved for: Any tram tips for my city?" in block


async def test_cached_mode_reads_no_backend_on_a_warm_turn(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings(context_mode="cached")
    await _history(settings)
    backend = Scripted(tmp_path / "memory.sqlite3")

    block = await _block_for(settings, backend, "Any tram tips for my city?")

    assert backend.queries == []
    assert block == (await _cached_user_block(settings) or "").strip()
    assert "Porto" in block


@pytest.mark.parametrize("fault", ["stall", "fail"])
async def test_query_mode_falls_back_to_the_cached_block(
    make_settings: Callable[..., Settings], tmp_path: Path, fault: str
) -> None:
    # A budget the stalled retrieval must exhaust; the outcome, not the time, is asserted.
    settings = make_settings(context_mode="query", retrieval_budget=0.5)
    await _history(settings)
    cached = await _cached_user_block(settings)
    assert cached and "Porto" in cached
    backend = Scripted(tmp_path / "memory.sqlite3")
    setattr(backend, fault, True)

    block = await _block_for(settings, backend, "Any tram tips for my city?")

    assert backend.queries == ["Any tram tips for my city?"]
    assert block == cached.strip()


async def test_query_mode_stops_asking_a_failing_backend(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings(context_mode="query", read_breaker_failures=2)
    await _history(settings)
    backend = Scripted(tmp_path / "memory.sqlite3")
    backend.fail = True
    model = StandInLlm()
    runner, _ = make_runner(create_callbacks(TurnMemory(settings, backend=backend)), model)

    for n in range(4):
        await say(runner, "alice", await new_session(runner, "alice"), f"question {n}")

    assert len(backend.queries) == 2  # the breaker opened after two failures
    assert all(any("Porto" in x for x in memory_lines(r)) for r in model.requests)


async def test_query_mode_serves_nothing_while_the_user_is_forgotten(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings(context_mode="query")
    await _history(settings)
    client = aioredis.Redis.from_url(settings.redis_url)
    await client.set(Keys(settings.key_prefix).forgetting(APP, "alice"), PENDING)
    await client.aclose()
    backend = Scripted(tmp_path / "memory.sqlite3")

    block = await _block_for(settings, backend, "Where do I live?")

    assert backend.queries == []
    assert block == ""


async def test_query_mode_on_zep_asks_graph_context_with_the_message(
    make_settings: Callable[..., Settings], zep_fake: ZepFake
) -> None:
    settings = make_settings(
        backend="zep",
        zep_api_key="test-key",
        zep_base_url=zep_fake.base_url,
        context_mode="query",
    )
    await _history(settings)
    zep_fake.requests.clear()
    model = StandInLlm()
    runner, _ = make_runner(create_callbacks(settings=settings), model)

    await say(runner, "alice", await new_session(runner, "alice"), "Any tram tips for my city?")

    asked = [r.body for r in zep_fake.requests if r.path.endswith("/context")]
    assert asked and asked[0]["query"] == "Any tram tips for my city?"
    assert any("Porto" in line for line in memory_lines(model.requests[-1]))


async def test_worker_caches_the_batch_block_for_its_session_and_a_user_block(
    local_settings: Settings,
) -> None:
    runner, _ = make_runner(create_callbacks(settings=local_settings))
    session = await new_session(runner, "alice")
    said = "My sister Ana just moved to Oslo."
    await say(runner, "alice", session, said)
    await drain(local_settings)

    client = aioredis.Redis.from_url(local_settings.redis_url)
    keys = Keys(local_settings.key_prefix)
    overlay = await client.get(keys.context_thread(APP, "alice", session))
    known = await IdentityRegistry(client, local_settings).lookup_user(app=APP, user_id="alice")
    await client.aclose()
    assert overlay is not None and known is not None
    backend = open_backend(local_settings)
    want_user = await backend.get_context(
        user=known, query="", max_chars=local_settings.context_max_chars, timeout=5
    )
    await backend.aclose()

    # The session's block was retrieved for what was just said (before synthesis ran);
    # the user's is the query-less block, rewritten by synthesis once facts changed.
    assert "Oslo" in CachedBlock.parse(overlay).block
    assert await _cached_user_block(local_settings) == want_user
