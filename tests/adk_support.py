"""Driving a real ADK Runner with the stand-in model."""

from __future__ import annotations

from typing import Any

from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig, StreamingMode
from google.adk.events.event import Event
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService, Session
from google.genai import types

from afterthought.agent_hooks import MemoryCallbacks
from afterthought.testing.stand_in_model import StandInLlm

APP = "memtest"


def make_runner(
    callbacks: MemoryCallbacks,
    model: StandInLlm | None = None,
    *,
    app: str = APP,
    **agent_kwargs: Any,
) -> tuple[Runner, StandInLlm]:
    model = model or StandInLlm()
    agent = LlmAgent(
        name="helper",
        model=model,
        instruction="Be brief.",
        before_model_callback=callbacks.before_model_callback,
        after_model_callback=callbacks.after_model_callback,
        **agent_kwargs,
    )
    return Runner(app_name=app, agent=agent, session_service=InMemorySessionService()), model


async def new_session(runner: Runner, user_id: str) -> str:
    session = await runner.session_service.create_session(app_name=APP, user_id=user_id)
    return session.id


async def say(
    runner: Runner, user_id: str, session_id: str, text: str, *, stream: bool = False
) -> str:
    """One turn; returns the final reply text."""
    config = RunConfig(streaming_mode=StreamingMode.SSE) if stream else RunConfig()
    final = ""
    async for event in runner.run_async(
        user_id=user_id,
        session_id=session_id,
        new_message=types.UserContent(text),
        run_config=config,
    ):
        if event.is_final_response() and event.content and event.content.parts:
            final = "".join(p.text or "" for p in event.content.parts)
    return final


def said_session(
    sid: str, texts: list[str], *, user: str = "alice", at: float = 1_700_000_000.0
) -> Session:
    """A held ADK session of ``user``'s: user turns and replies alternating, one invocation
    a pair, one second apart from ``at``."""
    events = [
        Event(
            author="user" if i % 2 == 0 else "assistant",
            invocation_id=f"{sid}-inv-{i // 2}",
            content=(types.UserContent if i % 2 == 0 else types.ModelContent)(text),
            timestamp=at + i,
        )
        for i, text in enumerate(texts)
    ]
    return Session(
        id=sid, app_name=APP, user_id=user, events=events, last_update_time=at + len(texts)
    )
