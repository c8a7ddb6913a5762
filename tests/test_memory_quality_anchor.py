"""The anchor in ``bench/memory_quality.py`` is ADK's own memory as an ADK user gets it:
``SqliteMemoryService`` holding the fixture's sessions, rendered exactly as the installed
``PreloadMemoryTool`` inserts it into a real Runner's request, cut to the block size by
whole memories; and ``score`` credits multi-hop evidence only when all of it is shown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.memory._sqlite_memory_service import SqliteMemoryService
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.tools.preload_memory_tool import PreloadMemoryTool
from google.genai import types

from afterthought.testing.stand_in_model import StandInLlm
from bench.memory_quality import APP, _sessions, adk_anchor, preload_block, run_split, score

USER: dict[str, Any] = {
    "user": "ana-p",
    "sessions": [
        {
            "date": "2026-01-05T10:00:00+00:00",
            "turns": [
                {"id": "s1.1", "role": "user", "text": "my sister Lucía is a glassblower in Porto"},
                {"id": "s1.2", "role": "assistant", "text": "What a craft, Porto suits it."},
            ],
        },
        {
            "date": "2026-02-07T10:00:00+00:00",
            "turns": [
                {"id": "s2.1", "role": "user", "text": "booked a trip to see my sister in May"},
                {"id": "s2.2", "role": "assistant", "text": "Lovely, May is a good month."},
            ],
        },
    ],
    "facts": [],
    "questions": [
        {
            "id": "q1",
            "asked": "2026-03-01T10:00:00+00:00",
            "text": "which city is my sister in, for the May trip?",
            "answers": ["Porto"],
            "evidence": ["s1.1", "s2.1"],
            "fact": None,
            "kind": "multi-hop",
        }
    ],
    "poison": [],
}


async def _what_preload_inserts(service: SqliteMemoryService, question: str) -> str:
    model = StandInLlm()
    agent = LlmAgent(name="assistant", model=model, tools=[PreloadMemoryTool()])
    runner = Runner(
        app_name=APP,
        agent=agent,
        session_service=InMemorySessionService(),
        memory_service=service,
    )
    session = await runner.session_service.create_session(app_name=APP, user_id=USER["user"])
    async for _ in runner.run_async(
        user_id=USER["user"], session_id=session.id, new_message=types.UserContent(question)
    ):
        pass
    texts = [p.text or "" for c in model.requests[-1].contents for p in c.parts or []]
    return next(t for t in texts if "<PAST_CONVERSATIONS>" in t)


async def test_the_block_is_what_preload_memory_tool_inserts(tmp_path: Path) -> None:
    service = SqliteMemoryService(tmp_path / "adk.sqlite3")
    try:
        for session in _sessions(USER):
            await service.add_session_to_memory(session)
        question = USER["questions"][0]["text"]
        found = await service.search_memory(app_name=APP, user_id=USER["user"], query=question)
        inserted = await _what_preload_inserts(service, question)
    finally:
        await service.close()
    assert len(found.memories) >= 2
    assert preload_block(found.memories) == inserted
    cut = preload_block(found.memories, len(inserted) - 1)
    assert 0 < len(cut) < len(inserted)
    assert cut.endswith("</PAST_CONVERSATIONS>\n")
    assert preload_block(found.memories, 10) == ""


async def test_anchor_scores_all_evidence_for_multi_hop(tmp_path: Path) -> None:
    anchor = await adk_anchor([USER], [4000, 150], tmp_path / "adk.sqlite3")
    kind = anchor[4000]["by_kind"]["multi-hop"]
    assert kind == {
        "questions": 1,
        "evidence_in_block": 1.0,
        "evidence_all_in_block": 1.0,
        "answer_in_block": 1.0,
    }
    assert anchor[150]["block_chars_max"] == 0
    assert anchor[150]["evidence_in_block"] == 0.0


def test_one_statement_of_two_is_evidence_but_not_all_of_it() -> None:
    block = "my sister Lucía is a glassblower in Porto"
    kind = score([USER], {USER["user"]: [block]})["by_kind"]["multi-hop"]
    assert kind["evidence_in_block"] == 1.0
    assert kind["evidence_all_in_block"] == 0.0
    assert kind["answer_in_block"] == 1.0


def test_a_date_answer_is_found_in_a_timestamp() -> None:
    asked = {**USER["questions"][0], "kind": "temporal", "answers": ["2026-01-05"]}
    user = {**USER, "questions": [asked]}
    block = "Time: 2026-01-05T10:00:00\nuser: my sister Lucía is a glassblower in Porto"
    assert score([user], {USER["user"]: [block]})["answer_in_block"] == 1.0


def test_the_anchor_alone_measures_only_the_anchor() -> None:
    """``--modes adk``: no store, no worker, no Redis; only the anchor's figures."""
    result = run_split([USER], [4000], ("adk",))

    assert set(result["4000"]) == {"users", "adk"}
    assert result["4000"]["adk"]["questions"] == len(USER["questions"])
