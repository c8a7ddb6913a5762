"""For tests/test_redelivery.py: a private redis-server, a ZepFake on a hand-moved clock,
settings, a Flusher on the real Zep backend (real zep-cloud SDK) and ADK Session builders."""

from __future__ import annotations

import contextlib
import secrets
import tempfile
import time
from pathlib import Path

from google.adk.events.event import Event
from google.adk.sessions import Session
from google.genai import types

from afterthought.backends import open_backend
from afterthought.connections import connect
from afterthought.settings import Settings
from afterthought.testing.redis_server import RedisServer
from afterthought.testing.zep_fake import ZepFake
from afterthought.worker.flush import Flusher


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@contextlib.contextmanager
def stand(**fake_kw):
    clock = Clock()
    with RedisServer() as url, ZepFake(clock=clock, **fake_kw) as fake:
        tmp = tempfile.mkdtemp(prefix="redelivery-")
        yield url, fake, clock, Path(tmp)


def settings_for(url: str, fake: ZepFake, tmp: Path, **kw) -> Settings:
    base = {
        "redis_url": url,
        "zep_api_key": "test-key",
        "zep_base_url": fake.base_url,
        "key_prefix": "brk" + secrets.token_hex(3),
        "backend_settle_seconds": 0.0,
        "backend_timeout": 3.0,
        "spool_path": tmp / "spool",
        "local_db_path": tmp / "local.sqlite3",
        "synthesis_idle_seconds": 3600,
    }
    base.update(kw)
    return Settings(**base)


def flusher(settings: Settings) -> Flusher:
    async def no_sleep(_: float) -> None:
        return None

    return Flusher(settings, connect(settings.redis_url), open_backend(settings), sleep=no_sleep)


def session(
    texts: list[tuple[str, str]],
    *,
    sid: str = "s1",
    user: str = "ada",
    app: str = "app",
    per_turn: int = 2,
    start: float | None = None,
) -> Session:
    """texts: (author, text) pairs; author 'user' or the agent's name. A new invocation every
    ``per_turn`` events (user then reply)."""
    t0 = start or (time.time() - len(texts) - 10)
    events = []
    for i, (author, text) in enumerate(texts):
        inv = f"inv-{i // per_turn}"
        role = "user" if author == "user" else "model"
        events.append(
            Event(
                invocation_id=inv,
                author=author,
                timestamp=t0 + i,
                content=types.Content(role=role, parts=[types.Part(text=text)]),
            )
        )
    return Session(
        id=sid,
        app_name=app,
        user_id=user,
        state={},
        events=events,
        last_update_time=t0 + len(texts),
    )


def stored(fake: ZepFake) -> list[dict]:
    return fake.messages()


def dup_report(msgs: list[dict]) -> dict:
    """Count messages stored more than once (same afterthought key and content), ignoring
    those marked as copies."""
    from collections import Counter

    keys = Counter()
    marked = 0
    for m in msgs:
        md = m.get("metadata") or {}
        if md.get("afterthought_copy_of"):
            marked += 1
            continue
        keys[(md.get("afterthought_key"), m.get("content"))] += 1
    dups = sum(c - 1 for c in keys.values() if c > 1)
    return {
        "stored": len(msgs),
        "unmarked_duplicates": dups,
        "marked_copies": marked,
        "distinct": len(keys),
    }
