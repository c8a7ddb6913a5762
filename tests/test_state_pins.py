"""A thread pinned in session state that is not trusted (clients may write state through
ADK's API server) and is another user's loses nothing: ignored, its messages stored in
the user's own thread, counted, warned about once (naming the setting)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from google.genai import types
from zep_cloud.client import AsyncZep

from afterthought.agent_hooks import TurnMemory, create_callbacks
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.testing import ZepFake
from tests.adk_support import APP, make_runner
from tests.conftest import drain


async def test_an_untrusted_thread_pin_of_another_user_goes_to_the_users_own_thread(
    zep_settings: Settings, zep_fake: ZepFake, caplog: pytest.LogCaptureFixture
) -> None:
    """As an app migrating from zep-adk with default settings: it made the Zep user and
    thread itself and pins both in state. Measured before: all 4 messages dead-lettered
    ``identity_mismatch``."""
    zep = AsyncZep(api_key="test-key", base_url=zep_fake.base_url)
    user = await zep.user.create(user_id="ada")
    made = await zep.thread.create(user_uuid=user.uuid_)
    memory = TurnMemory(zep_settings)
    runner, _ = make_runner(create_callbacks(memory))
    try:
        session = await runner.session_service.create_session(
            app_name=APP,
            user_id="ada",
            state={"zep_user_uuid": user.uuid_, "zep_thread_uuid": made.uuid_},
        )
        for text in ("hello", "i moved to lisbon"):
            async for _ in runner.run_async(
                user_id="ada", session_id=session.id, new_message=types.UserContent(text)
            ):
                pass
    finally:
        await memory.aclose()
    await drain(zep_settings)
    keys = Keys.of(zep_settings)
    redis = aioredis.Redis.from_url(zep_settings.redis_url)
    try:
        dead = sum([await redis.llen(keys.dead(s)) for s in keys.shard_ids])
    finally:
        await redis.aclose()
    assert dead == 0
    assert zep_fake.messages(made.uuid_) == []  # never written to the pinned one
    (own,) = [t for t in zep_fake.threads() if t["uuid"] != made.uuid_]
    assert own["user_uuid"] != user.uuid_  # the deployment's user of ada
    assert len(zep_fake.messages(str(own["uuid"]))) == 4
    assert caplog.text.count("thread pin ignored") == 1
    assert "trust_state_identity=true" in caplog.text
    assert "lisbon" not in caplog.text
