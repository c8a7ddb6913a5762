"""The whole loop on real parts: ADK Runner -> Redis queue -> arq worker -> backend, then a
new session's model request carries what the first one said."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from afterthought.agent_hooks import create_callbacks
from afterthought.backends import open_backend
from afterthought.identity import IdentityRegistry
from afterthought.settings import Settings
from afterthought.testing import ZepFake
from afterthought.testing.stand_in_model import memory_lines
from tests.adk_support import APP, make_runner, new_session, say
from tests.conftest import drain

FACTS = ["I live in Lisbon.", "My favourite tea is genmaicha."]


def _env_from(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Configure the hooks through the environment only, as an application would."""
    monkeypatch.setenv("REDIS_URL", settings.redis_url)
    monkeypatch.setenv("AFTERTHOUGHT_KEY_PREFIX", settings.key_prefix)
    monkeypatch.setenv("AFTERTHOUGHT_LOCAL_DB_PATH", str(settings.local_db_path))
    if settings.database_url is not None:
        monkeypatch.setenv("AFTERTHOUGHT_BACKEND", "postgres")
        monkeypatch.setenv("AFTERTHOUGHT_DATABASE_URL", settings.database_url.get_secret_value())
        monkeypatch.setenv("AFTERTHOUGHT_DATABASE_SCHEMA", settings.database_schema)
    if settings.zep_api_key is not None:
        monkeypatch.setenv("ZEP_API_KEY", settings.zep_api_key.get_secret_value())
        monkeypatch.setenv("ZEP_BASE_URL", str(settings.zep_base_url))


async def test_one_user_is_remembered_across_sessions(
    any_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    _env_from(any_settings, monkeypatch)
    runner, model = make_runner(create_callbacks())
    first = await new_session(runner, "alice")
    for fact in FACTS:
        await say(runner, "alice", first, fact)
    await drain(any_settings)

    second = await new_session(runner, "alice")
    reply = await say(runner, "alice", second, "What do you know about me?")

    block = "\n".join(memory_lines(model.requests[-1]))
    assert "Lisbon" in block and "genmaicha" in block
    assert "Lisbon" in reply
    # Nobody else's memory: a new user gets none.
    other = await new_session(runner, "bob")
    await say(runner, "bob", other, "Hello")
    assert memory_lines(model.requests[-1]) == []


async def test_zep_holds_each_message_once_in_order(
    zep_settings: Settings, zep_fake: ZepFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    _env_from(zep_settings, monkeypatch)
    runner, _ = make_runner(create_callbacks())
    session = await new_session(runner, "alice")
    for fact in FACTS:
        await say(runner, "alice", session, fact)
    await drain(zep_settings)
    await drain(zep_settings)  # a second worker run finds nothing more to send

    (thread,) = zep_fake.threads()
    stored = zep_fake.messages(thread["uuid"])
    assert [(m["role"], m["content"]) for m in stored] == [
        ("user", FACTS[0]),
        ("assistant", stored[1]["content"]),
        ("user", FACTS[1]),
        ("assistant", stored[3]["content"]),
    ]
    assert all(m["metadata"]["afterthought_key"] for m in stored)
    assert len({m["metadata"]["afterthought_key"] for m in stored}) == 4
    # Sent with the event's time and the stable key; assistant text kept out of the graph.
    assert all(m["reference_time"] for m in stored)
    adds = [r for r in zep_fake.requests if r.path.endswith("/messages") and r.method == "POST"]
    assert all(r.idempotency_key and r.idempotency_key.startswith("batch:") for r in adds)
    assert all(r.body["ignore_roles"] == ["assistant"] for r in adds)
    (user,) = zep_fake.users()
    assert user["user_id"] == f"{zep_settings.key_prefix}:alice"  # the deployment's alice


async def test_local_backend_is_a_durable_file(
    local_settings: Settings, monkeypatch: pytest.MonkeyPatch, redis: aioredis.Redis
) -> None:
    _env_from(local_settings, monkeypatch)
    runner, _ = make_runner(create_callbacks())
    session = await new_session(runner, "alice")
    await say(runner, "alice", session, FACTS[0])
    await drain(local_settings)

    path = Path(local_settings.local_db_path)
    assert path.stat().st_mode & 0o077 == 0  # private to its owner
    reopened = open_backend(local_settings)  # a new process would see the same
    known = await IdentityRegistry(redis, local_settings).lookup(
        app=APP, user_id="alice", session_id=session
    )
    assert known.user is not None and known.thread_uuid is not None
    block = await reopened.get_context(user=known.user, query="where", max_chars=500, timeout=1)
    assert "Lisbon" in block
    await reopened.aclose()
