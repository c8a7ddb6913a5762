"""What re-importing a long session costs: a session of ``--events`` messages backfilled
into an empty thread, grown by 2, backfilled again, and once more, persisted by in-process
workers (the flusher a worker's jobs run) on the Zep fake (real zep-cloud SDK over HTTP,
answering in ``--latency`` seconds) or the local store; and the memory a thread's history
takes in the worker while a replay is reconciled (``StoredIndex``, ``--index`` messages).

    python bench/reimport.py [--events 5400] [--latency 0.0] [--backend zep|local] [--index 100000]

Prints one JSON object. Uses REDIS_URL or 127.0.0.1:6379 under a fresh key prefix."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, cast

import redis.asyncio as aioredis
from google.adk.events import Event
from google.adk.sessions import Session
from google.genai import types

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from afterthought.agent_hooks.backfill import Backfill, jsonl_source  # noqa: E402
from afterthought.backends import open_backend  # noqa: E402
from afterthought.backends.base import (  # noqa: E402
    MESSAGE_KEY_FIELD,
    MemoryBackend,
    OutgoingMessage,
    StoredMessage,
)
from afterthought.batching import StoredIndex  # noqa: E402
from afterthought.keys import Keys  # noqa: E402
from afterthought.settings import Settings  # noqa: E402
from afterthought.testing import ZepFake  # noqa: E402
from afterthought.worker.flush import Flusher  # noqa: E402


def session(events: int) -> Session:
    at = 1_700_000_000.0
    return Session(
        id="long",
        app_name="bench",
        user_id="alice",
        last_update_time=at + events,
        events=[
            Event(
                author="user" if i % 2 == 0 else "assistant",
                invocation_id=f"inv-{i // 2}",
                content=(types.UserContent if i % 2 == 0 else types.ModelContent)(
                    f"event {i}: something said in the conversation, a sentence or two long"
                ),
                timestamp=at + i,
            )
            for i in range(events)
        ],
    )


class Counting:
    """Counts the backend calls the worker makes, by operation."""

    def __init__(self, inner: MemoryBackend) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.offered = 0

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if not callable(attribute) or name.startswith("_"):
            return attribute

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if name == "add_messages":
                self.offered += len(kwargs["messages"])
            return await attribute(*args, **kwargs)

        return counted


async def persist(worker: Flusher) -> float:
    keys = Keys.of(worker.settings)
    start = time.perf_counter()
    while any([await worker.redis.zcard(keys.ready(s)) for s in keys.shard_ids]):
        await worker.drain(budget=300)
    return time.perf_counter() - start


async def reimport(args: argparse.Namespace, settings: Settings, folder: Path) -> dict[str, Any]:
    """Imported by one worker; grown by 2 and imported again by another (it reads the
    thread whole), then grown by 2 and imported again by that one (it kept what it read)."""
    redis = aioredis.Redis.from_url(settings.redis_url)
    backend = Counting(open_backend(settings))
    first, second = (Flusher(settings, redis, cast(MemoryBackend, backend)) for _ in range(2))
    export = folder / "sessions.jsonl"
    rounds: dict[str, Any] = {}
    try:
        for name, events, worker in (
            ("import", args.events, first),
            ("reimport_by_another_worker", args.events + 2, second),
            ("reimport_by_the_same_worker", args.events + 4, second),
        ):
            export.write_text(session(events).model_dump_json() + "\n")
            await Backfill(settings, redis, jsonl_source(export)).run()
            backend.calls.clear()
            backend.offered = 0
            seconds = await persist(worker)
            rounds[name] = {
                "messages": events,
                "seconds": round(seconds, 2),
                "backend_calls": dict(backend.calls),
                "calls_per_message": round(sum(backend.calls.values()) / events, 4),
                "offered": backend.offered,
            }
        registry_thread = await backend.inner.recent_messages(
            thread_uuid=await thread_of(settings, redis), limit=10**7
        )
        keys = Counter(str(m.metadata.get(MESSAGE_KEY_FIELD)) for m in registry_thread)
        rounds["stored"] = len(registry_thread)
        rounds["duplicated"] = sum(n - 1 for n in keys.values())
    finally:
        await backend.inner.aclose()
        await redis.aclose()
    return rounds


async def thread_of(settings: Settings, redis: aioredis.Redis) -> str:
    from afterthought.identity import IdentityRegistry

    known = await IdentityRegistry(redis, settings).lookup(
        app="bench", user_id="alice", session_id="long"
    )
    assert known.thread_uuid is not None
    return known.thread_uuid


def index_memory(stored: int) -> dict[str, Any]:
    """The worker's memory for a thread of ``stored`` messages read in pages of 50 (once
    timed, once under tracemalloc, which slows it), and a batch's lookup."""

    def build() -> StoredIndex:
        index = StoredIndex(replay=True)
        for first in range(0, stored, 50):
            index.add_stored(
                StoredMessage(
                    uuid=str(n),
                    role="user",
                    content=f"message {n}: something said in the conversation",
                    metadata={MESSAGE_KEY_FIELD: f"{n:032x}:user:0"},
                )
                for n in range(first, min(first + 50, stored))
            )
        return index

    start = time.perf_counter()
    index = build()
    built = time.perf_counter() - start
    batch = [
        OutgoingMessage(
            role="user",
            content=f"message {n}: something said in the conversation",
            reference_time="",
            metadata={MESSAGE_KEY_FIELD: f"{n:032x}:user:0"},
        )
        for n in range(stored - 30, stored)
    ]
    start = time.perf_counter()
    assert index.lacking(batch) == []
    looked_up = time.perf_counter() - start
    del index
    tracemalloc.start()
    index = build()
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(index) == stored
    return {
        "stored": stored,
        "held_bytes": held,
        "peak_bytes": peak,
        "bytes_per_message": round(held / stored, 1),
        "build_seconds": round(built, 2),
        "batch_of_30_lookup_ms": round(looked_up * 1000, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5400)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--backend", choices=["zep", "local"], default="zep")
    parser.add_argument("--index", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, ZepFake(latency=args.latency) as fake:
        common: dict[str, Any] = {
            "redis_url": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            "key_prefix": f"bench-{uuid.uuid4().hex[:8]}",
            "local_db_path": Path(folder) / "memory.sqlite3",
        }
        if args.backend == "zep":
            common.update(backend="zep", zep_api_key="bench", zep_base_url=fake.base_url)
        settings = Settings(**common)
        result = asyncio.run(reimport(args, settings, Path(folder)))
    result["index_memory"] = index_memory(args.index)
    result["backend"], result["latency"] = args.backend, args.latency
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
