"""Operations that a cluster made into single-slot steps (issue 14), in both layouts, on
real Redis: what each step leaves if the process stops right after it, and that the next
step (or a worker) finishes the job from there."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from afterthought.backends import open_backend
from afterthought.backends.base import BackendError, MemoryBackend, UserRef
from afterthought.context_cache import COOLING, PENDING, WRITE_LUA, ContextCache, now_version
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys, digest
from afterthought.settings import Settings
from afterthought.worker import forget as forget_module
from afterthought.worker.forget import Forgetter
from afterthought.worker.jobs import resume_forgets

APP = "split"


class Stopped(Exception):
    """The process stops here."""


@pytest.fixture(params=[0, 8], ids=["flat", "sharded"])
def settings(request: pytest.FixtureRequest, make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(redis_shards=request.param)


@pytest.fixture
async def backend(settings: Settings) -> AsyncIterator[MemoryBackend]:
    opened = open_backend(settings, upgrade=True)
    await opened.prepare()
    yield opened
    await opened.aclose()


async def _user(
    redis: aioredis.Redis, settings: Settings, backend: MemoryBackend, user_id: str
) -> UserRef:
    """A provisioned user with a session and a cached block."""
    user, _, _ = await IdentityRegistry(redis, settings).ensure_thread(
        backend, app=APP, user_id=user_id, session_id="s1"
    )
    await _cache(redis, settings, user_id, user.graph_uuid)
    return user


async def _cache(redis: aioredis.Redis, settings: Settings, user_id: str, graph: str) -> bool:
    cache = ContextCache(settings)
    return await cache.write(
        redis,
        app=APP,
        user_id=user_id,
        session_id="s1",
        graph_uuid=graph,
        block=f"what {user_id} said",
        version=now_version(),
        epoch=await cache.epoch(redis, app=APP, user_id=user_id),
    )


async def _cached(redis: aioredis.Redis, settings: Settings, user_id: str) -> str | None:
    found = await ContextCache(settings).read(redis, app=APP, user_id=user_id, session_id="s1")
    return found.block.block if found.block else None


async def _forgotten(
    redis: aioredis.Redis, settings: Settings, backend: MemoryBackend, user_id: str
) -> None:
    """Everything of the user is gone, and the forget is done."""
    keys = Keys.of(settings)
    assert await IdentityRegistry(redis, settings).lookup_user(app=APP, user_id=user_id) is None
    zep_user_id = await IdentityRegistry(redis, settings).backend_user_id(app=APP, user_id=user_id)
    assert await backend.find_user(zep_user_id=zep_user_id) is None
    assert await _cached(redis, settings, user_id) is None
    assert not await redis.hexists(keys.forgets, digest(APP, user_id))
    assert await redis.get(keys.forgetting(APP, user_id)) == COOLING.encode()


async def test_a_forget_stopped_after_recording_itself_is_finished_by_a_worker(
    settings: Settings, backend: MemoryBackend, redis: aioredis.Redis, monkeypatch: Any
) -> None:
    """The durable entry comes first: stopped before the user's marks, the forget is one a
    worker resumes, marking the user and raising their epoch as the forget would have."""
    keys = Keys.of(settings)
    await _user(redis, settings, backend, "alice")
    await redis.set(keys.epoch(APP, "alice"), 4)  # forgotten four times before
    forgetter = Forgetter(settings, redis, backend)

    async def stop(*args: Any) -> None:
        raise Stopped

    monkeypatch.setattr(forget_module, "marks", stop)
    with pytest.raises(Stopped):
        await forgetter.forget_user(app=APP, user_id="alice")
    monkeypatch.undo()
    record = json.loads(await redis.hget(keys.forgets, digest(APP, "alice")))
    assert (record["app"], record["user_id"], record["epoch"]) == (APP, "alice", 5)
    assert not await redis.exists(keys.forgetting(APP, "alice"))  # no marks yet

    worker = Forgetter(settings, redis, backend)  # another process
    assert await resume_forgets({"forgetter": worker}) == {"resumed": 1, "pending": 0}
    assert await redis.get(keys.epoch(APP, "alice")) == b"5"  # older messages are dropped
    await _forgotten(redis, settings, backend, "alice")


async def test_a_forget_resumed_again_and_again_raises_the_epoch_once(
    settings: Settings, backend: MemoryBackend, redis: aioredis.Redis, monkeypatch: Any
) -> None:
    """While the backend fails, every resume marks the user again; the epoch is the one
    recorded, so what they said after the forget began (queued with it) stays queued."""
    keys = Keys.of(settings)
    await _user(redis, settings, backend, "alice")

    async def unavailable(*, user: UserRef) -> None:
        raise BackendError("unavailable", code="test")

    monkeypatch.setattr(backend, "delete_user", unavailable)
    forgetter = Forgetter(settings, redis, backend)
    assert (await forgetter.forget_user(app=APP, user_id="alice")).pending
    for _ in range(3):
        assert await resume_forgets({"forgetter": forgetter}) == {"resumed": 1, "pending": 1}
        assert await redis.get(keys.epoch(APP, "alice")) == b"1"
        assert await redis.get(keys.forgetting(APP, "alice")) == PENDING.encode()
    monkeypatch.undo()
    assert await resume_forgets({"forgetter": forgetter}) == {"resumed": 1, "pending": 0}
    assert await redis.get(keys.epoch(APP, "alice")) == b"1"
    await _forgotten(redis, settings, backend, "alice")


async def test_a_forget_stopped_before_dropping_its_entry_is_finished_again(
    settings: Settings, backend: MemoryBackend, redis: aioredis.Redis, monkeypatch: Any
) -> None:
    """The entry goes last: stopped after the user's keys went, the forget is still
    pending, and redoing every step finishes it."""
    keys = Keys.of(settings)
    await _user(redis, settings, backend, "alice")
    forgetter = Forgetter(settings, redis, backend)

    async def stop(*args: Any, **kwargs: Any) -> int:
        raise Stopped

    monkeypatch.setattr(forgetter, "_done", stop)  # the script that drops the entry
    with pytest.raises(Stopped):
        await forgetter.forget_user(app=APP, user_id="alice")
    monkeypatch.undo()
    assert await redis.hexists(keys.forgets, digest(APP, "alice"))
    assert await resume_forgets({"forgetter": forgetter}) == {"resumed": 1, "pending": 0}
    await _forgotten(redis, settings, backend, "alice")


async def test_an_old_forget_entry_without_an_epoch_is_resumed(
    settings: Settings, backend: MemoryBackend, redis: aioredis.Redis
) -> None:
    """Entries written before the epoch was recorded (that forget raised it itself)."""
    keys = Keys.of(settings)
    await _user(redis, settings, backend, "alice")
    await redis.set(keys.epoch(APP, "alice"), 2)
    record = {"app": APP, "user_id": "alice", "since": 0}
    await redis.hset(keys.forgets, digest(APP, "alice"), json.dumps(record))
    forgetter = Forgetter(settings, redis, backend)
    assert await resume_forgets({"forgetter": forgetter}) == {"resumed": 1, "pending": 0}
    assert await redis.get(keys.epoch(APP, "alice")) == b"2"
    await _forgotten(redis, settings, backend, "alice")


async def test_a_graph_shared_by_users_in_other_slots_is_invalidated_for_all(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """A shared graph's blocks are cached under each reader, in each reader's slot."""
    readers = [f"reader-{n}" for n in range(12)]
    for user_id in readers:
        assert await _cache(redis, settings, user_id, "shared-graph")
    if settings.redis_shards:
        keys = Keys.of(settings)
        assert len({keys.shard_of(APP, u) for u in readers}) > 1
    cache = ContextCache(settings)
    assert await cache.invalidate_graph(redis, graph_uuid="shared-graph") == 2 * len(readers)
    assert [await _cached(redis, settings, u) for u in readers] == [None] * len(readers)
    assert not await redis.exists(Keys.of(settings).context_graph("shared-graph"))


async def test_a_cache_write_stopped_after_indexing_leaves_nothing_to_serve(
    settings: Settings, redis: aioredis.Redis, monkeypatch: Any
) -> None:
    """The graph's index first: stopped there, the index names entries that were never
    written (an invalidation drops nothing for them), and nothing is served."""
    cache = ContextCache(settings)
    real = redis.register_script

    def stopped(script: str) -> Any:
        if script != WRITE_LUA:  # the index's own script runs: the stop is at the write
            return real(script)

        async def run(**_: Any) -> None:
            raise Stopped

        return run

    monkeypatch.setattr(redis, "register_script", stopped)
    with pytest.raises(Stopped):
        await _cache(redis, settings, "alice", "graph")
    monkeypatch.setattr(redis, "register_script", real)
    assert await redis.scard(Keys.of(settings).context_graph("graph")) == 2
    assert await _cached(redis, settings, "alice") is None
    assert await cache.invalidate_graph(redis, graph_uuid="graph") == 0
    assert await _cache(redis, settings, "alice", "graph")
    assert await _cached(redis, settings, "alice") == "what alice said"


async def test_an_invalidation_between_indexing_and_writing_misses_no_entry(
    settings: Settings, redis: aioredis.Redis, monkeypatch: Any
) -> None:
    """An invalidation of the graph that runs between the write's two steps empties the
    index; the write indexes its entries again once they are written, so the next
    invalidation still finds them."""
    cache = ContextCache(settings)
    index = ContextCache._index
    calls = 0

    async def invalidated_after_first(self: ContextCache, *args: Any) -> None:
        nonlocal calls
        await index(self, *args)
        calls += 1
        if calls == 1:
            await cache.invalidate_graph(redis, graph_uuid="graph")

    monkeypatch.setattr(ContextCache, "_index", invalidated_after_first)
    assert await _cache(redis, settings, "alice", "graph")
    monkeypatch.undo()
    assert await _cached(redis, settings, "alice") == "what alice said"
    assert await cache.invalidate_graph(redis, graph_uuid="graph") == 2
    assert await _cached(redis, settings, "alice") is None
