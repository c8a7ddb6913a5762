"""A backend that hangs opens the read breaker: every expiry of the turn's read budget
during a backend call counts as a failure, so after ``read_breaker_failures`` turns the
turn path stops calling the backend (and waiting for it) until a half-open probe. Real
ADK Runner and Redis; the breaker's clock is the test's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from afterthought.agent_hooks import TurnMemory, ZepIdentity, create_callbacks
from afterthought.breaker import CircuitBreaker
from afterthought.settings import Settings
from tests.adk_support import make_runner, new_session, say

FAILURES = 3
OPEN_SECONDS = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("mode", ["cached", "query"])
async def test_a_hanging_backend_opens_the_read_breaker(
    mode: str, local_settings: Settings
) -> None:
    settings = local_settings.model_copy(
        update={
            "context_mode": mode,
            "retrieval_budget": 0.2,  # it runs out every time: the backend never answers
            "read_breaker_failures": FAILURES,
        }
    )
    memory = TurnMemory.create(
        settings=settings, identity=ZepIdentity(user_uuid="u-1", graph_uuid="g-1")
    )
    entered: list[str] = []

    async def hang(**_: Any) -> str:
        entered.append("get_context")
        await asyncio.Event().wait()  # a backend that stopped answering
        return ""

    memory.backend.get_context = hang  # type: ignore[method-assign]
    clock = Clock()
    memory.reader.read_breaker = CircuitBreaker(
        failures=FAILURES, seconds=OPEN_SECONDS, clock=clock
    )
    runner, model = make_runner(create_callbacks(memory))

    async def turn(text: str) -> None:
        await say(runner, "alice", await new_session(runner, "alice"), text)

    turns = 0
    while len(entered) < FAILURES:  # each turn misses the cache and waits out its budget
        await turn(f"hello {turns}")
        turns += 1
        assert turns <= FAILURES, "every turn should have waited for the backend"
    assert memory.reader.read_breaker.retry_in() == OPEN_SECONDS  # open

    calls = len(entered)
    for n in range(5):  # open: no turn calls the backend, so none waits for it
        await turn(f"while open {n}")
    assert len(entered) == calls

    clock.now += OPEN_SECONDS  # half-open: one turn probes, the backend still hangs
    await turn("probe")
    assert len(entered) == calls + 1
    for n in range(3):
        await turn(f"open again {n}")
    assert len(entered) == calls + 1
    assert len(model.requests) == turns + 9  # every turn went on, without memory
    await memory.aclose()
    await runner.close()
