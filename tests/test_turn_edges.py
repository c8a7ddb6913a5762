"""Edges of the turn path: a shutdown that cancels the write before it began, a graph pinned
for reads only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types

from afterthought.agent_hooks import TurnMemory, create_callbacks
from afterthought.connections import connect
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.testing.stand_in_model import StandInLlm
from tests.adk_support import APP


async def _queued_texts(settings: Settings, user: str, session_id: str) -> list[str]:
    keys = Keys.of(settings)
    client = connect(settings.redis_url)
    try:
        pending = keys.pending(keys.thread_ref(APP, user, session_id))
        return [json.loads(raw)["content"] for raw in await client.lrange(pending, 0, -1)]
    finally:
        await client.aclose()


async def _wait_queued(settings: Settings, user: str, session_id: str, want: int) -> list[str]:
    deadline = time.monotonic() + 10
    while True:
        found = await _queued_texts(settings, user, session_id)
        if len(found) >= want or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.05)


async def _run(runner: Runner, user: str, sid: str, text: str, **kwargs: Any) -> None:
    async for _ in runner.run_async(
        user_id=user, session_id=sid, new_message=types.UserContent(text), **kwargs
    ):
        pass


def _agent_runner(memory: TurnMemory, model: StandInLlm, tools: list[Any]) -> Runner:
    pair = create_callbacks(memory)
    agent = LlmAgent(
        name="helper",
        model=model,
        instruction="Be brief.",
        tools=tools,
        before_model_callback=pair.before_model_callback,
        after_model_callback=pair.after_model_callback,
    )
    return Runner(app_name=APP, agent=agent, session_service=InMemorySessionService())


async def test_a_fact_remembered_with_a_shared_graph_pinned_goes_to_the_users_graph(
    zep_settings: Settings,
) -> None:
    """README: ``identity=ZepIdentity(graph_uuid=...)`` alone "binds reads to a shared
    knowledge-base graph". The memory tools queue ``remember`` with that identity, and the
    worker writes a change to ``head.zep_graph_uuid`` when there is one: one user's
    remembered fact lands in the graph every user reads (here, another user's search of
    the knowledge base finds it)."""
    from afterthought.agent_hooks import ZepIdentity
    from afterthought.agent_hooks.memory_tools import create_memory_tools
    from afterthought.backends import open_backend
    from afterthought.identity import IdentityRegistry
    from afterthought.search import SearchRequest
    from tests.conftest import drain

    client = connect(zep_settings.redis_url)
    backend = open_backend(zep_settings)
    registry = IdentityRegistry(client, zep_settings)
    kb, _ = await registry.ensure_user(backend, app=APP, user_id="knowledge-base")
    alice, _ = await registry.ensure_user(backend, app=APP, user_id="alice")

    shared = ZepIdentity(graph_uuid=kb.graph_uuid)
    memory = TurnMemory.create(settings=zep_settings, identity=shared)
    secret = "My door code is 4321."
    model = StandInLlm(script=[{"call": "remember", "args": {"fact": secret}}, "Saved it."])
    runner = _agent_runner(memory, model, create_memory_tools(memory))
    session = await runner.session_service.create_session(app_name=APP, user_id="alice")
    await _run(runner, "alice", session.id, "Remember my door code: 4321.")
    await memory.aclose()
    await drain(zep_settings)

    async def holds(graph: str) -> bool:
        hits = await backend.search(
            graph_uuid=graph,
            request=SearchRequest(query="door code 4321", scope="episodes", limit=50),
            timeout=10,
        )
        return any(secret in h.text for h in hits)

    in_kb, in_alice = await holds(kb.graph_uuid), await holds(alice.graph_uuid)
    await backend.aclose()
    await client.aclose()
    assert (in_kb, in_alice) == (False, True), (
        f"alice's remembered fact: in the shared knowledge base {in_kb}, in her graph {in_alice}"
    )


async def test_a_shutdown_cancel_before_the_write_began_holds_the_message(
    local_settings: Settings, monkeypatch: Any
) -> None:
    """A shutdown (SIGTERM handler, ``asyncio.run`` ending) cancels every task of the loop.
    If the cancel lands in the loop iteration in which a hook has just handed a message to
    the recorder, the write task is cancelled before its first step: ``_enqueue``'s
    ``except CancelledError`` (which holds the messages) never runs, since a coroutine
    cancelled before it starts runs no code. The message is neither queued, buffered nor
    counted dropped."""
    from afterthought.agent_hooks.turn_recorder import TurnRecorder

    me = asyncio.current_task()
    original = TurnRecorder.record

    def shutdown() -> None:  # what a SIGTERM handler does: cancel every task
        for task in asyncio.all_tasks():
            if task is not me:
                task.cancel()

    def record(self: TurnRecorder, messages: Any) -> asyncio.Task[bool]:
        asyncio.get_running_loop().call_soon(shutdown)  # the signal is being handled
        return original(self, messages)

    monkeypatch.setattr(TurnRecorder, "record", record)
    memory = TurnMemory.create(settings=local_settings)
    runner = _agent_runner(memory, StandInLlm(script=["Hello."]), [])
    user = "user-shutdown"
    session = await runner.session_service.create_session(app_name=APP, user_id=user)
    turn = asyncio.ensure_future(_run(runner, user, session.id, "I live in Porto."))
    with contextlib.suppress(asyncio.CancelledError):
        await turn
    await asyncio.sleep(0.2)
    monkeypatch.setattr(TurnRecorder, "record", original)
    queued = await _wait_queued(local_settings, user, session.id, 1)
    enqueuer = memory.enqueuer
    buffered, dropped = enqueuer.buffered, enqueuer.dropped
    await memory.aclose()
    missing = {"I live in Porto."} - set(queued)
    assert len(missing) <= buffered + dropped, (
        f"lost {sorted(missing)}; queued {queued}, buffered {buffered}, dropped {dropped}"
    )
