"""Memory quality on multi-session conversations (``--fixture memory``: hand-written,
tests/fixtures/memory/; ``--fixture memory2``: 112 people generated from hand-written
phrase banks by a writer who did not see the retrieval code, tests/fixtures/memory2/;
``--fixture memory3``: the same people with histories as long as real ones, 20 to 35
sessions and about 27,000 characters said each, generated into a temporary directory by
tests/fixtures/memory3/generate.py),
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
    by_kind             evidence, answer and (every evidence turn shown) evidence_all per
                        question kind: multi-hop needs all of its statements

The anchor, ``adk``: ADK's own ``SqliteMemoryService`` (FTS5, 50 results) holds the same
sessions with their real timestamps; each question is its ``search_memory`` query, and the
block is what ``PreloadMemoryTool`` would insert, keeping as many of its memories, in its
order, as fit the same block size. Scored by the same code.

``tune`` and ``heldout`` are reported apart; the issue's targets are judged on
``heldout``, which was never read while tuning. ``--scale`` adds retrieval time at 10k
and 100k stored messages (bench/retrieval.py). Prints one JSON object.

The fixture's people said about 3,800 characters each, about one default block
(``context_max_chars`` 4,000): ``--max-chars 1500`` shows how well a block chooses when
most of what was said cannot fit. memory3's people say about seven blocks each, so there
the default block must choose (held-out, first 10 people, 4,000 chars: evidence_in_block
0.236 for ``cached``, 0.40 for ``adk``).

    python bench/memory_quality.py [--fixture memory|memory2|memory3]
        [--split tune|heldout|all] [--max-chars N [N ...]] [--modes cached,query,adk]
        [--limit N] [--scale] [--backend local|postgres]

``--modes`` picks the systems measured (all three by default); ``--limit N`` keeps the
first N people of each split (by file name), for a run that must end sooner.
``--backend postgres`` stores on the PostgreSQL store instead of the local one, in a
PostgreSQL server the bench starts for itself (a schema per split and size).

With several ``--max-chars`` each split is stored and asked once per size; the JSON holds
``{split: {size: {"cached": …, "query": …, "adk": …}}}``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis.asyncio as aioredis  # noqa: E402
from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.memory._sqlite_memory_service import SqliteMemoryService  # noqa: E402
from google.adk.memory.memory_entry import MemoryEntry  # noqa: E402
from google.adk.runners import Runner  # noqa: E402
from google.adk.sessions import InMemorySessionService, Session  # noqa: E402
from google.adk.tools import _memory_entry_utils  # noqa: E402
from google.genai import types  # noqa: E402

from afterthought.agent_hooks import TurnMemory, create_callbacks  # noqa: E402
from afterthought.agent_hooks.backfill import Backfill, Report, Source  # noqa: E402
from afterthought.backends.base import HistoryMessage  # noqa: E402
from afterthought.settings import Settings  # noqa: E402
from afterthought.testing.postgres_server import PostgresServer  # noqa: E402
from afterthought.testing.processes import cleanup, wait_settled  # noqa: E402
from afterthought.testing.stand_in_model import StandInLlm, memory_lines  # noqa: E402
from afterthought.worker.extract import RuleExtractor  # noqa: E402
from afterthought.worker.jobs import create_worker  # noqa: E402

APP = "quality"
FIXTURES = ROOT / "tests" / "fixtures"
MODES = ("cached", "query")
ANCHOR = "adk"
FACTS_HEADER = "# Facts about the user"
#: ``PreloadMemoryTool.process_llm_request`` (google-adk 2.13) wraps the memories in this.
PRELOAD_HEAD = """The following content is from your previous conversations with the user.
They may be useful for answering the user's current query.
<PAST_CONVERSATIONS>
"""
PRELOAD_TAIL = """
</PAST_CONVERSATIONS>
"""


def load(split: str, fixture: str = "memory", root: Path = FIXTURES) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((root / fixture / split).glob("*.json"))]


def generated(fixture: str, out: Path) -> Path:
    """The root ``load`` reads ``fixture`` from: memory3 is written under ``out`` by its
    generator (too large to commit), the others are read where they are committed."""
    if fixture != "memory3":
        return FIXTURES
    subprocess.run(
        [sys.executable, str(FIXTURES / fixture / "generate.py"), str(out / fixture)], check=True
    )
    return out


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


#: A timestamp's date followed by its time ("2025-06-08T17:00:00", as ADK shows a memory's
#: time): split apart so that a date answer is found in it as whole words.
_ISO_TIME = re.compile(r"(\d{4}-\d{2}-\d{2})T(?=\d)")


def _evidence_shown(block: str, text: str) -> bool:
    """The evidence turn reached the model: its words, or (a long turn is shown cut) its
    first 120 characters' worth."""
    words = _words(text)
    return words[:120] in _words(block)


def _sessions(user: dict[str, Any]) -> list[Session]:
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
    return sessions


def _history(user: dict[str, Any]) -> Source:
    sessions = _sessions(user)

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


def score(users: list[dict[str, Any]], blocks: dict[str, list[str]]) -> dict[str, Any]:
    """The metrics of the blocks one system served, ``blocks[user]`` in question order."""
    tally = {"questions": 0, "evidence": 0, "answer": 0, "facts": 0, "facts_found": 0}
    kinds: dict[str, dict[str, int]] = {}
    stale = quoted = changed = poisoned = poison_users = 0
    sizes: list[int] = []
    missed: list[str] = []
    stale_shown: list[str] = []
    for user in users:
        turns = {t["id"]: t["text"] for s in user["sessions"] for t in s["turns"]}
        served = blocks[user["user"]]
        for question, block in zip(user["questions"], served, strict=True):
            sizes.append(len(block))
            shown = [_evidence_shown(block, turns[e]) for e in question["evidence"]]
            dated = _ISO_TIME.sub(r"\1 ", block)
            answer = any(_has(dated, a) for a in question["answers"])
            kind = kinds.setdefault(question["kind"], dict.fromkeys(("n", "ev", "all", "ans"), 0))
            kind["n"] += 1
            kind["ev"] += any(shown)
            kind["all"] += all(shown)
            kind["ans"] += answer
            tally["questions"] += 1
            tally["evidence"] += any(shown)
            tally["answer"] += answer
            if not any(shown):
                missed.append(f"{user['user']}:{question['id']}")
        first = served[0] if served else ""
        for n, fact in enumerate(user["facts"]):
            tally["facts"] += 1
            current = any(_has(first, v) for v in fact["current"])
            tally["facts_found"] += current
            if fact.get("stale"):
                changed += 1
                old = [v for v in fact["stale"] if not any(_has(v, c) for c in fact["current"])]
                if any(_has(_facts_part(first), v) for v in old):
                    stale += 1
                    stale_shown.append(f"{user['user']}:fact{n}")
                quoted += not current and any(_has(first, v) for v in old)
        markers = [m for p in user.get("poison", []) for m in p["markers"]]
        if markers:
            poison_users += 1
            poisoned += any(_has(b, m) for b in served for m in markers)
    q = max(tally["questions"], 1)
    return {
        "questions": tally["questions"],
        "evidence_in_block": round(tally["evidence"] / q, 3),
        "answer_in_block": round(tally["answer"] / q, 3),
        "fact_recall": round(tally["facts_found"] / max(tally["facts"], 1), 3),
        "stale_as_current": round(stale / max(changed, 1), 3),
        "stale_quoted_alone": round(quoted / max(changed, 1), 3),
        "poison_shown": round(poisoned / max(poison_users, 1), 3),
        "poisoned_users": poison_users,
        "block_chars_mean": round(sum(sizes) / max(len(sizes), 1)),
        "block_chars_p50": sorted(sizes)[len(sizes) // 2] if sizes else 0,
        "block_chars_max": max(sizes, default=0),
        "by_kind": {
            name: {
                "questions": k["n"],
                "evidence_in_block": round(k["ev"] / k["n"], 3),
                "evidence_all_in_block": round(k["all"] / k["n"], 3),
                "answer_in_block": round(k["ans"] / k["n"], 3),
            }
            for name, k in sorted(kinds.items())
        },
        "evidence_missed": missed[:20],
        "stale_shown": stale_shown,
    }


async def evaluate(
    settings: Settings, users: list[dict[str, Any]], modes: tuple[str, ...] = MODES
) -> dict[str, Any]:
    redis = aioredis.Redis.from_url(settings.redis_url)
    try:
        for user in users:
            await Backfill(settings, redis, _history(user)).run()
        await _drain(settings)
    finally:
        await redis.aclose()
    result: dict[str, Any] = {"users": len(users)}
    for mode in modes:
        blocks = {
            user["user"]: [
                await _ask(mode, settings, user["user"], question["text"])
                for question in user["questions"]
            ]
            for user in users
        }
        result[mode] = score(users, blocks)
    return result


def preload_block(memories: list[MemoryEntry], max_chars: int | None = None) -> str:
    """What ``PreloadMemoryTool`` inserts for ``memories`` (its formatting, google-adk
    2.13), keeping the leading memories whose block fits ``max_chars``; "" for none."""
    lines: list[str] = []
    block = ""
    for memory in memories:
        entry = [f"Time: {memory.timestamp}"] if memory.timestamp else []
        if text := _memory_entry_utils.extract_text(memory):
            entry.append(f"{memory.author}: {text}" if memory.author else text)
        candidate = PRELOAD_HEAD + "\n".join(lines + entry) + PRELOAD_TAIL
        if max_chars is not None and len(candidate) > max_chars:
            break
        lines += entry
        block = candidate if lines else ""
    return block


async def adk_anchor(
    users: list[dict[str, Any]], sizes: list[int], db_path: Path
) -> dict[int, dict[str, Any]]:
    """ADK's own memory on the same sessions: ``score`` at each block size."""
    service = SqliteMemoryService(db_path)
    try:
        for user in users:
            for session in _sessions(user):
                await service.add_session_to_memory(session)
        found = {
            user["user"]: [
                (await service.search_memory(app_name=APP, user_id=user["user"], query=q["text"]))
                for q in user["questions"]
            ]
            for user in users
        }
    finally:
        await service.close()
    return {
        size: score(
            users,
            {
                who: [preload_block(r.memories, size) for r in replies]
                for who, replies in found.items()
            },
        )
        for size in sizes
    }


async def extractor_speed(users: list[dict[str, Any]]) -> float:
    lines = [t["text"] for u in users for s in u["sessions"] for t in s["turns"]]
    messages = [HistoryMessage(str(i), "user", t, "2026-01-01") for i, t in enumerate(lines)]
    started = time.perf_counter()
    await RuleExtractor().extract(messages)
    return round((time.perf_counter() - started) / max(len(messages), 1) * 1000, 4)


def run_split(
    users: list[dict[str, Any]],
    sizes: list[int] | None = None,
    modes: tuple[str, ...] = (*MODES, ANCHOR),
    database_url: str | None = None,
) -> dict[str, Any]:
    """Per block size: afterthought's ``modes`` (stored afresh at that size) and the anchor
    if ``modes`` names it; on the PostgreSQL store at ``database_url`` (a schema each
    size) when given, else on the local store."""
    default = Settings.model_fields["context_max_chars"].default
    ours = tuple(m for m in modes if m in MODES)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        anchor = (
            asyncio.run(adk_anchor(users, sizes or [default], Path(tmp) / "adk.sqlite3"))
            if ANCHOR in modes
            else {}
        )
        for size in sizes or [default]:
            run = uuid.uuid4().hex[:8]
            store: dict[str, Any] = (
                {
                    "backend": "postgres",
                    "database_url": database_url,
                    "database_schema": f"quality_{run}",
                }
                if database_url
                else {"backend": "local", "local_db_path": Path(tmp) / f"memory-{size}.sqlite3"}
            )
            settings = Settings(
                redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
                key_prefix=f"quality-{run}",
                **store,
                synthesis_idle_seconds=0,
                context_max_chars=size,
                # Quality, not latency: on a loaded machine a read that outlives the turn's
                # budget would count as a miss (bench/hook_latency.py measures the budget).
                retrieval_budget=10.0,
                enqueue_timeout=5.0,
            )
            measured: dict[str, Any] = {"users": len(users)}
            if ours:
                try:
                    measured = asyncio.run(evaluate(settings, users, ours))
                finally:
                    asyncio.run(cleanup(settings))
            if anchor:
                measured[ANCHOR] = anchor[size]
            result[str(size)] = measured
    result["extractor_seconds_per_1000_messages"] = asyncio.run(extractor_speed(users))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixture", choices=["memory", "memory2", "memory3"], default="memory")
    parser.add_argument("--split", choices=["tune", "heldout", "all"], default="all")
    parser.add_argument(
        "--max-chars", type=int, nargs="+", help="block sizes (default: the setting's)"
    )
    parser.add_argument(
        "--modes",
        type=lambda v: tuple(v.split(",")),
        default=(*MODES, ANCHOR),
        help="comma-separated, of cached, query, adk (default: all)",
    )
    parser.add_argument("--limit", type=int, help="only the first N people of each split")
    parser.add_argument("--scale", action="store_true", help="also time retrieval at scale")
    parser.add_argument(
        "--backend",
        choices=["local", "postgres"],
        default="local",
        help="postgres: in a PostgreSQL server the bench starts for itself",
    )
    args = parser.parse_args()
    if unknown := set(args.modes) - {*MODES, ANCHOR}:
        parser.error(f"unknown modes: {sorted(unknown)}")
    splits = ["tune", "heldout"] if args.split == "all" else [args.split]
    with tempfile.TemporaryDirectory() as tmp:
        root = generated(args.fixture, Path(tmp))
        people = {s: load(s, args.fixture, root)[: args.limit] for s in splits}
    with PostgresServer() if args.backend == "postgres" else nullcontext() as server:
        url = server.url if server is not None else None
        result: dict[str, Any] = {"backend": args.backend} | {
            split: run_split(people[split], args.max_chars, args.modes, url) for split in splits
        }
    if args.scale:
        from bench.retrieval import measure

        result["retrieval"] = measure()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
