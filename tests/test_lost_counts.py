"""W9's count after Redis restarted empty (no persistence): ``lost_messages`` is what was
lost from the queue, never what was stored and acknowledged before the restart."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from afterthought.backends import open_backend
from afterthought.enqueue import Enqueuer
from afterthought.identity import IdentityRegistry
from afterthought.settings import Settings
from afterthought.status import snapshot
from afterthought.testing import RedisServer
from tests.conftest import drain, queued


async def _stored_after_restart(
    make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture, *, drained: bool
) -> tuple[list[str], int, tuple[int, int]]:
    """Five messages queued by one long-lived agent (stored first when ``drained``), Redis
    restarted empty, two more by the same agent, a worker: what the thread holds, oldest
    first, ``status``'s ``lost_messages``, and its ``lost_messages`` and
    ``lost_unverified`` before the worker took the thread."""
    server = RedisServer()
    settings = make_settings(redis_url=server.start())
    agent = Enqueuer(settings)
    try:
        for n in range(5):
            assert await agent.enqueue([queued(f"line {n}", n)])
        if drained:
            await drain(settings)
        server.stop()
        server.start()  # the same port, nothing of before
        for n in (5, 6):
            await agent.enqueue([queued(f"line {n}", n)])
        await agent.drain_buffer(10)
        client = aioredis.Redis.from_url(settings.redis_url)
        try:
            early = await snapshot(client, settings)
            await drain(settings)
            report = await snapshot(client, settings)
            known = await IdentityRegistry(client, settings).lookup(
                app="memtest", user_id="alice", session_id="s1"
            )
        finally:
            await client.aclose()
        backend = open_backend(settings)
        try:
            assert known.thread_uuid is not None
            stored = await backend.recent_messages(thread_uuid=known.thread_uuid, limit=100)
        finally:
            await backend.aclose()
        assert "line" not in caplog.text  # ids and counts only
        unchecked = (early.lost_messages, early.lost_unverified)
        return [m.content for m in stored][::-1], report.lost_messages, unchecked
    finally:
        await agent.aclose()
        server.close()


@pytest.mark.timeout(120)
async def test_messages_stored_before_redis_restarted_empty_are_not_counted_lost(
    make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    """The agent remembers it was handed 1..5 and goes on at 6; the worker finds 1..5 in
    the backend (same numbering), so nothing is counted lost or logged as lost; before
    the worker has looked, ``status`` says the gap is unverified, not lost."""
    stored, lost, unchecked = await _stored_after_restart(make_settings, caplog, drained=True)
    assert stored == [f"line {n}" for n in range(7)]
    assert lost == 0
    assert unchecked == (0, 5)
    assert "redis lost queued messages" not in caplog.text


@pytest.mark.timeout(120)
async def test_messages_redis_lost_before_they_were_stored_are_still_counted(
    make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    """The same, but the five were still queued when Redis restarted: they are lost, and
    the count, the log line (ids only) and status say five."""
    stored, lost, unchecked = await _stored_after_restart(make_settings, caplog, drained=False)
    assert stored == ["line 5", "line 6"]
    assert lost == 5
    assert unchecked == (0, 5)
    assert "redis lost queued messages" in caplog.text and "lost=5" in caplog.text
