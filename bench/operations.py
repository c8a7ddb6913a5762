"""What the operations cost: ``afterthought status`` (the snapshot the worker's gauges also
read) against a large queue; ``backfill`` from a JSONL export; and how long one worker
takes to persist a backfill to the Zep fake answering in 100 ms (every thread new: the
worker provisions it, and reconciles each batch, as replays are).

    python bench/operations.py [--threads 10000] [--sessions 2000 --turns 5]

Prints one JSON object. Uses REDIS_URL or 127.0.0.1:6379 under a fresh key prefix."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis.asyncio as aioredis
from google.adk.events import Event
from google.adk.sessions import Session
from google.genai import types

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from afterthought.agent_hooks.backfill import Backfill, jsonl_source  # noqa: E402
from afterthought.contract import QueuedMessage  # noqa: E402
from afterthought.enqueue import Enqueuer  # noqa: E402
from afterthought.settings import Settings  # noqa: E402
from afterthought.status import snapshot  # noqa: E402
from afterthought.testing import ZepFake  # noqa: E402
from afterthought.testing.processes import cleanup, spawn_worker, wait_settled  # noqa: E402

APP = "bench"


async def status_cost(settings: Settings, redis: aioredis.Redis, threads: int) -> dict[str, float]:
    enqueuer = Enqueuer(settings.model_copy(update={"enqueue_timeout": 5.0}), redis=redis)
    for n in range(threads):
        message = QueuedMessage.build(
            app=APP,
            user_id=f"u{n}",
            session_id="s",
            invocation_id="i",
            role="user",
            ordinal=0,
            content="queued",
        )
        assert await enqueuer.send([message]) is None
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        found = await snapshot(redis, settings)
        runs.append(time.perf_counter() - start)
    assert found.queue.threads == threads
    return {"threads": threads, "status_p50_ms": round(statistics.median(runs) * 1000, 1)}


def _export(path: Path, sessions: int, turns: int, *, users: int = 100) -> None:
    with path.open("w") as out:
        for n in range(sessions):
            events = [
                Event(
                    author="user" if t % 2 == 0 else "assistant",
                    invocation_id=f"inv-{t // 2}",
                    content=types.Content(
                        role="user" if t % 2 == 0 else "model",
                        parts=[types.Part(text=f"message {t} of session {n}")],
                    ),
                    timestamp=1_700_000_000.0 + t,
                )
                for t in range(turns * 2)
            ]
            session = Session(id=f"s{n}", app_name=APP, user_id=f"u{n % users}", events=events)
            out.write(session.model_dump_json() + "\n")


async def backfill_cost(
    settings: Settings, redis: aioredis.Redis, sessions: int, turns: int
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp) / "sessions.jsonl"
        _export(export, sessions, turns)
        start = time.perf_counter()
        report = await Backfill(settings, redis, jsonl_source(export)).run()
        first = time.perf_counter() - start
        start = time.perf_counter()
        again = await Backfill(settings, redis, jsonl_source(export)).run()
        resumed = time.perf_counter() - start
    assert report.messages == sessions * turns * 2 and again.skipped == sessions
    return {
        "sessions": sessions,
        "messages": report.messages,
        "sessions_per_s": round(sessions / first),
        "messages_per_s": round(report.messages / first),
        "rerun_skip_sessions_per_s": round(sessions / resumed),
    }


async def persist_cost(redis: aioredis.Redis, sessions: int, turns: int) -> dict[str, float]:
    with ZepFake(latency=0.1) as fake, tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            key_prefix=f"bench-{uuid.uuid4().hex[:8]}",
            zep_api_key="bench",
            zep_base_url=fake.base_url,
        )
        export = Path(tmp) / "sessions.jsonl"
        _export(export, sessions, turns, users=max(1, sessions // 10))
        report = await Backfill(settings, redis, jsonl_source(export)).run()
        worker = spawn_worker(settings)
        start = time.perf_counter()
        try:
            assert await wait_settled(settings, timeout=600)
            seconds = time.perf_counter() - start
            stored = len(fake.messages())
        finally:
            worker.terminate()
            worker.wait(timeout=30)
            await cleanup(settings)
    assert stored == report.messages
    return {
        "sessions": sessions,
        "messages_per_session": turns * 2,
        "zep_latency_s": 0.1,
        "seconds": round(seconds, 1),
        "msg_per_s": round(stored / seconds),
        "calls": len(fake.requests),
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args()
    base = Settings(
        redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        backend="local",
        key_prefix=f"bench-{uuid.uuid4().hex[:8]}",
    )
    other = base.model_copy(update={"key_prefix": f"bench-{uuid.uuid4().hex[:8]}"})
    redis = aioredis.Redis.from_url(base.redis_url)
    try:
        result = {
            "status": await status_cost(base, redis, args.threads),
            "backfill": await backfill_cost(other, redis, args.sessions, args.turns),
            "persist_short_sessions": await persist_cost(redis, 500, 5),
            "persist_long_sessions": await persist_cost(redis, 10, 250),
        }
    finally:
        await redis.aclose()
        await cleanup(base)
        await cleanup(other)
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
