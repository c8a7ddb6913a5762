"""One event that cannot be made into a message (an invocation id with a lone surrogate,
which ADK's API server takes from its client; a timestamp that is not finite) is counted
dropped with its reason; the rest of its session is queued, by the memory service, by
backfill and by the turn path."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from google.adk.agents.callback_context import CallbackContext
from google.adk.events import Event
from google.adk.sessions import Session
from google.genai import types

from afterthought.agent_hooks import TurnMemory, create_callbacks
from afterthought.agent_hooks.backfill import Backfill, jsonl_source
from afterthought.agent_hooks.memory_service import ZepMemoryService
from afterthought.settings import Settings
from afterthought.status import snapshot
from tests.adk_support import make_runner, new_session, say

BAD = ["surrogate", "nan", "inf"]
REASON = {"surrogate": "invalid ids", "nan": "invalid time", "inf": "invalid time"}


def session(bad: str) -> Session:
    """Ten events, five invocations; the seventh is the bad one."""
    events = []
    for i in range(10):
        invocation, at = f"inv-{i // 2}", 1_700_000_000.0 + i
        if i == 6:
            invocation = "inv-\ud800" if bad == "surrogate" else invocation
            at = {"nan": math.nan, "inf": math.inf}.get(bad, at)
        events.append(
            Event(
                author="user" if i % 2 == 0 else "assistant",
                invocation_id=invocation,
                content=(types.UserContent if i % 2 == 0 else types.ModelContent)(f"said {i}"),
                timestamp=at,
            )
        )
    return Session(id=f"s-{bad}", app_name="memtest", user_id="bob", events=events)


async def queued(redis: aioredis.Redis, settings: Settings) -> int:
    return int((await snapshot(redis, settings)).queue.messages)


@pytest.mark.parametrize("bad", BAD)
async def test_the_memory_service_drops_only_the_event_that_cannot_be_made(
    local_settings: Settings, redis: aioredis.Redis, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    service = ZepMemoryService(settings=local_settings)
    try:
        await service.add_session_to_memory(session(bad))  # raises nothing
        assert await queued(redis, local_settings) == 9
        assert service.memory.enqueuer.dropped == 1
        assert f"reason={REASON[bad]}" in caplog.text
        # add_events_to_memory: the same, in a session of its own
        await service.add_events_to_memory(
            app_name="memtest", user_id="bob", events=session(bad).events, session_id="other"
        )
        assert await queued(redis, local_settings) == 18
        assert service.memory.enqueuer.dropped == 2
    finally:
        await service.memory.aclose()
    assert "said " not in caplog.text  # no content in the log


@pytest.mark.parametrize("bad", BAD)
async def test_backfill_leaves_out_only_the_event_that_cannot_be_made_and_goes_on(
    local_settings: Settings, redis: aioredis.Redis, bad: str, tmp_path: Path
) -> None:
    """A JSONL export (Python's JSON: a lone surrogate as ``\\ud800``, NaN and Infinity as
    such) of the bad session and a good one after it: both imported, the bad event
    reported by reason."""
    export = tmp_path / "sessions.jsonl"
    good = session("none").model_copy(update={"id": "s-good"})
    export.write_text(
        "".join(
            json.dumps(s.model_dump(mode="python", by_alias=True), default=str) + "\n"
            for s in (session(bad), good)
        )
    )
    report = await Backfill(local_settings, redis, jsonl_source(export)).run()
    assert (report.sessions, report.messages, report.malformed) == (2, 19, [])
    assert report.dropped == {REASON[bad]: 1}
    assert await queued(redis, local_settings) == 19


@pytest.mark.parametrize("at", [math.nan, math.inf, 1e300])
async def test_a_live_turn_whose_user_event_time_names_no_instant_is_queued(
    local_settings: Settings, redis: aioredis.Redis, at: float
) -> None:
    """The turn path's message is said now: an event time that names no instant (a
    session service's stored value) is not a reason to lose it."""

    def stamp_user_event(callback_context: CallbackContext) -> None:
        callback_context.session.events[-1].timestamp = at

    memory = TurnMemory(local_settings)
    runner, _ = make_runner(create_callbacks(memory), before_agent_callback=stamp_user_event)
    try:
        sid = await new_session(runner, "bob")
        await say(runner, "bob", sid, "hello")
        assert await queued(redis, local_settings) == 2  # the user's and the reply
        assert memory.enqueuer.dropped == 0
    finally:
        await memory.aclose()
