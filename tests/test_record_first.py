"""W0, record first: on every path of the agent (callbacks, plugin, context tool, memory
tools, memory service), a fault at any await — a timeout, an error, a cancellation, before
or after the call it cuts — never costs a write: every message said ends queued in Redis,
or counted in ``Enqueuer.dropped``. Real ADK Runner, real Redis; the session pins its
identity in (untrusted) state, so the turn path has a registry check to make."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio.client as redis_client
from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.events import Event
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService, Session
from google.genai import types

from afterthought.agent_hooks import (
    MemoryPlugin,
    TurnMemory,
    ZepContextTool,
    ZepIdentity,
    ZepMemoryService,
    create_after_model_callback,
    create_callbacks,
)
from afterthought.agent_hooks.memory_tools import create_memory_tools
from afterthought.agent_hooks.messages import messages_from_events
from afterthought.backends import open_backend
from afterthought.connections import connect
from afterthought.contract import MEMORY_SESSION, checksum, message_key
from afterthought.enqueue import Enqueuer
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.testing.stand_in_model import StandInLlm
from tests.adk_support import APP, say
from tests.conftest import FAST

FACT = "Alice drinks her tea without sugar."
#: A fault, and whether it cuts the call before it is made or after it was made (its
#: outcome unknown to the caller, as after a timeout).
KINDS = [
    ("timeout", "before"),
    ("timeout", "after"),
    ("error", "before"),
    ("cancel", "before"),
    ("cancel", "after"),
]
ENTRIES = ["callbacks", "plugin", "context_tool", "resolver"]


class Faults:
    """Counts every await of the agent's thread that leaves our code (a Redis command or
    pipeline, a backend call, the application's resolver); the ``at``-th one fails. The
    drain thread's own calls pass untouched: it is not an agent's path."""

    def __init__(self) -> None:
        self.kind, self.when = "", ""
        self.at = 0
        self.calls = 0
        self._thread = threading.get_ident()

    def wrap(self, call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(call)
        async def faulty(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self._thread or not self.at:
                return await call(*args, **kwargs)
            self.calls += 1
            if self.calls != self.at:
                return await call(*args, **kwargs)
            if self.when == "after":
                await call(*args, **kwargs)
            await self._fail()
            raise AssertionError("unreachable")

        return faulty

    async def _fail(self) -> None:
        if self.kind == "timeout":
            raise TimeoutError
        if self.kind == "error":
            raise RuntimeError("injected")
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # a real cancellation of whatever task awaits here
        await asyncio.sleep(0)


def _patch(monkeypatch: pytest.MonkeyPatch, faults: Faults) -> None:
    monkeypatch.setattr(
        redis_client.Redis, "execute_command", faults.wrap(redis_client.Redis.execute_command)
    )
    monkeypatch.setattr(
        redis_client.Pipeline, "execute", faults.wrap(redis_client.Pipeline.execute)
    )


def _memory(settings: Settings, faults: Faults, entry: str) -> TurnMemory:
    options: dict[str, Any] = {}
    if entry == "resolver":

        async def resolver(ctx: Any) -> ZepIdentity | None:
            return None  # the application pins nothing: state's pins are all there is

        options["resolve_identity"] = faults.wrap(resolver)
    memory = TurnMemory.create(settings=settings, **options)
    backend = memory.backend
    for name, call in inspect.getmembers(backend, inspect.iscoroutinefunction):
        if not name.startswith("_"):
            setattr(backend, name, faults.wrap(call))
    return memory


def _runner(memory: TurnMemory, entry: str) -> Runner:
    """An agent that answers the first turn at once (one model call), and calls
    ``remember``, ``recall_context`` and ``memory_search`` before it answers the second."""
    model = StandInLlm(
        script=[
            "Noted, Porto.",
            {"call": "remember", "args": {"fact": "Alice lives in Lisbon."}},
            {"call": "recall_context", "args": {}},
            {"call": "memory_search", "args": {"query": "Lisbon"}},
            "Noted, Lisbon.",
        ]
    )
    tools: list[Any] = create_memory_tools(memory)
    hooks: dict[str, Any] = {}
    if entry in ("callbacks", "resolver"):
        pair = create_callbacks(memory)
        hooks = {
            "before_model_callback": pair.before_model_callback,
            "after_model_callback": pair.after_model_callback,
        }
    elif entry == "context_tool":
        tools.append(ZepContextTool(memory=memory))
        hooks = {"after_model_callback": create_after_model_callback(memory)}
    agent = LlmAgent(name="helper", model=model, instruction="Be brief.", tools=tools, **hooks)
    sessions = InMemorySessionService()
    if entry == "plugin":
        app = App(name=APP, root_agent=agent, plugins=[MemoryPlugin(memory=memory)])
        return Runner(app=app, session_service=sessions)
    return Runner(app_name=APP, agent=agent, session_service=sessions)


def _imported(user: str) -> Session:
    """A session handed to ``add_session_to_memory``: said elsewhere, never seen by a hook."""
    events = [
        Event(author="user", invocation_id="old-1", content=types.UserContent("I cycle.")),
        Event(author="helper", invocation_id="old-1", content=types.ModelContent("Nice.")),
    ]
    return Session(id=f"imported-{uuid.uuid4().hex[:8]}", app_name=APP, user_id=user, events=events)


def _said(session: Session) -> list[tuple[str, str]]:
    """(session, key) of every message a session holds, keyed as the hooks key them, and
    of every fact its model asked to remember, in the order they were said."""
    found = [
        (m.session_id, m.key)
        for m in messages_from_events(
            session.events,
            app=APP,
            user_id=session.user_id,
            session_id=session.id,
            assistant_name=None,
        )
    ]
    for event in session.events:
        for call in event.get_function_calls():
            if call.name == "remember":
                source = f"fact:{event.invocation_id}:{call.id}"
                found.append((MEMORY_SESSION, _fact_key(session.user_id, source)))
    return found


def _fact_key(user: str, invocation: str) -> str:
    return message_key(
        app=APP,
        user_id=user,
        session_id=MEMORY_SESSION,
        invocation_id=invocation,
        role="user",
        ordinal=0,
    )


async def _queued(settings: Settings, user: str, sessions: set[str]) -> list[tuple[str, str]]:
    """(session, key) of every message queued in the sessions' threads, in queue order."""
    keys = Keys.of(settings)
    client = connect(settings.redis_url)
    try:
        found = []
        for session_id in sorted(sessions):
            pending = keys.pending(keys.thread_ref(APP, user, session_id))
            found += [
                (session_id, json.loads(raw)["key"]) for raw in await client.lrange(pending, 0, -1)
            ]
        return found
    finally:
        await client.aclose()


def _disorder(said: list[tuple[str, str]], queued: list[tuple[str, str]]) -> list[str]:
    """What is wrong with the queue besides a missing message: a copy, a message nobody
    said, or a thread's messages out of the order they were said in."""
    wrong = [f"queued twice: {k}" for k in {k for k in queued if queued.count(k) > 1}]
    wrong += [f"never said: {k}" for k in set(queued) - set(said)]
    for session_id in {s for s, _ in said}:
        in_queue = [k for s, k in queued if s == session_id]
        if in_queue != [k for s, k in said if s == session_id and k in in_queue]:
            wrong.append(f"out of order in {session_id}")
    return wrong


async def _registered(settings: Settings, user: str) -> str:
    """The user's Zep UUID, registered as the worker would."""
    client = connect(settings.redis_url)
    backend = open_backend(settings)
    try:
        known, _ = await IdentityRegistry(client, settings).ensure_user(
            backend, app=APP, user_id=user
        )
        return known.user_uuid
    finally:
        await backend.aclose()
        await client.aclose()


async def _step(work: Callable[[], Awaitable[object]], broke: list[str]) -> None:
    """One step in a task of its own: a fault that cancels it ends that step only; an
    exception out of it (memory breaking the turn, R1) is noted in ``broke``."""
    try:
        await asyncio.ensure_future(work())
    except asyncio.CancelledError:
        pass
    except Exception as exc:
        broke.append(type(exc).__name__)


async def _run(settings: Settings, faults: Faults, entry: str, at: int) -> None:
    """One run with the ``at``-th await failing, for a user of its own whose
    session pins their user and a thread in (untrusted) state; every message said is
    checked."""
    user = f"user-{uuid.uuid4().hex[:8]}"
    pins = {
        "zep_user_uuid": await _registered(settings, user),
        "zep_thread_uuid": str(uuid.uuid4()),
    }
    memory = _memory(settings, faults, entry)
    runner = _runner(memory, entry)
    session = await runner.session_service.create_session(app_name=APP, user_id=user, state=pins)
    service = ZepMemoryService(memory=memory)
    imported = _imported(user)
    added = MemoryEntry(content=types.UserContent(FACT))

    broke: list[str] = []
    faults.at, faults.calls = at, 0
    await _step(lambda: say(runner, user, session.id, "I work in Porto."), broke)
    await _step(lambda: say(runner, user, session.id, "And I live in Lisbon."), broke)
    await _step(lambda: service.add_session_to_memory(imported), broke)
    await _step(lambda: service.add_memory(app_name=APP, user_id=user, memories=[added]), broke)
    await _step(lambda: service.search_memory(app_name=APP, user_id=user, query="tea"), broke)
    faults.at = 0  # faults off: what is buffered may drain now

    held = await runner.session_service.get_session(
        app_name=APP, user_id=user, session_id=session.id
    )
    assert held is not None
    added_key = (MEMORY_SESSION, _fact_key(user, f"fact:{checksum(FACT)}"))
    said = [*_said(held), *_said(imported), added_key]
    sessions = {s for s, _ in said}
    deadline = time.monotonic() + 30  # a bound for a loaded machine, not a measurement
    while True:
        queued = await _queued(settings, user, sessions)
        missing = set(said) - set(queued)
        if len(missing) <= memory.enqueuer.dropped or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    where = f"fault {faults.kind}/{faults.when} at await {at} of {entry}"
    assert len(missing) <= memory.enqueuer.dropped, (
        f"{where}: {len(missing)} lost, dropped {memory.enqueuer.dropped}"
    )
    assert not _disorder(said, queued), f"{where}: {_disorder(said, queued)}"
    assert not broke, f"{where}: {broke}"
    await memory.aclose()
    await runner.close()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("entry", ENTRIES)
async def test_a_fault_at_any_await_never_loses_a_message(
    entry: str, local_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = local_settings.model_copy(update={"retrieval_budget": 5.0})
    faults = Faults()
    _patch(monkeypatch, faults)
    # The fast tier tries each kind of fault on one entry: every kind and every entry once.
    kinds = KINDS[ENTRIES.index(entry) :: len(ENTRIES)] if FAST else KINDS
    for kind, when in kinds:
        faults.kind, faults.when = kind, when
        n = 0
        while True:
            n += 1
            await _run(settings, faults, entry, n)
            if faults.calls < n:  # no await was left to fail: every one has been tried
                break
        assert n > 10, f"{kind}/{when}: only {n - 1} awaits seen"  # the paths were walked


async def test_a_failing_resolver_drops_each_message_once_counted(
    local_settings: Settings,
) -> None:
    """Whose memory a turn's messages go to is the resolver's to say: when it fails they
    cannot be made, and each is counted dropped once — not again at the turn's next model
    call (after a tool step), which must not queue the user's message after all."""

    async def resolver(ctx: Any) -> ZepIdentity | None:
        raise LookupError("the application's user directory is down")

    memory = TurnMemory.create(settings=local_settings, resolve_identity=resolver)

    def lookup_weather(city: str) -> str:
        """Weather for a city."""
        return f"sunny in {city}"

    model = StandInLlm(script=[{"call": "lookup_weather", "args": {"city": "Porto"}}, "Sunny."])
    pair = create_callbacks(memory)
    agent = LlmAgent(
        name="helper",
        model=model,
        instruction="Be brief.",
        tools=[lookup_weather],
        before_model_callback=pair.before_model_callback,
        after_model_callback=pair.after_model_callback,
    )
    runner = Runner(app_name=APP, agent=agent, session_service=InMemorySessionService())
    session = await runner.session_service.create_session(app_name=APP, user_id="alice")
    assert await say(runner, "alice", session.id, "Weather in Porto?") == "Sunny."  # R1
    assert memory.enqueuer.dropped == 2  # the user's message and the reply, once each
    assert await _queued(local_settings, "alice", {session.id}) == []
    await memory.aclose()
    await runner.close()


async def test_a_cancelled_add_memory_still_queues_every_entry(
    local_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``add_memory`` cancelled while its enqueue's round trip is under way (a request
    deadline, a client gone): the cancellation reaches the caller, and every entry is
    queued all the same — none waits on the round trip of another to be made."""
    sent = Enqueuer.send
    under_way, answer = asyncio.Event(), asyncio.Event()

    async def slow_send(self: Enqueuer, messages: Any) -> Any:
        under_way.set()
        await answer.wait()  # Redis answers only once the caller is cancelled
        return await sent(self, messages)

    monkeypatch.setattr(Enqueuer, "send", slow_send)
    service = ZepMemoryService(settings=local_settings)
    user = f"user-{uuid.uuid4().hex[:8]}"
    facts = ["Alice drinks tea.", "Alice lives in Lisbon.", "Alice has a cat."]
    entries = [MemoryEntry(content=types.UserContent(f)) for f in facts]
    adding = asyncio.ensure_future(service.add_memory(app_name=APP, user_id=user, memories=entries))
    await under_way.wait()
    adding.cancel()
    answer.set()
    with pytest.raises(asyncio.CancelledError):
        await adding
    expected = [(MEMORY_SESSION, _fact_key(user, f"fact:{checksum(f)}")) for f in facts]
    deadline = time.monotonic() + 30  # a bound for a loaded machine, not a measurement
    while (queued := await _queued(local_settings, user, {MEMORY_SESSION})) != expected:
        assert time.monotonic() < deadline, f"queued {queued} of {expected}"
        await asyncio.sleep(0.05)
    assert service.memory.enqueuer.dropped == 0
    await service.memory.aclose()
