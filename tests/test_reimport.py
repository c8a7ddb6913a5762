"""Re-importing a long session (``afterthought backfill``, ``add_session_to_memory``): every
message already stored is recognised by its key however long the thread, so a session of
5,400 messages imported, grown by 2 and imported again stores each message once, in order,
and offers the backend only the 2 new ones — also when the re-import is cut off midway by a
worker crash or a reply lost after the call committed (and Zep ignores keys)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any, cast

import pytest
import redis.asyncio as aioredis
from google.adk.events.event import Event
from google.adk.sessions import Session
from google.genai import types

from afterthought.agent_hooks import TurnMemory, ZepMemoryService
from afterthought.agent_hooks.backfill import Backfill, jsonl_source
from afterthought.backends import open_backend
from afterthought.backends.base import MemoryBackend
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.testing import Fault, ZepFake
from afterthought.worker.flush import Flusher

APP = "memtest"
ADDS = "POST /threads/.*/messages"
#: Events of the long session: past the 5,000 messages a replay was once reconciled with.
LONG = 5400


def _session(events: int) -> Session:
    """Alice's session of ``events`` events, a user turn and a reply each invocation."""
    at = 1_700_000_000.0
    said = [
        Event(
            author="user" if i % 2 == 0 else "assistant",
            invocation_id=f"inv-{i // 2}",
            content=(types.UserContent if i % 2 == 0 else types.ModelContent)(f"event {i}"),
            timestamp=at + i,
        )
        for i in range(events)
    ]
    return Session(
        id="long", app_name=APP, user_id="alice", events=said, last_update_time=at + events
    )


class Crash(BaseException):
    """The worker dies right after a call committed: no reply, nothing acknowledged."""


class Watched:
    """Wraps a backend: the texts ``add_messages`` was offered, the history pages read, and a
    failure planned after the ``fail_after``-th call commits."""

    def __init__(self, inner: MemoryBackend) -> None:
        self.inner = inner
        self.offered: list[str] = []
        self.pages = 0
        self.fail_after: int | None = None
        self.failure: BaseException | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def add_messages(self, **kwargs: Any) -> str | None:
        result = await self.inner.add_messages(**kwargs)
        self.offered += [m.content for m in kwargs["messages"]]
        if self.fail_after is not None and self.failure is not None:
            self.fail_after -= 1
            if self.fail_after == 0:
                failure, self.failure = self.failure, None
                raise failure
        return result

    async def message_page(self, **kwargs: Any) -> Any:
        self.pages += 1
        return await self.inner.message_page(**kwargs)


async def _no_sleep(seconds: float) -> None:
    await asyncio.sleep(0)


async def _drain(settings: Settings, redis: aioredis.Redis, backend: Watched) -> Counter[str]:
    """Flush until nothing is queued (a crash in one flush leaves its thread due again)."""
    flusher = Flusher(settings, redis, cast(MemoryBackend, backend), sleep=_no_sleep)
    keys, stats = Keys.of(settings), Counter[str]()
    while any([await redis.zcard(keys.ready(s)) for s in keys.shard_ids]):
        stats += await flusher.drain(budget=300)
    return stats


async def _stored(settings: Settings, backend: MemoryBackend) -> list[str]:
    """Alice's thread, oldest first, as the texts it holds."""
    from afterthought.identity import IdentityRegistry

    client = aioredis.Redis.from_url(settings.redis_url)
    try:
        known = await IdentityRegistry(client, settings).lookup(
            app=APP, user_id="alice", session_id="long"
        )
    finally:
        await client.aclose()
    assert known.thread_uuid is not None
    newest_first = await backend.recent_messages(thread_uuid=known.thread_uuid, limit=10**6)
    return [m.content for m in reversed(newest_first)]


def _tally(stored: list[str], events: int) -> dict[str, object]:
    """Copies, losses and whether the thread reads as the session, against its events."""
    expected = [f"event {i}" for i in range(events)]
    seen = Counter(stored)
    return {
        "duplicated": sum(n - 1 for n in seen.values()),
        "lost": sum(1 for text in expected if text not in seen),
        "in_order": stored == expected,
    }


CLEAN = {"duplicated": 0, "lost": 0, "in_order": True}


async def _import_backfill(
    settings: Settings, redis: aioredis.Redis, tmp_path: Path, session: Session
) -> None:
    export = tmp_path / "sessions.jsonl"
    export.write_text(session.model_dump_json() + "\n")
    report = await Backfill(settings, redis, jsonl_source(export)).run()
    assert report.messages == len(session.events)


async def _import_service(
    settings: Settings, redis: aioredis.Redis, tmp_path: Path, session: Session
) -> None:
    service = ZepMemoryService(memory=TurnMemory.create(settings=settings))
    await service.add_session_to_memory(session)


IMPORTS = pytest.mark.parametrize(
    "reimport", [_import_backfill, _import_service], ids=["backfill", "add_session_to_memory"]
)


@IMPORTS
async def test_a_long_session_imported_grown_and_imported_again_is_stored_once(
    any_settings: Settings, redis: aioredis.Redis, tmp_path: Path, reimport: Any
) -> None:
    backend = Watched(open_backend(any_settings))
    await reimport(any_settings, redis, tmp_path, _session(LONG))
    await _drain(any_settings, redis, backend)
    assert len(backend.offered) == LONG
    backend.offered.clear()

    await reimport(any_settings, redis, tmp_path, _session(LONG + 2))
    await _drain(any_settings, redis, backend)

    assert _tally(await _stored(any_settings, backend.inner), LONG + 2) == CLEAN
    assert backend.offered == [f"event {LONG}", f"event {LONG + 1}"]  # 5,400 recognised


@pytest.mark.parametrize("failure", ["crash", "lost reply"])
async def test_a_reimport_cut_off_midway_stores_each_message_once(
    zep_settings: Settings,
    zep_fake: ZepFake,
    redis: aioredis.Redis,
    tmp_path: Path,
    failure: str,
) -> None:
    """The session grows by 300 messages (10 calls); the 4th call of the re-import commits,
    then the worker dies (the next lease reads the thread whole) or the reply is lost (the
    retry reads only the newest pages). Zep ignores keys: only recognition prevents a copy."""
    zep_fake.honor_idempotency = False
    backend = Watched(open_backend(zep_settings))
    await _import_backfill(zep_settings, redis, tmp_path, _session(LONG))
    await _drain(zep_settings, redis, backend)
    backend.offered.clear()

    backend.fail_after = 4
    if failure == "crash":
        backend.failure = Crash()
    else:
        zep_fake.inject(Fault(match=ADDS, drop=True, after_commit=True))
        backend.fail_after = None  # the fake loses the first add's reply
    await _import_backfill(zep_settings, redis, tmp_path, _session(LONG + 300))
    before = backend.pages
    stats = await _drain(zep_settings, redis, backend)

    assert _tally(await _stored(zep_settings, backend.inner), LONG + 300) == CLEAN
    if failure == "crash":
        assert stats["errors"] == 1 and len(backend.offered) == 300
    else:
        assert stats["unknown_outcomes"] == 1
        # The retry read the newest pages only, not the 5,400 messages again.
        assert backend.pages - before <= 2 * LONG // 50 + 10
