"""One user's memory is theirs alone: the same session id, the same invocation id, ids full
of separators, and thread UUIDs pinned in client-writable session state never let one
user read or write another's memory. Every test runs on both backends."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
import redis.asyncio as aioredis
from hypothesis import example, given
from hypothesis import strategies as st

from afterthought.agent_hooks import create_callbacks
from afterthought.backends import open_backend
from afterthought.backends.base import BackendError
from afterthought.backends.local import LocalBackend
from afterthought.contract import QueuedMessage, thread_key
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys, digest
from afterthought.settings import Settings
from afterthought.testing.stand_in_model import memory_lines
from tests.adk_support import APP, make_runner, say
from tests.conftest import drain, enqueue

#: Every separator and control character an id might carry, plus look-alikes.
SEPARATORS = "\x00\x1f\x1e\x1d\x1c:;|/\\\n\r\t ,.\"'{}[]\u200b\u200d\u00a0\ufeff\u2028"


async def _stored(settings: Settings, redis: aioredis.Redis, user: str, session: str) -> list[str]:
    """What the user said, as the backend holds it in the thread of one of their sessions
    (oldest first)."""
    known = await IdentityRegistry(redis, settings).lookup(
        app=APP, user_id=user, session_id=session
    )
    if known.thread_uuid is None:
        return []
    backend = open_backend(settings)
    try:
        found = await backend.recent_messages(thread_uuid=known.thread_uuid, limit=100)
    finally:
        await backend.aclose()
    return [m.content for m in reversed(found) if m.role == "user"]


async def _dead_reasons(settings: Settings, redis: aioredis.Redis) -> list[str]:
    raw = await redis.lrange(Keys(settings.key_prefix).dead(), 0, -1)
    return [json.loads(r.split(b"\n", 1)[0])["reason"] for r in raw]


async def test_two_users_with_one_session_id_have_two_memories(
    any_settings: Settings, redis: aioredis.Redis
) -> None:
    """ADK's API server lets clients choose session ids: ``default`` is everyone's."""
    runner, model = make_runner(create_callbacks(settings=any_settings))
    for user, city in (("alice", "Lisbon"), ("bob", "Oslo")):
        await runner.session_service.create_session(
            app_name=APP, user_id=user, session_id="default"
        )
        await say(runner, user, "default", f"I live in {city}.")
        await drain(any_settings)

    registry = IdentityRegistry(redis, any_settings)
    alice = await registry.lookup(app=APP, user_id="alice", session_id="default")
    bob = await registry.lookup(app=APP, user_id="bob", session_id="default")
    assert alice.thread_uuid and bob.thread_uuid and alice.thread_uuid != bob.thread_uuid
    assert await _stored(any_settings, redis, "alice", "default") == ["I live in Lisbon."]
    assert await _stored(any_settings, redis, "bob", "default") == ["I live in Oslo."]

    session = await runner.session_service.create_session(app_name=APP, user_id="bob")
    await say(runner, "bob", session.id, "Where do I live?")
    block = "\n".join(memory_lines(model.requests[-1]))
    assert "Lisbon" not in block


@pytest.fixture
def fixed_invocation_id(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every run gets the same invocation id, as a client reusing one would cause."""
    import google.adk.runners

    monkeypatch.setattr(google.adk.runners, "new_invocation_context_id", lambda: "e-reused")
    yield


async def test_a_reused_invocation_id_never_serves_another_users_block(
    any_settings: Settings, redis: aioredis.Redis, fixed_invocation_id: None
) -> None:
    runner, model = make_runner(create_callbacks(settings=any_settings))
    await runner.session_service.create_session(app_name=APP, user_id="alice", session_id="a1")
    await say(runner, "alice", "a1", "I live in Lisbon.")
    await drain(any_settings)
    await runner.session_service.create_session(app_name=APP, user_id="alice", session_id="a2")
    await say(runner, "alice", "a2", "Where do I live?")
    assert any("Lisbon" in line for line in memory_lines(model.requests[-1]))

    await runner.session_service.create_session(app_name=APP, user_id="bob", session_id="a2")
    await say(runner, "bob", "a2", "Where do I live?")
    assert not any("Lisbon" in line for line in memory_lines(model.requests[-1]))
    await drain(any_settings)
    assert await _stored(any_settings, redis, "bob", "a2") == ["Where do I live?"]
    assert await _stored(any_settings, redis, "alice", "a2") == ["Where do I live?"]


@given(
    st.lists(st.text(alphabet=SEPARATORS + "ab", max_size=6), min_size=1, max_size=4),
    st.lists(st.text(alphabet=SEPARATORS + "ab", max_size=6), min_size=1, max_size=4),
)
@example(["a\x1f", "b"], ["a", "\x1fb"])
@example(["\x1f"], ["", ""])
def test_digests_of_different_id_tuples_differ(a: list[str], b: list[str]) -> None:
    if a != b:
        assert digest(*a) != digest(*b)


def test_a_separator_inside_an_id_cannot_shift_it_into_the_next() -> None:
    assert thread_key(app="m\x1fs1", user_id="x", session_id="s") != thread_key(
        app="m", user_id="s1\x1fx", session_id="s"
    )
    keys = Keys("p")
    assert keys.session("a", "u:1", "s") != keys.session("a", "u", "1:s")
    assert keys.context_thread("a", "u\x00", "s") != keys.context_thread("a", "u", "\x00s")


@pytest.mark.parametrize("sep", list(SEPARATORS))
async def test_ids_full_of_separators_keep_their_messages_apart(
    any_settings: Settings, redis: aioredis.Redis, sep: str
) -> None:
    """(user ``a<sep>b``, session ``c``) and (user ``a``, session ``b<sep>c``) are two."""
    pairs = [(f"a{sep}b", "c"), ("a", f"b{sep}c")]
    for n, (user, session) in enumerate(pairs):
        await enqueue(
            any_settings,
            QueuedMessage.build(
                app=APP,
                user_id=user,
                session_id=session,
                invocation_id="i",
                role="user",
                ordinal=0,
                content=f"message {n}",
            ),
        )
    await drain(any_settings)
    for n, (user, session) in enumerate(pairs):
        assert await _stored(any_settings, redis, user, session) == [f"message {n}"]


@pytest.mark.parametrize("pin_user", [False, True], ids=["thread", "thread+user+graph"])
async def test_a_foreign_thread_pinned_in_state_is_never_written(
    any_settings: Settings, redis: aioredis.Redis, pin_user: bool
) -> None:
    """Session state is client-writable (``state_delta``): Bob pins Alice's UUIDs there.
    His pin is ignored, not his words: they go to his own thread."""
    runner, model = make_runner(create_callbacks(settings=any_settings))
    await runner.session_service.create_session(app_name=APP, user_id="alice", session_id="s")
    await say(runner, "alice", "s", "I live in Lisbon.")
    await drain(any_settings)
    registry = IdentityRegistry(redis, any_settings)
    alice = await registry.lookup(app=APP, user_id="alice", session_id="s")
    assert alice.user is not None and alice.thread_uuid is not None

    state = {"zep_thread_uuid": alice.thread_uuid}
    if pin_user:
        state |= {"zep_user_uuid": alice.user.user_uuid, "zep_graph_uuid": alice.user.graph_uuid}
    await runner.session_service.create_session(
        app_name=APP, user_id="bob", session_id="b", state=state
    )
    await say(runner, "bob", "b", "I live in Oslo.")
    assert not any("Lisbon" in line for line in memory_lines(model.requests[-1]))
    await drain(any_settings)

    assert await _stored(any_settings, redis, "alice", "s") == ["I live in Lisbon."]
    assert await _stored(any_settings, redis, "bob", "b") == ["I live in Oslo."]
    assert await _dead_reasons(any_settings, redis) == []


async def test_the_local_store_never_hands_one_users_thread_to_another(
    local_settings: Settings,
) -> None:
    backend = LocalBackend(local_settings.local_db_path)
    alice, _ = await backend.ensure_user(zep_user_id="alice")
    bob, _ = await backend.ensure_user(zep_user_id="bob")
    thread = await backend.create_thread(user=alice, idempotency_key="thread:same")
    assert await backend.create_thread(user=alice, idempotency_key="thread:same") == thread
    with pytest.raises(BackendError) as refused:
        await backend.create_thread(user=bob, idempotency_key="thread:same")
    assert refused.value.kind == "conflict"
    assert await backend.thread_owner(thread_uuid=thread) == alice.user_uuid
    assert await backend.thread_owner(thread_uuid="no-such-thread") is None


async def test_a_context_builder_is_never_handed_a_foreign_pinned_thread(
    any_settings: Settings, redis: aioredis.Redis
) -> None:
    from afterthought.agent_hooks.turn_memory import ContextInput

    seen: list[str | None] = []

    async def builder(given: ContextInput) -> str:
        seen.append(given.thread_uuid)
        return ""

    runner, _ = make_runner(create_callbacks(settings=any_settings))
    await runner.session_service.create_session(app_name=APP, user_id="alice", session_id="s")
    await say(runner, "alice", "s", "I live in Lisbon.")
    await drain(any_settings)
    alice = await IdentityRegistry(redis, any_settings).lookup(
        app=APP, user_id="alice", session_id="s"
    )
    assert alice.thread_uuid is not None

    runner, _ = make_runner(create_callbacks(settings=any_settings, context_builder=builder))
    await runner.session_service.create_session(
        app_name=APP, user_id="bob", session_id="b", state={"zep_thread_uuid": alice.thread_uuid}
    )
    await say(runner, "bob", "b", "Hello.")
    assert seen and alice.thread_uuid not in seen


async def test_the_search_tool_never_searches_a_graph_pinned_in_foreign_state(
    any_settings: Settings, redis: aioredis.Redis
) -> None:
    from google.adk.agents import LlmAgent
    from google.adk.runners import Runner
    from google.adk.sessions import InMemorySessionService

    from afterthought.agent_hooks.graph_search_tool import ZepGraphSearchTool
    from afterthought.testing.stand_in_model import StandInLlm

    runner, _ = make_runner(create_callbacks(settings=any_settings))
    await runner.session_service.create_session(app_name=APP, user_id="alice", session_id="s")
    await say(runner, "alice", "s", "I live in Lisbon.")
    await drain(any_settings)
    alice = await IdentityRegistry(redis, any_settings).lookup_user(app=APP, user_id="alice")
    assert alice is not None

    model = StandInLlm(script=[{"call": "memory_search", "args": {"query": "Lisbon"}}, "done"])
    agent = LlmAgent(name="helper", model=model, tools=[ZepGraphSearchTool(settings=any_settings)])
    bobs = Runner(app_name=APP, agent=agent, session_service=InMemorySessionService())
    await bobs.session_service.create_session(
        app_name=APP,
        user_id="bob",
        session_id="b",
        state={"zep_user_uuid": alice.user_uuid, "zep_graph_uuid": alice.graph_uuid},
    )
    await say(bobs, "bob", "b", "Look it up.")
    answers = [
        p.function_response.response
        for c in model.requests[-1].contents
        for p in c.parts or []
        if p.function_response is not None
    ]
    assert answers and "Lisbon" not in repr(answers)


async def _app_turn(settings: Settings, app: str, user: str, text: str) -> list[str]:
    """One turn of ``user`` in another app of the deployment; the block it was shown."""
    runner, model = make_runner(create_callbacks(settings=settings), app=app)
    session = await runner.session_service.create_session(app_name=app, user_id=user)
    await say(runner, user, session.id, text)
    await drain(settings)
    return memory_lines(model.requests[-1])


async def test_with_app_in_the_user_template_two_apps_keep_two_memories(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(zep_user_id_template="{app}:{user_id}")
    await _app_turn(settings, "shop", "alice", "I live in Quuxville.")
    await _app_turn(settings, "bank", "alice", "Hello")
    block = await _app_turn(settings, "bank", "alice", "What do you know?")
    assert not any("Quuxville" in line for line in block)


async def test_forgetting_a_user_shared_by_two_apps_forgets_them_in_both(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    """With the default template one user id is one person in every app: forgetting them
    in one app forgets them in all, and what they say afterwards is stored, not lost."""
    from afterthought.worker.forget import Forgetter

    # One machine, one clock: no margin, so what is said at once after the forget is kept.
    local_settings = local_settings.model_copy(update={"forget_clock_margin_seconds": 0.0})
    await _app_turn(local_settings, "shop", "alice", "I live in Quuxville.")
    await _app_turn(local_settings, "bank", "alice", "Hello")
    done = await Forgetter(local_settings, redis, open_backend(local_settings)).forget_user(
        app="shop", user_id="alice"
    )
    assert done.users == 2 and not done.pending
    await redis.delete(
        *(Keys(local_settings.key_prefix).forgetting(a, "alice") for a in ("shop", "bank"))
    )  # the cool-down, not waited out here
    assert not any(
        "Quuxville" in line for line in await _app_turn(local_settings, "bank", "alice", "Hi")
    )
    await _app_turn(local_settings, "bank", "alice", "I live in Oslo.")
    assert await _dead_reasons(local_settings, redis) == []
    assert any("Oslo" in line for line in await _app_turn(local_settings, "bank", "alice", "So?"))
