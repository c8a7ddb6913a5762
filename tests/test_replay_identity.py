"""A session re-added by the memory service is written where its turns were: the
application's resolver pins the replay as it pinned each turn."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from google.adk.agents.readonly_context import ReadonlyContext
from google.adk.sessions import Session
from zep_cloud.client import AsyncZep

from afterthought.agent_hooks import TurnMemory, create_callbacks
from afterthought.agent_hooks.backfill import Backfill, Report, Source
from afterthought.agent_hooks.identity import ZepIdentity
from afterthought.agent_hooks.memory_service import ZepMemoryService
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.testing import ZepFake
from tests.adk_support import APP, make_runner, new_session, say
from tests.conftest import drain


async def _pinned_turns(settings: Settings, memory: TurnMemory, texts: list[str]) -> Session:
    """ada's turns through a real ADK Runner with the callbacks, stored; then the queue's
    memory of their keys gone (``seen`` lives a day, and holds a thread's last 128): the
    finished session, as ADK hands it to a memory service."""
    runner, _ = make_runner(create_callbacks(memory))
    sid = await new_session(runner, "ada")
    for text in texts:
        await say(runner, "ada", sid, text)
    await drain(settings)
    keys = Keys.of(settings)
    redis = aioredis.Redis.from_url(settings.redis_url)
    try:
        await redis.delete(keys.seen(keys.thread_ref(APP, "ada", sid)))
    finally:
        await redis.aclose()
    done = await runner.session_service.get_session(app_name=APP, user_id="ada", session_id=sid)
    assert done is not None
    return done


async def _made_by_the_app(fake: ZepFake) -> tuple[str, str]:
    """A Zep user and thread the application made itself (real zep-cloud SDK)."""
    zep = AsyncZep(api_key="test-key", base_url=fake.base_url)
    user = await zep.user.create(user_id="ada")
    thread = await zep.thread.create(user_uuid=user.uuid_)
    return user.uuid_, thread.uuid_


async def test_add_session_to_memory_goes_where_the_resolver_pinned_the_turns(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    """Measured before: a second Zep user (``<prefix>:ada``) and thread, holding the
    session again. Now the resolver is asked for each invocation, as the turns asked it,
    and the replay finds every message stored in the pinned thread."""
    user_uuid, thread_uuid = await _made_by_the_app(zep_fake)
    asked: list[str] = []

    def resolver(ctx: ReadonlyContext) -> ZepIdentity:
        asked.append(ctx.invocation_id)
        return ZepIdentity(user_uuid=user_uuid, thread_uuid=thread_uuid)

    memory = TurnMemory(zep_settings, resolve_identity=resolver)
    try:
        session = await _pinned_turns(zep_settings, memory, ["hello", "i moved", "i like tea"])
        assert len(zep_fake.messages(thread_uuid)) == 6
        turns = sorted(set(asked))
        asked.clear()
        await ZepMemoryService(memory=memory).add_session_to_memory(session)
        await drain(zep_settings)
    finally:
        await memory.aclose()
    assert sorted(asked) == turns  # once per invocation, with its id
    assert [t["uuid"] for t in zep_fake.threads()] == [thread_uuid]
    assert [u["uuid"] for u in zep_fake.users()] == [user_uuid]
    assert len(zep_fake.messages(thread_uuid)) == 6  # nothing twice
    assert memory.enqueuer.dropped == 0


async def test_a_replay_whose_resolver_fails_is_counted_dropped_not_raised(
    zep_settings: Settings, zep_fake: ZepFake, caplog: pytest.LogCaptureFixture
) -> None:
    """Whose memory are they? Unknown: dropped, counted by reason, as the turn path does."""
    user_uuid, thread_uuid = await _made_by_the_app(zep_fake)
    failing = [False]

    def resolver(ctx: ReadonlyContext) -> ZepIdentity:
        if failing[0]:
            raise RuntimeError("directory down")
        return ZepIdentity(user_uuid=user_uuid, thread_uuid=thread_uuid)

    memory = TurnMemory(zep_settings, resolve_identity=resolver)
    try:
        session = await _pinned_turns(zep_settings, memory, ["hello", "i moved"])
        failing[0] = True
        await ZepMemoryService(memory=memory).add_session_to_memory(session)  # raises nothing
    finally:
        await memory.aclose()
    assert memory.enqueuer.dropped == 4
    assert "enqueue dropped=4 reason=identity unresolved" in caplog.text


async def test_a_backfill_goes_where_the_resolver_pinned_the_turns(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    """``afterthought backfill`` resolves identity as the memory service's replay does:
    given the application's resolver, it asks it once per invocation, and the import finds
    every message in the pinned thread (without it: a second user and thread, holding the
    session again)."""
    user_uuid, thread_uuid = await _made_by_the_app(zep_fake)

    def resolver(ctx: ReadonlyContext) -> ZepIdentity:
        return ZepIdentity(user_uuid=user_uuid, thread_uuid=thread_uuid)

    memory = TurnMemory(zep_settings, resolve_identity=resolver)
    try:
        session = await _pinned_turns(zep_settings, memory, ["hello", "i moved", "i like tea"])
    finally:
        await memory.aclose()

    async def sessions(report: Report) -> AsyncIterator[Session]:
        yield session

    source = Source("resolved", 1, sessions)
    report = await Backfill(zep_settings, redis, source, resolver=resolver).run()
    await drain(zep_settings)
    assert report.messages == 6 and not report.dropped
    assert [t["uuid"] for t in zep_fake.threads()] == [thread_uuid]
    assert [u["uuid"] for u in zep_fake.users()] == [user_uuid]
    assert len(zep_fake.messages(thread_uuid)) == 6  # nothing twice
