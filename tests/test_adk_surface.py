"""The ADK surface through real Runners and Apps with the stand-in model: plugin, context
tool, injection modes, context builder, identity, provisioning races, the cached read path."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from google.adk.agents import LlmAgent, SequentialAgent
from google.adk.agents.callback_context import CallbackContext
from google.adk.apps import App
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types

from afterthought.agent_hooks import (
    ContextInput,
    MemoryPlugin,
    ZepContextTool,
    ZepIdentity,
    create_after_model_callback,
    create_callbacks,
)
from afterthought.agent_hooks.injection import transient_content_supported
from afterthought.agent_hooks.provisioning import ensure_thread, ensure_user
from afterthought.backends import open_backend
from afterthought.context_cache import ContextCache
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.testing import ZepFake
from afterthought.testing.stand_in_model import StandInLlm, memory_lines, system_text
from tests.adk_support import APP, make_runner, new_session, say
from tests.conftest import drain

ROOT = Path(__file__).resolve().parents[1]


async def _remembered(settings: Settings, text: str = "I live in Lisbon.") -> None:
    runner, _ = make_runner(create_callbacks(settings=settings))
    await say(runner, "alice", await new_session(runner, "alice"), text)
    await drain(settings)


def _contexts(fake: ZepFake) -> int:
    return sum(r.path.endswith("/context") for r in fake.requests)


async def test_plugin_gives_every_agent_of_an_app_memory(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    await _remembered(zep_settings)
    first, second = StandInLlm(script=["Step one."]), StandInLlm(script=["Step two."])
    pipeline = SequentialAgent(
        name="pipeline",
        sub_agents=[LlmAgent(name="a", model=first), LlmAgent(name="b", model=second)],
    )
    app = App(name=APP, root_agent=pipeline, plugins=[MemoryPlugin(settings=zep_settings)])
    runner = Runner(app=app, session_service=InMemorySessionService())
    await say(runner, "alice", await new_session(runner, "alice"), "Plan my day.")
    await drain(zep_settings)

    for model in (first, second):
        assert any("Lisbon" in line for line in memory_lines(model.requests[-1]))
    stored = [(m["role"], m["content"]) for m in zep_fake.messages()][2:]
    assert stored == [
        ("user", "Plan my day."),
        ("assistant", "Step one."),
        ("assistant", "Step two."),
    ]
    await runner.close()


class _Redact(BasePlugin):
    """A guardrail that rewrites every reply (as a PII redaction does)."""

    async def after_model_callback(
        self, *, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        text = "".join(p.text or "" for p in (llm_response.content or types.Content()).parts or [])
        if not text:
            return None
        return LlmResponse(content=types.ModelContent(text.replace("4321", "[redacted]")))


@pytest.mark.parametrize("memory_first", [True, False], ids=["memory-first", "redact-first"])
async def test_the_plugin_records_the_reply_the_user_is_shown_whatever_the_order(
    local_settings: Settings,
    redis: aioredis.Redis,
    memory_first: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """ADK stops at the first plugin whose ``after_model_callback`` returns a response: a
    rewriting plugin listed first hid the reply from ``MemoryPlugin``, listed after it had
    the unredacted text stored. Either way the redacted reply (what the user saw) is queued
    once; out of first place the plugin warns."""
    memory = MemoryPlugin(settings=local_settings)
    redact = _Redact(name="redact")
    agent = LlmAgent(name="helper", model=StandInLlm(script=["Your code is 4321."] * 2))
    plugins = [memory, redact] if memory_first else [redact, memory]
    runner = Runner(
        app=App(name=APP, root_agent=agent, plugins=plugins),
        session_service=InMemorySessionService(),
    )
    caplog.set_level(logging.WARNING, logger="afterthought.hooks")
    session = await new_session(runner, "alice")
    await say(runner, "alice", session, "What is my code?")
    await say(runner, "alice", session, "Again?")
    dropped = memory.memory.enqueuer.dropped
    await runner.close()
    await drain(local_settings)

    backend = open_backend(local_settings)
    known = await IdentityRegistry(redis, local_settings).lookup(
        app=APP, user_id="alice", session_id=session
    )
    assert known.thread_uuid is not None
    newest_first = await backend.recent_messages(thread_uuid=known.thread_uuid, limit=10)
    stored = [m.content for m in reversed(newest_first)]
    await backend.aclose()
    assert (stored, dropped) == (
        ["What is my code?", "Your code is [redacted].", "Again?", "Your code is [redacted]."],
        0,
    )
    warned = [r for r in caplog.records if "not the first plugin" in r.getMessage()]
    assert len(warned) == (0 if memory_first else 1)


async def test_context_tool_is_never_declared_and_keeps_memory_across_tool_steps(
    local_settings: Settings,
) -> None:
    await _remembered(local_settings)

    def weather(city: str) -> str:
        """Weather for a city."""
        return f"sunny in {city}"

    tool = ZepContextTool(settings=local_settings)
    model = StandInLlm(script=[{"call": "weather", "args": {"city": "Lisbon"}}, "Sunny."])
    agent = LlmAgent(
        name="helper",
        model=model,
        tools=[tool, weather],
        after_model_callback=create_after_model_callback(tool.memory),
    )
    runner = Runner(app_name=APP, agent=agent, session_service=InMemorySessionService())
    await say(runner, "alice", await new_session(runner, "alice"), "Weather at home?")

    assert len(model.requests) == 2
    for request in model.requests:
        assert any("Lisbon" in line for line in memory_lines(request))
        assert "zep_context" not in request.tools_dict
        assert "weather" in request.tools_dict


def test_adk_still_has_the_private_transient_content_hook() -> None:
    """``injection="user_content"`` relies on it; this fails loudly when ADK drops it."""
    assert transient_content_supported()


async def test_user_content_injection_keeps_the_system_prompt_stable(
    local_settings: Settings,
) -> None:
    await _remembered(local_settings)
    runner, model = make_runner(create_callbacks(settings=local_settings, injection="user_content"))
    await say(runner, "alice", await new_session(runner, "alice"), "Where do I live?")

    request = model.requests[-1]
    assert "<ZEP_CONTEXT>" not in system_text(request)
    user_texts = [p.text or "" for c in request.contents if c.role == "user" for p in c.parts or []]
    assert any("<ZEP_CONTEXT>" in t and "Lisbon" in t for t in user_texts)
    assert user_texts[-1] == "Where do I live?"  # memory sits before the user's turn


async def test_custom_context_builder_and_template(local_settings: Settings) -> None:
    await _remembered(local_settings)
    seen: list[ContextInput] = []

    async def builder(given: ContextInput) -> str | None:
        seen.append(given)
        return "custom block with {braces} and 100%"

    memory = create_callbacks(
        settings=local_settings, context_builder=builder, context_template="MEM<<{context}>>"
    )
    runner, model = make_runner(memory)
    await say(runner, "alice", await new_session(runner, "alice"), "Hi")

    assert "MEM<<custom block with {braces} and 100%>>" in system_text(model.requests[-1])
    assert seen[0].user_message == "Hi" and seen[0].user is not None


async def test_explicit_graph_binding_reads_a_shared_graph(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    """A shared (non-user) graph: everyone's turns read the knowledge base's memory."""
    await _remembered(zep_settings, "Our office is in Porto.")
    (company,) = zep_fake.users()
    memory = create_callbacks(
        settings=zep_settings, identity=ZepIdentity(graph_uuid=company["graph_uuid"])
    )
    runner, model = make_runner(memory)
    await say(runner, "bob", await new_session(runner, "bob"), "Where is the office?")
    assert any("Porto" in line for line in memory_lines(model.requests[-1]))


async def test_pinned_state_identity_is_used_and_nothing_is_provisioned(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    """An application that alone writes session state pins its own Zep users there."""
    from zep_cloud import AsyncZep

    zep_settings = zep_settings.model_copy(update={"trust_state_identity": True})
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url)
    user = await zep.user.create(user_id="app-owned")
    thread = await zep.thread.create(user_uuid=str(user.uuid_))
    runner, _ = make_runner(create_callbacks(settings=zep_settings))
    session = await runner.session_service.create_session(
        app_name=APP,
        user_id="alice",
        state={
            "zep_user_uuid": str(user.uuid_),
            "zep_graph_uuid": str(user.graph_uuid),
            "zep_thread_uuid": str(thread.uuid_),
            "zep_first_name": "Alice",
        },
    )
    await say(runner, "alice", session.id, "I live in Lisbon.")
    await drain(zep_settings)

    assert len(zep_fake.users()) == 1 and len(zep_fake.threads()) == 1
    stored = zep_fake.messages(str(thread.uuid_))
    assert (stored[0]["content"], stored[0]["name"]) == ("I live in Lisbon.", "Alice")


async def test_a_per_call_resolver_picks_the_identity(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    await _remembered(zep_settings, "Tenant A likes tea.")
    (tenant,) = zep_fake.users()

    def resolver(ctx: object) -> ZepIdentity:
        return ZepIdentity(graph_uuid=tenant["graph_uuid"])

    runner, model = make_runner(create_callbacks(settings=zep_settings, resolve_identity=resolver))
    await say(runner, "carol", await new_session(runner, "carol"), "What do we like?")
    assert any("tea" in line for line in memory_lines(model.requests[-1]))


async def test_first_turn_of_a_new_session_is_served_from_the_cache(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    """Zep ingests asynchronously: the block the worker got back with a batch may lack it,
    so it serves only that session, and the next new session reads through once; the
    sessions after that are served from the cache (``cached`` mode: the default reads
    for the message)."""
    zep_settings = zep_settings.model_copy(update={"context_mode": "cached"})
    await _remembered(zep_settings)
    runner, model = make_runner(create_callbacks(settings=zep_settings))
    await say(runner, "alice", await new_session(runner, "alice"), "Hi")  # reads through
    assert any("Lisbon" in line for line in memory_lines(model.requests[-1]))
    before = _contexts(zep_fake)
    await say(runner, "alice", await new_session(runner, "alice"), "Where do I live?")
    assert any("Lisbon" in line for line in memory_lines(model.requests[-1]))
    assert _contexts(zep_fake) == before  # no backend read on the turn


async def test_a_stale_block_is_served_then_refreshed_once(
    make_settings: Callable[..., Settings], zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    settings = make_settings(
        backend="zep",
        zep_api_key="k",
        zep_base_url=zep_fake.base_url,
        context_fresh_seconds=0,
        context_mode="cached",
    )
    await _remembered(settings)
    await ContextCache(settings).write(
        redis,
        app=APP,
        user_id="alice",
        session_id=None,
        graph_uuid="g",
        block="old block",
        version=1,
        epoch=0,
    )
    await redis.delete(Keys(settings.key_prefix).context_thread(APP, "alice", "x"))
    memory = create_callbacks(settings=settings)
    runner, model = make_runner(memory)
    before = _contexts(zep_fake)
    await asyncio.gather(
        *[say(runner, "alice", await new_session(runner, "alice"), "Hi") for _ in range(3)]
    )
    assert all(memory_lines(r) for r in model.requests)  # served at once, stale or not
    for _ in range(50):
        if _contexts(zep_fake) > before:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    assert _contexts(zep_fake) - before == 1  # one refresh for the key, not one per turn
    cached = (
        await ContextCache(settings).read(redis, app=APP, user_id="alice", session_id="y")
    ).block
    assert cached is not None and "Lisbon" in cached.block


async def test_cache_writes_keep_the_newest_version(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    cache = ContextCache(local_settings)
    for block, version in (("newer", 20), ("older", 10)):
        await cache.write(
            redis,
            app=APP,
            user_id="u",
            session_id="s",
            graph_uuid="g",
            block=block,
            version=version,
            epoch=0,
        )
    cached = (await cache.read(redis, app=APP, user_id="u", session_id="s")).block
    assert cached is not None and (cached.block, cached.version) == ("newer", 20)


async def test_invalidating_a_graph_reaches_every_reader_and_a_user_all_sessions(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    """A shared graph's block is cached under each user who reads it; a user's block under
    the user and each of their sessions."""
    cache = ContextCache(local_settings)

    async def cached(user: str, session: str) -> str | None:
        found = (await cache.read(redis, app=APP, user_id=user, session_id=session)).block
        return found.block if found else None

    for user, session, graph in (("u", "s1", "kb"), ("v", "s2", "kb"), ("w", "s3", "own")):
        assert await cache.write(
            redis,
            app=APP,
            user_id=user,
            session_id=session,
            graph_uuid=graph,
            block=f"{user} block",
            version=1,
            epoch=0,
        )
    assert await cache.invalidate_graph(redis, graph_uuid="kb") == 4  # two users, two each
    assert await cached("u", "s1") is None and await cached("v", "s2") is None
    assert await cached("w", "s3") == "w block"
    assert await cache.invalidate_user(redis, app=APP, user_id="w") >= 2
    assert await cached("w", "s3") is None and await cached("w", "other") is None


async def test_provisioning_calls_on_created_once(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    created: list[str] = []

    async def hook(user: object) -> None:
        created.append(str(user))

    for _ in range(2):
        await ensure_user(app=APP, user_id="dana", on_created=hook, settings=zep_settings)
    thread, made = await ensure_thread(
        app=APP, user_id="dana", session_id="s1", settings=zep_settings
    )
    again, made_again = await ensure_thread(
        app=APP, user_id="dana", session_id="s1", settings=zep_settings
    )
    assert len(created) == 1 and (made, made_again) == (True, False) and thread == again
    assert len(zep_fake.users()) == 1 and len(zep_fake.threads()) == 1


RACE = """
import asyncio, json, sys
from afterthought.settings import Settings
from afterthought.agent_hooks.provisioning import ensure_thread
settings = Settings.model_validate_json(sys.argv[1])
thread, created = asyncio.run(ensure_thread(app="memtest", user_id="eve", session_id="s1",
                                            settings=settings))
print(json.dumps([thread, created]))
"""


def test_provisioning_raced_from_several_processes_creates_one_user_and_thread(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    zep_fake.latency = 0.05  # widen the race
    payload = zep_settings.model_dump_json().replace('"**********"', '"k"')
    settings = json.loads(payload)
    settings["zep_api_key"] = "k"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, json.dumps(settings)],
            cwd=ROOT,
            env=os.environ.copy(),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert len({thread for thread, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert len(zep_fake.users()) == 1 and len(zep_fake.threads()) == 1


def test_hooks_record_opentelemetry_metrics_without_ids_or_content(
    local_settings: Settings,
) -> None:
    """The instruments are created at import against the global meter provider, so the
    test runs in a fresh interpreter with an in-memory reader installed first."""
    script = f"""
import asyncio, json
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
from afterthought.settings import Settings
from afterthought.agent_hooks import create_callbacks
from tests.adk_support import make_runner, new_session, say
settings = Settings.model_validate_json({local_settings.model_dump_json()!r})

async def main():
    runner, _ = make_runner(create_callbacks(settings=settings))
    session = await new_session(runner, "alice")
    await say(runner, "alice", session, "secret-words here")
    await say(runner, "alice", session, "again")

asyncio.run(main())
found = {{}}
for rm in reader.get_metrics_data().resource_metrics:
    for sm in rm.scope_metrics:
        for m in sm.metrics:
            found[m.name] = [dict(p.attributes or {{}}) for p in m.data.data_points]
print(json.dumps(found))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "afterthought.retrieval.duration" in found
    assert {"result": "miss"} in found["afterthought.context_cache.reads"]
    assert "secret" not in done.stdout and "alice" not in done.stdout
