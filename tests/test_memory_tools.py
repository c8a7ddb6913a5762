"""Graph search, model-called memory tools, the memory service's fact paths, context
templates and roles — through a real Runner where a model is involved."""

from __future__ import annotations

from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.events.event import Event
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.models.llm_request import LlmRequest
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types

from afterthought.agent_hooks import TurnMemory, ZepMemoryService, create_callbacks
from afterthought.agent_hooks.graph_search_tool import NO_RESULTS, UNAVAILABLE, ZepGraphSearchTool
from afterthought.agent_hooks.memory_tools import create_memory_tools
from afterthought.agent_hooks.messages import messages_from_events
from afterthought.backends import open_backend
from afterthought.contract import MEMORY_SESSION, QueuedMessage, checksum, to_role
from afterthought.settings import Settings
from afterthought.templates import TemplateError, create_template, get_template, problems
from afterthought.testing import Fault, ZepFake
from afterthought.testing.stand_in_model import StandInLlm, memory_lines
from tests.adk_support import APP, make_runner, new_session, say
from tests.conftest import drain


async def _remembered(settings: Settings, text: str = "I live in Lisbon.") -> None:
    runner, _ = make_runner(create_callbacks(settings=settings))
    await say(runner, "alice", await new_session(runner, "alice"), text)
    await drain(settings)


def _tool_output(request: LlmRequest) -> Any:
    for content in reversed(request.contents):
        for part in content.parts or []:
            if part.function_response is not None:
                return (part.function_response.response or {}).get("result")
    raise AssertionError("no tool result in the request")


async def _call_tool(tool: Any, args: dict[str, Any], user: str = "alice") -> Any:
    model = StandInLlm(script=[{"call": tool.name, "args": args}, "done"])
    agent = LlmAgent(name="helper", model=model, tools=[tool])
    runner = Runner(app_name=APP, agent=agent, session_service=InMemorySessionService())
    await say(runner, user, await new_session(runner, user), "Look it up.")
    return _tool_output(model.requests[-1])


@pytest.mark.parametrize(
    "options",
    [
        {"scope": "context", "reranker": "mmr"},
        {"reranker": "mmr", "mmr_lambda": None},
        {"scope": "episodes", "reranker": "node_distance"},
        {"scope": "edges", "limit": 0},
        {"scope": "observations", "reranker": "rrf"},  # observations take no filters:
        {"scope": None},
    ],
)
def test_invalid_pinned_search_fails_at_construction(
    options: dict[str, Any], local_settings: Settings
) -> None:
    filters = {"edge_types": ["LIVES_IN"]} if options.get("scope") == "observations" else None
    with pytest.raises(ValueError):
        ZepGraphSearchTool(settings=local_settings, filters=filters, **options)


def test_declaration_exposes_only_what_is_not_pinned(local_settings: Settings) -> None:
    tool = ZepGraphSearchTool(settings=local_settings, scope="edges", limit=5, mmr_lambda=None)
    schema = tool._get_declaration().parameters
    assert schema is not None and schema.properties is not None
    assert set(schema.properties) == {"query", "reranker", "center_node_uuid"}
    ZepGraphSearchTool(settings=local_settings, reranker="mmr")  # the model can give lambda


async def test_search_tool_finds_facts_and_ignores_identity_arguments(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    await _remembered(zep_settings)
    tool = ZepGraphSearchTool(settings=zep_settings)
    found = await _call_tool(tool, {"query": "Lisbon", "graph_uuid": "someone-else"})
    assert "Lisbon" in found
    searches = [r for r in zep_fake.requests if "/search/" in r.path]
    (graph,) = {r.path.split("/")[2] for r in searches}
    assert graph == zep_fake.users()[0]["graph_uuid"]  # the turn's user, not the model's pick


async def test_invalid_model_choice_costs_no_call_and_names_the_choices(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    await _remembered(zep_settings)
    tool = ZepGraphSearchTool(settings=zep_settings)
    before = len(zep_fake.requests)
    answer = await _call_tool(
        tool, {"query": "Lisbon", "scope": "episodes", "reranker": "node_distance"}
    )
    assert "rrf, cross_encoder" in answer and answer.startswith("Not searched")
    assert not [r for r in zep_fake.requests[before:] if "/search/" in r.path]


async def test_backend_errors_never_reach_the_model(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    await _remembered(zep_settings)
    zep_fake.inject(Fault(match="/search/", status=500, times=10))
    answer = await _call_tool(ZepGraphSearchTool(settings=zep_settings), {"query": "Lisbon"})
    assert answer == UNAVAILABLE


async def test_search_on_the_local_backend(local_settings: Settings) -> None:
    await _remembered(local_settings)
    tool = ZepGraphSearchTool(settings=local_settings, scope="episodes")
    assert "Lisbon" in await _call_tool(tool, {"query": "Lisbon"})
    assert await _call_tool(tool, {"query": "x"}, user="nobody") == NO_RESULTS


async def test_remember_tool_stores_a_model_fact_that_later_turns_see(
    any_settings: Settings,
) -> None:
    await _remembered(any_settings)
    memory = TurnMemory.create(settings=any_settings)
    remember, _, recall = create_memory_tools(memory)
    assert await _call_tool(remember, {"fact": "Alice is allergic to peanuts."}) == "Saved."
    await drain(any_settings)

    runner, model = make_runner(create_callbacks(settings=any_settings))
    await say(runner, "alice", await new_session(runner, "alice"), "Any allergies?")
    assert any("peanuts" in line for line in memory_lines(model.requests[-1]))
    assert "peanuts" in await _call_tool(recall, {})
    assert (await _call_tool(remember, {"fact": "  "})).startswith("Nothing saved")


async def test_remembered_facts_carry_model_trust_on_zep(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    await _remembered(zep_settings)
    remember = create_memory_tools(settings=zep_settings)[0]
    await _call_tool(remember, {"fact": "Prefers mornings."})
    await drain(zep_settings)
    (episode,) = zep_fake.episodes()
    assert episode["metadata"]["trust"] == "model" and episode["content"] == "Prefers mornings."


async def test_memory_service_adds_searches_and_deletes(any_settings: Settings) -> None:
    await _remembered(any_settings)
    service = ZepMemoryService(settings=any_settings)
    entry = MemoryEntry(content=types.Content(role="user", parts=[types.Part(text="Owns a cat.")]))
    for _ in range(2):  # the same memory twice is stored once
        await service.add_memory(app_name=APP, user_id="alice", memories=[entry])
    await drain(any_settings)

    found = await service.search_memory(app_name=APP, user_id="alice", query="cat")
    scores = [m.custom_metadata["score"] for m in found.memories]
    assert scores == sorted(scores, reverse=True)  # facts and statements, by relevance
    cats = [
        m
        for m in found.memories
        if m.custom_metadata["kind"] == "fact" and "cat" in (m.content.parts or [])[0].text  # type: ignore[operator]
    ]
    assert len(cats) == 1 and cats[0].id and cats[0].timestamp
    assert cats[0].custom_metadata["predicate"]
    scores = [
        m.custom_metadata["score"] for m in found.memories if m.custom_metadata["kind"] == "fact"
    ]
    if None not in scores:
        assert scores == sorted(scores, reverse=True) and 0 not in scores  # relevant first

    await service.delete_memory(app_name=APP, user_id="alice", memory_id=cats[0].id)
    await drain(any_settings)
    again = await service.search_memory(app_name=APP, user_id="alice", query="cat")
    assert not [m for m in again.memories if m.id == cats[0].id]
    with pytest.raises(ValueError):
        await service.delete_memory(app_name=APP, user_id="alice")


async def test_add_memory_queues_the_valid_entries_and_names_the_empty_one(
    local_settings: Settings,
) -> None:
    """An entry without text among others: the others are queued, it is counted dropped,
    and the caller's error names it (ADK's services raise ValueError for such an entry)."""
    service = ZepMemoryService(settings=local_settings)
    said = ["Alice drinks tea.", "  ", "Alice has a cat."]
    entries = [MemoryEntry(content=types.UserContent(f)) for f in said]
    with pytest.raises(ValueError, match=r"memories\[1\]"):
        await service.add_memory(app_name=APP, user_id="alice", memories=entries)
    dropped = service.memory.enqueuer.dropped
    await service.memory.aclose()
    await drain(local_settings)
    found = await service.search_memory(app_name=APP, user_id="alice", query="tea cat")
    texts = {(m.content.parts or [])[0].text for m in found.memories}
    assert {"Alice drinks tea.", "Alice has a cat."} <= texts, texts
    assert dropped == 1


async def test_add_memory_for_an_invalid_id_counts_every_entry(local_settings: Settings) -> None:
    """An id that cannot name anything (a lone surrogate, from a JavaScript client) makes
    every entry of the call count dropped, and the caller gets the error."""
    service = ZepMemoryService(settings=local_settings)
    facts = ["Alice drinks tea.", "Alice lives in Lisbon.", "Alice has a cat."]
    entries = [MemoryEntry(content=types.UserContent(f)) for f in facts]
    with pytest.raises(ValueError):
        await service.add_memory(app_name=APP, user_id="alice\ud800", memories=entries)
    dropped = service.memory.enqueuer.dropped
    await service.memory.aclose()
    assert dropped == len(facts), f"{len(facts)} entries, none queued, {dropped} counted dropped"


async def test_a_fact_deleted_and_added_again_is_stored_again_and_a_late_retry_is_not(
    any_settings: Settings,
) -> None:
    """The fact's key comes from its text, so the same text added twice is stored once:
    ``seen``, the local store's unique index and Zep's idempotency key all hold it out.
    Deleted and then added again it is a new add and is stored; a re-push of the add made
    before the delete (a buffer or spool draining late) is a replay and stays out."""
    service = ZepMemoryService(settings=any_settings)
    user = "user-readd"
    fact = "Alice is vegetarian."
    entry = [MemoryEntry(content=types.UserContent(fact))]

    async def found() -> list[str]:
        got = await service.search_memory(app_name=APP, user_id=user, query="vegetarian")
        return [
            m.id or ""
            for m in got.memories
            if m.custom_metadata["kind"] == "fact"
            and fact in "".join(p.text or "" for p in (m.content.parts or []))
        ]

    first = QueuedMessage.build(  # what add_memory queues for the fact
        app=APP,
        user_id=user,
        session_id=MEMORY_SESSION,
        invocation_id=f"fact:{checksum(fact)}",
        role="user",
        ordinal=0,
        content=fact,
        kind="fact",
        trust="app",
    )
    assert await service.memory.enqueuer.enqueue([first])
    await service.add_memory(app_name=APP, user_id=user, memories=entry)  # the same again
    await drain(any_settings)
    (stored,) = await found()
    await service.delete_memory(app_name=APP, user_id=user, memory_id=stored)
    await drain(any_settings)
    assert await service.memory.enqueuer.enqueue([first])  # a late re-push of the first add
    await drain(any_settings)
    assert await found() == []

    await service.add_memory(app_name=APP, user_id=user, memories=entry)  # added again
    await service.add_memory(app_name=APP, user_id=user, memories=entry)  # and once more
    await drain(any_settings)
    again = await found()
    dropped = service.memory.enqueuer.dropped
    await service.memory.aclose()
    assert (len(again), dropped) == (1, 0)


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        ("%{edges limit=10}", None),
        ("# FACTS\n%{edges limit=5 types=[lives_in,likes]}\n%{user_summary}", None),
        ("%{observations limit=20}%{thread_summaries limit=3}", None),
        ("", "empty"),
        ("%{edges limit=0}", "limit must be 1..1000"),
        ("%{edges limit=1001}", "limit must be 1..1000"),
        ("%{facts}", "unknown variable"),
        ("%{edges limit=3", "unbalanced"),
        ("%{user_summary limit=3}", "takes no parameters"),
        ("%{observations types=[a]}", "takes limit"),
        ("%{edges include_attributes=maybe}", "true or false"),
        ("%{entities types=a,b}", "types must look like"),
    ],
)
def test_template_validator(template: str, fragment: str | None) -> None:
    found = problems(template)
    if fragment is None:
        assert found == []
    else:
        assert any(fragment in p for p in found), found


async def test_templates_render_every_read(make_settings: Any, any_settings: Settings) -> None:
    backend = open_backend(any_settings)
    with pytest.raises(TemplateError):
        await create_template(backend, name="bad", template="%{nope}")
    uuid = await create_template(backend, name="facts", template="KNOWN:\n%{edges limit=5}")
    assert await get_template(backend, uuid) == ("facts", "KNOWN:\n%{edges limit=5}")
    await backend.aclose()
    settings = Settings.model_validate({**any_settings.model_dump(), "context_template_uuid": uuid})

    memory = TurnMemory.create(settings=settings)
    remember = create_memory_tools(memory)[0]
    await _remembered(settings)
    await _call_tool(remember, {"fact": "Alice rides a bike."})
    await drain(settings)
    runner, model = make_runner(create_callbacks(settings=settings))
    await say(runner, "alice", await new_session(runner, "alice"), "Hi")
    lines = memory_lines(model.requests[-1])
    assert lines[0] == "KNOWN:" and any("bike" in line for line in lines)


def test_roles_are_coerced_or_omitted() -> None:
    assert [to_role(r) for r in ("human", "AI", "model", "user", "tool", "narrator", None)] == [
        "user",
        "assistant",
        "assistant",
        "user",
        "tool",
        None,
        None,
    ]


async def test_an_unknown_role_is_sent_without_one(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    events = [
        Event(author="user", invocation_id="i1", content=types.UserContent("Hello")),
        Event(
            author="narrator",
            invocation_id="i1",
            content=types.Content(role="narrator", parts=[types.Part(text="Meanwhile...")]),
        ),
    ]
    messages = messages_from_events(
        events, app=APP, user_id="alice", session_id="s1", assistant_name=None
    )
    assert [m.role for m in messages] == ["user", None]
    memory = TurnMemory.create(settings=zep_settings)
    assert await memory.enqueuer.enqueue(messages)
    await drain(zep_settings)
    posts = [r for r in zep_fake.requests if r.method == "POST" and r.path.endswith("/messages")]
    sent = [m for r in posts for m in r.body["messages"]]
    assert "role" not in sent[1] and sent[0]["role"] == "user"


# --- search_memory: relevance (issue 13, deliverable 4) ------------------------------------
_DOG_REPLY = "Max, he was a beagle"
_DOGS = "Our two Dogs love running on the beach at Cascais"
_UNRELATED = (
    "big news, we finally moved to Lisbon last week, so I'm drowning in boxes",
    "My sister Ana lives in Oslo and she visits every summer",
    "I work night shifts at the hospital, it's exhausting",
)


async def _talked(settings: Settings) -> ZepMemoryService:
    """Alice said several unrelated things (one answering "What was your dog called?"),
    and was told to remember her seats; Bob has a dog of his own."""
    model = StandInLlm(script=["What was your dog called?", "Cute!", "Ok.", "Ok.", "Ok.", "Ok."])
    runner, _ = make_runner(create_callbacks(settings=settings), model)
    session = await new_session(runner, "alice")
    for text in (_UNRELATED[0], _DOG_REPLY, _UNRELATED[1], _DOGS, _UNRELATED[2]):
        await say(runner, "alice", session, text)
    bob, _ = make_runner(create_callbacks(settings=settings))
    await say(bob, "bob", await new_session(bob, "bob"), "I walk my dog Rex every morning")
    service = ZepMemoryService(settings=settings)
    seats = types.Content(role="user", parts=[types.Part(text="Prefers window seats.")])
    await service.add_memory(app_name=APP, user_id="alice", memories=[MemoryEntry(content=seats)])
    await drain(settings)
    return service


def _entries(found: Any) -> list[tuple[str, str, float]]:
    """(kind, text, score) of each entry, checking what every entry must carry."""
    out = []
    for m in found.memories:
        meta = m.custom_metadata
        assert meta["kind"] in ("fact", "statement") and m.id and m.timestamp
        assert isinstance(meta["score"], float) and 0 < meta["score"] <= 1, meta
        if meta["kind"] == "fact":
            assert meta["predicate"]
        out.append((meta["kind"], (m.content.parts or [])[0].text or "", meta["score"]))
    return out


def _in_order(entries: list[tuple[str, str, float]]) -> None:
    scores = [score for _, _, score in entries]
    assert scores == sorted(scores, reverse=True)  # most relevant first, of either kind


async def test_search_memory_finds_only_what_the_query_is_about(
    any_settings: Settings, request: pytest.FixtureRequest
) -> None:
    if any_settings.backend == "zep":  # as Zep may answer: only what matches the query
        request.getfixturevalue("zep_fake").configure({"search_unmatched": "exclude"})
    service = await _talked(any_settings)

    def search(query: str) -> Any:
        return service.search_memory(app_name=APP, user_id="alice", query=query)

    dog = _entries(await search("dog"))
    _in_order(dog)
    # The fake's Zep extracts a sentence as said: then one text, shown once, as the fact.
    zep = any_settings.backend == "zep"
    said = [text for kind, text, _ in dog if kind == "statement" or zep]
    assert said[:2] == [_DOGS, _DOG_REPLY] or said[:1] == [_DOGS], dog  # "Dogs" beats a reply
    assert _DOG_REPLY in said or any_settings.backend == "zep"  # Zep saw no question
    assert not [t for _, t, _ in dog if any(w in t for w in ("Lisbon", "Oslo", "hospital", "Rex"))]

    for query in ("seat", "Seat", "SEATS", "window seat"):
        facts = [t for kind, t, _ in _entries(await search(query)) if kind == "fact"]
        assert facts and "window seats" in facts[0].lower(), (query, facts)
    for query in ("北京", "", "   ", "the"):
        assert _entries(await search(query)) == [], query


async def test_zep_search_ranks_by_relevance_and_scores_every_result(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    """As Zep may: what shares no word with the query still comes back, ranked last."""
    service = await _talked(zep_settings)
    found = _entries(await service.search_memory(app_name=APP, user_id="alice", query="dog"))
    _in_order(found)
    texts = [t for _, t, _ in found]
    # Said, and extracted as said (the fake's Zep): one text, shown once, where it ranks.
    assert texts[0] == _DOGS and texts.count(_DOGS) == 1, found
    lisbon = _entries(await service.search_memory(app_name=APP, user_id="alice", query="Lisbon"))
    assert [t for _, t, _ in lisbon] != [t for _, t, _ in found]
    assert "Lisbon" in lisbon[0][1]
    (edges,) = [r for r in zep_fake.requests if r.path.endswith("/search/edges")][-1:]
    assert edges.body["query"] == "Lisbon"


async def test_zep_search_without_scores_keeps_zeps_order(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    zep_fake.configure({"search_score": "omit"})
    service = await _talked(zep_settings)
    found = await service.search_memory(app_name=APP, user_id="alice", query="dogs")
    texts = [(m.custom_metadata["kind"], (m.content.parts or [])[0].text) for m in found.memories]
    assert "Dogs" in next(t for k, t in texts if k == "fact")  # type: ignore[operator]
    assert [t for _, t in texts].count(_DOGS) == 1, texts  # said and extracted: shown once
