"""Memory quality on bench/memory_quality.json, offline: the local backend, the default
(rule-based) extractor, a real ADK Runner with the stand-in model and a real worker
between sessions. For each conversation, the last session's model request is read:

    recall  = share of the user's *current* facts present in the memory block
    stale   = share of conversations whose block still shows a replaced value
    poison  = share of conversations whose block shows any poison marker

Also the extractor's speed (seconds per 1,000 messages). Prints one JSON object.

    python bench/memory_quality.py"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.runners import Runner  # noqa: E402
from google.adk.sessions import InMemorySessionService  # noqa: E402
from google.genai import types  # noqa: E402

from afterthought.backends.base import HistoryMessage  # noqa: E402
from afterthought.settings import Settings  # noqa: E402
from afterthought.testing.processes import cleanup, wait_settled  # noqa: E402
from afterthought.testing.stand_in_model import StandInLlm, memory_lines  # noqa: E402
from agent_hooks import create_callbacks  # noqa: E402
from worker.extract import RuleExtractor  # noqa: E402
from worker.settings import create_worker  # noqa: E402

APP = "quality"


async def _drain(settings: Settings) -> None:
    while True:
        worker = create_worker(settings, burst=True, handle_signals=False)
        try:
            await worker.main()
        finally:
            await worker.close()
        if await wait_settled(settings, timeout=0.01):
            return


async def _say(runner: Runner, user: str, session: str, text: str) -> None:
    async for _ in runner.run_async(
        user_id=user, session_id=session, new_message=types.UserContent(text)
    ):
        pass


async def evaluate(settings: Settings, conversations: list[dict[str, Any]]) -> dict[str, Any]:
    model = StandInLlm()
    memory = create_callbacks(settings=settings)
    agent = LlmAgent(
        name="assistant",
        model=model,
        before_model_callback=memory.before_model_callback,
        after_model_callback=memory.after_model_callback,
    )
    runner = Runner(app_name=APP, agent=agent, session_service=InMemorySessionService())
    found = expected = stale = poisoned = 0
    misses: list[str] = []
    for conv in conversations:
        user = conv["user"]
        for lines in conv["sessions"]:
            session = await runner.session_service.create_session(app_name=APP, user_id=user)
            for line in lines:
                await _say(runner, user, session.id, line)
            await _drain(settings)
        session = await runner.session_service.create_session(app_name=APP, user_id=user)
        await _say(runner, user, session.id, conv["question"])
        block = "\n".join(memory_lines(model.requests[-1]))
        for value in conv["expect"]["current"]:
            expected += 1
            if value.lower() in block.lower():
                found += 1
            else:
                misses.append(f"{conv['id']}:{value}")
        stale += any(v.lower() in block.lower() for v in conv["expect"]["stale"])
        poisoned += any(p.lower() in block.lower() for p in conv["expect"]["poison"])
    n = len(conversations)
    return {
        "conversations": n,
        "recall": round(found / expected, 3),
        "stale_rate": round(stale / n, 3),
        "poison_rate": round(poisoned / n, 3),
        "missed": misses,
    }


async def extractor_speed(conversations: list[dict[str, Any]]) -> float:
    lines = [line for c in conversations for s in c["sessions"] for line in s]
    messages = [HistoryMessage(str(i), "user", t, "2026-01-01") for i, t in enumerate(lines)] * 20
    started = time.perf_counter()
    await RuleExtractor().extract(messages)
    return round((time.perf_counter() - started) / len(messages) * 1000, 4)


def main() -> None:
    conversations = json.loads((ROOT / "bench" / "memory_quality.json").read_text())[
        "conversations"
    ]
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            key_prefix=f"quality-{uuid.uuid4().hex[:8]}",
            local_db_path=Path(tmp) / "memory.sqlite3",
            backend="local",
            synthesis_idle_seconds=0,
        )
        try:
            result = asyncio.run(evaluate(settings, conversations))
        finally:
            asyncio.run(cleanup(settings))
    result["extractor_seconds_per_1000_messages"] = asyncio.run(extractor_speed(conversations))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
