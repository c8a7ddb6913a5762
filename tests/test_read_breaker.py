"""A backend that hangs opens the read breaker: every expiry of the turn's read budget
during a backend call counts as a failure, so after ``read_breaker_failures`` turns the
turn path stops calling the backend (and waiting for it) until a half-open probe. Real
ADK Runner and Redis; the breaker's clock is the test's, and so is the event loop's: a
hang or a stall moves the loop's clock past the budget instead of waiting it out, so no
outcome depends on how fast the machine is."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from google.adk.agents.callback_context import CallbackContext

from afterthought.agent_hooks import TurnMemory, ZepIdentity, create_callbacks
from afterthought.agent_hooks.identity import Pins, Who
from afterthought.breaker import CircuitBreaker
from afterthought.settings import Settings
from tests.adk_support import APP, make_runner, new_session, say

FAILURES = 3
OPEN_SECONDS = 10.0
#: A budget no loaded machine spends on the turn's Redis reads before the backend call,
#: and a loop stall that outlasts it (and every deadline within it): the loop's clock
#: jumps, so both deadlines have passed before the loop runs again.
BUDGET = 10.0
STALL = 2 * BUDGET
PINNED = ZepIdentity(user_uuid="u-1", graph_uuid="g-1")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class LoopClock:
    """The running loop's clock (``loop.time``, which ``asyncio.timeout`` reads), moved by
    the test on top of the real one."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.ahead = 0.0
        self._real = loop.time

    def __call__(self) -> float:
        return self._real() + self.ahead

    def stall(self) -> None:
        """The loop is held (another coroutine hogs it) past every deadline of the turn."""
        self.ahead += STALL

    def hang(self) -> None:
        """The loop waits, with nothing to do, past every deadline of the turn."""
        asyncio.get_running_loop().call_soon(self.stall)


@pytest.fixture
async def loop_clock(monkeypatch: pytest.MonkeyPatch) -> LoopClock:
    loop = asyncio.get_running_loop()
    clock = LoopClock(loop)
    monkeypatch.setattr(loop, "time", clock)
    return clock


def _memory(local_settings: Settings, mode: str, **options: Any) -> tuple[TurnMemory, Clock]:
    """Turn memory with the given context mode, the test's budget, and a read breaker on
    the test's clock (it stays open until the test moves the clock); pinned to a user
    unless ``options`` say otherwise."""
    settings = local_settings.model_copy(
        update={
            "context_mode": mode,
            "retrieval_budget": BUDGET,
            "read_breaker_failures": FAILURES,
            # Names a user the registry has no entry for, so the backend is asked for them.
            "zep_user_id_template": "{deployment}:{user_id}",
        }
    )
    memory = TurnMemory.create(settings=settings, **{"identity": PINNED, **options})
    clock = Clock()
    memory.reader.read_breaker = CircuitBreaker(
        failures=FAILURES, seconds=OPEN_SECONDS, clock=clock
    )
    return memory, clock


@pytest.mark.parametrize("mode", ["cached", "query"])
async def test_a_hanging_backend_opens_the_read_breaker(
    mode: str, local_settings: Settings, loop_clock: LoopClock
) -> None:
    memory, clock = _memory(local_settings, mode)
    entered: list[str] = []

    async def hang(**_: Any) -> str:
        entered.append("get_context")
        loop_clock.hang()  # a backend that stopped answering: the budget runs out
        await asyncio.Event().wait()
        return ""

    memory.backend.get_context = hang  # type: ignore[method-assign]
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


async def _no_block(_: Any) -> str:
    return ""


#: Each await of a turn's read that waits on the backend, and the way a turn comes to it:
#: the read of a pinned user's block (read through in ``cached`` mode, retrieved in
#: ``query`` mode), and the lookup of a user the registry has no entry for (a newcomer,
#: or one whose entry expired: the backend may hold their memory) on the way to that read,
#: to a context builder's identity, and in the registry check of a user pinned in session
#: state.
STEPS = [
    pytest.param("cached", "get_context", {}, {}, id="cached-read"),
    pytest.param("query", "get_context", {}, {}, id="query-read"),
    pytest.param("cached", "find_user", {"identity": None}, {}, id="cached-lookup"),
    pytest.param("query", "find_user", {"identity": None}, {}, id="query-lookup"),
    pytest.param(
        "cached",
        "find_user",
        {"identity": None, "context_builder": _no_block},
        {},
        id="builder-lookup",
    ),
    pytest.param(
        "query", "find_user", {"identity": None}, {"zep_user_uuid": "u-1"}, id="state-pin-check"
    ),
]


@pytest.mark.parametrize(("mode", "step", "options", "state"), STEPS)
async def test_a_hang_at_any_backend_step_of_the_read_opens_the_read_breaker(
    mode: str,
    step: str,
    options: dict[str, Any],
    state: dict[str, Any],
    local_settings: Settings,
    loop_clock: LoopClock,
) -> None:
    """Wherever the backend stops answering, the budget's expiry there is a failure: the
    breaker opens within ``read_breaker_failures`` turns, and the turns after it cost next
    to nothing (on the loop's clock, which a hang moves past the budget) until one probes.
    Counted by the calls the backend was given, not by the wall clock."""
    memory, clock = _memory(local_settings, mode, **options)
    entered: list[int] = []

    async def hang(**_: Any) -> Any:
        entered.append(turn)
        loop_clock.hang()  # the backend stopped answering: the budget runs out here
        await asyncio.Event().wait()

    setattr(memory.backend, step, hang)
    runner, model = make_runner(create_callbacks(memory))
    loop = asyncio.get_running_loop()
    took: list[float] = []
    for turn in range(FAILURES + 5):
        session = await runner.session_service.create_session(
            app_name=APP, user_id="alice", state=state
        )
        began = loop.time()
        await say(runner, "alice", session.id, f"hello {turn}")
        took.append(loop.time() - began)
    failures = memory.reader.read_breaker.failures
    assert entered and max(entered) < FAILURES, (
        f"turns {entered} met the hung backend, breaker failures={failures}"
    )
    assert memory.reader.read_breaker.retry_in() > 0  # open
    assert max(took[FAILURES:]) < BUDGET, took  # they waited for nothing

    calls = len(entered)
    clock.now += OPEN_SECONDS  # half-open: one turn probes, the backend still hangs
    for turn in range(FAILURES + 5, FAILURES + 9):
        await say(runner, "alice", await new_session(runner, "alice"), f"hello {turn}")
    assert entered[calls:] == [FAILURES + 5], entered
    assert len(model.requests) == FAILURES + 9  # every turn went on, without memory
    await memory.aclose()
    await runner.close()


@pytest.mark.parametrize("mode", ["cached", "query"])
async def test_a_loop_stall_past_both_deadlines_opens_the_read_breaker(
    mode: str, local_settings: Settings, loop_clock: LoopClock
) -> None:
    """The backend hangs, and the loop stalls during each call past both the call's own
    deadline and the turn's budget: both cancel the read, and the inner ``asyncio.timeout``
    re-raises the cancellation instead of a TimeoutError. That expiry is a failure too: after
    ``read_breaker_failures`` turns no turn calls the backend (or waits for it)."""
    memory, _ = _memory(local_settings, mode)
    calls: list[int] = []

    async def hang(**_: Any) -> str:
        calls.append(turn)
        loop_clock.stall()  # the loop stalls: another coroutine hogs it
        await asyncio.Event().wait()  # a backend that stopped answering
        return ""

    memory.backend.get_context = hang  # type: ignore[method-assign]
    runner, model = make_runner(create_callbacks(memory))
    for turn in range(8):
        await say(runner, "alice", await new_session(runner, "alice"), f"hello {turn}")
    failures = memory.reader.read_breaker.failures
    await memory.aclose()
    await runner.close()
    assert calls == list(range(FAILURES)), (
        f"8 turns on a hung backend: turns {calls} called it, breaker failures={failures}"
    )
    assert len(model.requests) == 8  # every turn went on, without memory


@pytest.mark.parametrize("mode", ["cached", "query"])
async def test_an_answer_after_the_deadline_counts_as_a_failure(
    mode: str, local_settings: Settings, loop_clock: LoopClock
) -> None:
    """A stall can carry the loop past the deadline before its timer gets to run, so that
    an answer ready by then comes through although the deadline passed: the call cost the
    turn more than its budget, and counts as a failure like one cut at the deadline."""
    memory, _ = _memory(local_settings, mode)
    calls: list[int] = []

    async def late(**_: Any) -> str:
        calls.append(turn)
        loop_clock.stall()  # past the deadline, before any timer can fire
        return "lives in: Lisbon"

    memory.backend.get_context = late  # type: ignore[method-assign]
    runner, _ = make_runner(create_callbacks(memory))
    for turn in range(6):
        await say(runner, "alice", await new_session(runner, "alice"), f"hello {turn}")
    await memory.aclose()
    await runner.close()
    assert calls == list(range(FAILURES)), f"turns {calls} called a backend late every time"


@pytest.mark.parametrize("mode", ["cached", "query"])
@pytest.mark.parametrize("step", ["get_context", "find_user"], ids=["read", "lookup"])
@pytest.mark.parametrize("overdue", [False, True])
async def test_a_cancelled_read_propagates_and_counts_only_once_overdue(
    mode: str, step: str, overdue: bool, local_settings: Settings, loop_clock: LoopClock
) -> None:
    """A cancellation that is not the read's own (the turn is cancelled) always reaches the
    caller; it tells the breaker nothing while the call still had time, and a failure once
    the call's deadline has passed (the loop stalled past it, the timers not yet run) —
    during the read of a pinned user's block, and the lookup of a user nobody pinned."""
    pinned = step == "get_context"
    memory, _ = _memory(local_settings, mode, identity=PINNED if pinned else None)
    entered = asyncio.Event()

    async def hang(**_: Any) -> Any:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_soon(task.cancel)  # the turn is cancelled
        if overdue:
            loop_clock.stall()
        entered.set()
        await asyncio.Event().wait()

    setattr(memory.backend, step, hang)
    who = Who("memtest", "alice", "s-1", "inv-1")
    pins = Pins(app=PINNED, trusted=True) if pinned else Pins()
    reading = asyncio.ensure_future(
        memory.reader.read(who, cast(CallbackContext, None), None, pins, "where do I live?")
    )
    with pytest.raises(asyncio.CancelledError):
        await reading
    assert entered.is_set()
    failures = memory.reader.read_breaker.failures
    await memory.aclose()
    assert failures == (1 if overdue else 0)
