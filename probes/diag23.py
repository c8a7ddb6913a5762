"""Throwaway: store a memory3 split once (kept under /tmp), then score blocks read straight
from the local store for every question, with per-question misses.

    python probes/diag.py store tune            # once (slow)
    python probes/diag.py eval tune [--chars 4000] [--show KIND] [--limit N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis.asyncio as aioredis  # noqa: E402

from afterthought.agent_hooks.backfill import Backfill  # noqa: E402
from afterthought.backends.base import UserRef  # noqa: E402
from afterthought.backends.local import LocalBackend  # noqa: E402
from afterthought.settings import Settings  # noqa: E402
from afterthought.testing.processes import cleanup  # noqa: E402
from bench import memory_quality as mq  # noqa: E402

WORK = Path("/tmp/hop23d")


def people(split: str) -> list[dict]:
    out = WORK / "fixture"
    if not (out / "memory3" / split).exists():
        subprocess.run(
            [sys.executable, str(mq.FIXTURES / "memory3" / "generate.py"), str(out / "memory3")],
            check=True,
        )
    return mq.load(split, "memory3", out)


def store(split: str) -> None:
    users = people(split)
    db = WORK / f"{split}.sqlite3"
    if db.exists():
        db.unlink()
    settings = Settings(
        redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        key_prefix=f"diag-{uuid.uuid4().hex[:8]}",
        local_db_path=db,
        backend="local",
        synthesis_idle_seconds=0,
        retrieval_budget=10.0,
        enqueue_timeout=5.0,
    )

    async def run() -> None:
        redis = aioredis.Redis.from_url(settings.redis_url)
        try:
            for user in users:
                await Backfill(settings, redis, mq._history(user)).run()
            await mq._drain(settings)
        finally:
            await redis.aclose()

    try:
        asyncio.run(run())
    finally:
        asyncio.run(cleanup(settings))


def evaluate(split: str, chars: int, show: str | None, limit: int | None, dump: bool) -> None:
    users = people(split)[:limit]
    path = WORK / f"{split}.sqlite3"
    raw = sqlite3.connect(path)
    refs = {}
    for u, uid, graph in raw.execute("SELECT uuid, user_id, graph_uuid FROM users"):
        refs[uid] = UserRef(u, graph)
    backend = LocalBackend(path, max_chars=chars)
    blocks: dict[str, list[str]] = {}

    async def run() -> None:
        for user in users:
            ref = next(r for k, r in refs.items() if k.endswith(user["user"]) or user["user"] in k)
            blocks[user["user"]] = [
                await backend.get_context(user=ref, query=q["text"], max_chars=chars, timeout=10)
                for q in user["questions"]
            ]
        await backend.aclose()

    asyncio.run(run())
    result = mq.score(users, blocks)
    result.pop("evidence_missed")
    print(json.dumps(result, indent=None))
    if show:
        for user in users:
            turns = {t["id"]: t["text"] for s in user["sessions"] for t in s["turns"]}
            for q, block in zip(user["questions"], blocks[user["user"]], strict=False):
                if show != "all" and q["kind"] != show:
                    continue
                shown = [mq._evidence_shown(block, turns[e]) for e in q["evidence"]]
                if all(shown):
                    continue
                print(f"\n== {user['user']} [{q['kind']}] {q['text']}  answers={q['answers']}")
                for e, ok in zip(q["evidence"], shown, strict=False):
                    print(f"   {'OK ' if ok else 'MISS'} {turns[e][:200]}")
                if dump:
                    print(block)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["store", "eval"])
    p.add_argument("split")
    p.add_argument("--chars", type=int, default=4000)
    p.add_argument("--show")
    p.add_argument("--limit", type=int)
    p.add_argument("--dump", action="store_true")
    a = p.parse_args()
    WORK.mkdir(exist_ok=True)
    if a.what == "store":
        store(a.split)
    else:
        evaluate(a.split, a.chars, a.show, a.limit, a.dump)


if __name__ == "__main__":
    main()
