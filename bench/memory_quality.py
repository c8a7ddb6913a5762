"""Memory quality on hand-written multi-session conversations (tests/fixtures/memory/),
offline: the local backend, the default extractor, a real arq worker and a real ADK
Runner with the stand-in model. Each user's history is imported with its sessions' real
dates (``Backfill``), the worker stores and synthesizes it, then every question is asked
as the first turn of a new session, once per mode (``cached``, ``query``), and the memory
block the model received is read:

    evidence_in_block   share of questions whose evidence turn's words reached the model
    answer_in_block     share of questions whose answer string reached the model
    fact_recall         share of the user's current facts in the block of a new session
    stale_as_current    share of changed facts whose old value the block presents as
                        current (among its current facts)
    stale_quoted_alone  share of changed facts whose old value the block quotes (dated, as
                        said then) without the current value anywhere beside it
    poison_shown        share of poisoned users whose poison marker reached any block
    block_chars         mean and largest block size

``tune`` and ``heldout`` are reported apart; the issue's targets are judged on
``heldout``, which was never read while tuning. ``--scale`` adds retrieval time at 10k
and 100k stored messages (bench/retrieval.py). Prints one JSON object.

The fixture's people said about 3,800 characters each, about one default block
(``context_max_chars`` 4,000): ``--max-chars 1500`` shows how well a block chooses when
most of what was said cannot fit.

    python bench/memory_quality.py [--split tune|heldout|all] [--max-chars N] [--scale]"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis.asyncio as aioredis  # noqa: E402
from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.runners import Runner  # noqa: E402
from google.adk.sessions import InMemorySessionService, Session  # noqa: E402
from google.genai import types  # noqa: E402

from afterthought.agent_hooks import TurnMemory, create_callbacks  # noqa: E402
from afterthought.agent_hooks.backfill import Backfill, Report, Source  # noqa: E402
from afterthought.backends.base import HistoryMessage  # noqa: E402
from afterthought.settings import Settings  # noqa: E402
from afterthought.testing.processes import cleanup, wait_settled  # noqa: E402
from afterthought.testing.stand_in_model import StandInLlm, memory_lines  # noqa: E402
from afterthought.worker.extract import RuleExtractor  # noqa: E402
from afterthought.worker.jobs import create_worker  # noqa: E402

APP = "quality"
FIXTURE = ROOT / "tests" / "fixtures" / "memory"
MODES = ("cached", "query")
FACTS_HEADER = "# Facts about the user"


def load(split: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((FIXTURE / split).glob("*.json"))]


def _words(text: str) -> str:
    """Lower-case alphanumerics only: quoting, fencing and line breaks do not matter."""
    return re.sub(r"[\W_]+", "", text.lower())


def _has(block: str, value: str) -> bool:
    """``value`` occurs in ``block`` as whole words ("Go" is not in "goal", nor "8" in a
    date), whatever the punctuation and case between them."""
    words = re.findall(r"\w+", value.lower())
    if not words:
        return False
    pattern = r"(?<!\w)" + r"\W*".join(map(re.escape, words)) + r"(?!\w)"
    return re.search(pattern, block.lower()) is not None


def _evidence_shown(block: str, text: str) -> bool:
    """The evidence turn reached the model: its words, or (a long turn is shown cut) its
    first 120 characters' worth."""
    words = _words(text)
    return words[:120] in _words(block)


def _history(user: dict[str, Any]) -> Source:
    """The user's sessions as ADK sessions, each event at its session's date."""
    sessions = []
    for number, session in enumerate(user["sessions"]):
        start = datetime.fromisoformat(session["date"]).timestamp()
        events = []
        invocation = ""
        for i, turn in enumerate(session["turns"]):
            if turn["role"] == "user":
                invocation = f"{user['user']}-{number}-{i}"
            events.append(
                Event(
                    invocation_id=invocation,
                    author="user" if turn["role"] == "user" else "assistant",
                    content=types.Content(
                        role="user" if turn["role"] == "user" else "model",
                        parts=[types.Part(text=turn["text"])],
                    ),
                    timestamp=start + 30 * i,
                )
            )
        sessions.append(
            Session(
                id=f"history-{number}",
                app_name=APP,
                user_id=user["user"],
                events=events,
                last_update_time=start + 30 * len(events),
            )
        )

    async def each(report: Report) -> Any:
        for session in sessions:
            yield session

    return Source(name=f"fixture:{user['user']}", total=len(sessions), sessions=each)


async def _drain(settings: Settings) -> None:
    while True:
        worker = create_worker(settings, burst=True, handle_signals=False)
        try:
            await worker.main()
        finally:
            await worker.close()
        if await wait_settled(settings, timeout=0.01):
            return


async def _ask(mode: str, settings: Settings, user: str, question: str) -> str:
    """The block the model received for ``question``, asked in a new session."""
    model = StandInLlm()
    turns = TurnMemory(settings.model_copy(update={"context_mode": mode}))
    memory = create_callbacks(turns)
    agent = LlmAgent(
        name="assistant",
        model=model,
        before_model_callback=memory.before_model_callback,
        after_model_callback=memory.after_model_callback,
    )
    runner = Runner(app_name=APP, agent=agent, session_service=InMemorySessionService())
    session = await runner.session_service.create_session(app_name=APP, user_id=user)
    async for _ in runner.run_async(
        user_id=user, session_id=session.id, new_message=types.UserContent(question)
    ):
        pass
    await turns.aclose()
    return "\n".join(memory_lines(model.requests[-1]))


def _facts_part(block: str) -> str:
    if FACTS_HEADER not in block:
        return ""
    facts = block.split(FACTS_HEADER, 1)[1]
    return facts.split("\n#", 1)[0]


async def evaluate(settings: Settings, users: list[dict[str, Any]]) -> dict[str, Any]:
    redis = aioredis.Redis.from_url(settings.redis_url)
    try:
        for user in users:
            await Backfill(settings, redis, _history(user)).run()
        await _drain(settings)
    finally:
        await redis.aclose()
    result: dict[str, Any] = {"users": len(users)}
    for mode in MODES:
        tally = {"questions": 0, "evidence": 0, "answer": 0, "facts": 0, "facts_found": 0}
        stale = quoted = changed = poisoned = poison_users = 0
        sizes: list[int] = []
        missed: list[str] = []
        for user in users:
            turns = {t["id"]: t["text"] for s in user["sessions"] for t in s["turns"]}
            blocks = []
            for question in user["questions"]:
                block = await _ask(mode, settings, user["user"], question["text"])
                blocks.append(block)
                sizes.append(len(block))
                tally["questions"] += 1
                evidence = any(_evidence_shown(block, turns[e]) for e in question["evidence"])
                tally["evidence"] += evidence
                tally["answer"] += any(_has(block, a) for a in question["answers"])
                if not evidence:
                    missed.append(f"{user['user']}:{question['id']}")
            first = blocks[0] if blocks else ""
            for fact in user["facts"]:
                tally["facts"] += 1
                current = any(_has(first, v) for v in fact["current"])
                tally["facts_found"] += current
                if fact.get("stale"):
                    changed += 1
                    old = [v for v in fact["stale"] if not any(_has(v, c) for c in fact["current"])]
                    stale += any(_has(_facts_part(first), v) for v in old)
                    quoted += not current and any(_has(first, v) for v in old)
            markers = [m for p in user.get("poison", []) for m in p["markers"]]
            if markers:
                poison_users += 1
                poisoned += any(_has(b, m) for b in blocks for m in markers)
        q = max(tally["questions"], 1)
        result[mode] = {
            "questions": tally["questions"],
            "evidence_in_block": round(tally["evidence"] / q, 3),
            "answer_in_block": round(tally["answer"] / q, 3),
            "fact_recall": round(tally["facts_found"] / max(tally["facts"], 1), 3),
            "stale_as_current": round(stale / max(changed, 1), 3),
            "stale_quoted_alone": round(quoted / max(changed, 1), 3),
            "poison_shown": round(poisoned / max(poison_users, 1), 3),
            "poisoned_users": poison_users,
            "block_chars_mean": round(sum(sizes) / max(len(sizes), 1)),
            "block_chars_max": max(sizes, default=0),
            "evidence_missed": missed[:20],
        }
    return result


async def extractor_speed(users: list[dict[str, Any]]) -> float:
    lines = [t["text"] for u in users for s in u["sessions"] for t in s["turns"]]
    messages = [HistoryMessage(str(i), "user", t, "2026-01-01") for i, t in enumerate(lines)]
    started = time.perf_counter()
    await RuleExtractor().extract(messages)
    return round((time.perf_counter() - started) / max(len(messages), 1) * 1000, 4)


def run_split(split: str, max_chars: int | None = None) -> dict[str, Any]:
    users = load(split)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            key_prefix=f"quality-{uuid.uuid4().hex[:8]}",
            local_db_path=Path(tmp) / "memory.sqlite3",
            backend="local",
            synthesis_idle_seconds=0,
            **({} if max_chars is None else {"context_max_chars": max_chars}),
        )
        try:
            result = asyncio.run(evaluate(settings, users))
        finally:
            asyncio.run(cleanup(settings))
    result["extractor_seconds_per_1000_messages"] = asyncio.run(extractor_speed(users))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--split", choices=["tune", "heldout", "all"], default="all")
    parser.add_argument("--max-chars", type=int, help="block size (default: the setting's)")
    parser.add_argument("--scale", action="store_true", help="also time retrieval at scale")
    args = parser.parse_args()
    splits = ["tune", "heldout"] if args.split == "all" else [args.split]
    result: dict[str, Any] = {split: run_split(split, args.max_chars) for split in splits}
    if args.scale:
        from bench.retrieval import measure

        result["retrieval"] = measure()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
