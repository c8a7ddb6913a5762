"""Issue 21, what the served-by check left open: a Redis gone back in time within the second
after the last check, restored from a snapshot taken before any worker ran, or one that
will not say which server it is; a thread numbered from 1 again; an agent whose clock runs
ahead of Redis'. Each on a redis-server of its own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis import Redis
from redis.exceptions import RedisError

from afterthought.connections import connect
from afterthought.contract import QueuedMessage
from afterthought.keys import Keys
from afterthought.queue import FORGOTTEN, ThreadQueue
from afterthought.testing.redis_server import RedisServer
from afterthought.testing.zep_fake import ZepFake
from afterthought.worker import metrics
from tests.redelivery_support import flusher, settings_for
from tests.test_redelivery import drain, msg, rollback_during_lease


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _restart(
    server: RedisServer, r: aioredis.Redis, agent: ThreadQueue
) -> tuple[aioredis.Redis, ThreadQueue]:
    """Redis restarted from its last snapshot (``SAVE``): what came after it is gone. The
    agent's process goes on (a new connection, the numbers it was handed kept)."""
    await r.aclose()
    with contextlib.suppress(RedisError):
        Redis.from_url(server.url).execute_command("SHUTDOWN", "NOSAVE")
    server.stop()
    server.start()
    r = connect(agent.settings.redis_url)
    return r, ThreadQueue(r, agent.settings, handed_out=agent.handed_out)


def _lost(server: RedisServer, settings) -> int:
    return int(Redis.from_url(server.url).get(Keys.of(settings).lost(None)) or 0)


def test_rollback_within_the_second_after_the_check_is_refused_at_begin() -> None:
    # Before: the batch after the restart was recorded on the restored server within the
    # second, m2 (given back) went out again with m5: ["m1", "m2", "m3", "m2", "m5"].
    assert asyncio.run(rollback_during_lease(past_check=False)) == ["m1", "m2", "m3", "m5"]


async def snapshot_before_any_worker() -> dict:
    """m1 queued before any worker ran, snapshot; a worker stores it; Redis restarts from the
    snapshot (m1 queued again, no served-by record); the agent queues m2."""
    server = RedisServer()
    server.start()
    with ZepFake() as fake:
        s = settings_for(server.url, fake, Path(tempfile.mkdtemp(prefix="rollback-")))
        r = connect(s.redis_url)
        agent = ThreadQueue(r, s)
        assert await agent.enqueue([msg(1, "m1")], now_ms=_now_ms()) == 1
        await r.execute_command("SAVE")
        await drain(flusher(s), r)
        r, agent = await _restart(server, r, agent)
        assert await agent.enqueue([msg(2, "m2")], now_ms=_now_ms()) == 1
        await drain(flusher(s), r)
        await r.aclose()
        found = {"stored": [m["content"] for m in fake.messages()], "lost": _lost(server, s)}
    server.close()
    return found


def test_snapshot_from_before_any_worker_gives_back_what_it_held_as_unsure() -> None:
    # Before: the missing record was taken for a new server, m1 went out again with m2.
    found = asyncio.run(snapshot_before_any_worker())
    assert found == {"stored": ["m1", "m2"], "lost": 0}, found


async def rollback_without_info(caplog: pytest.LogCaptureFixture) -> dict:
    """``INFO`` renamed away: m1 queued, snapshot; m2, m3 queued and stored; Redis restarts
    from the snapshot (m1 queued again); the agent queues m4."""
    server = RedisServer(args=["--rename-command", "INFO", ""])
    server.start()
    with ZepFake() as fake:
        s = settings_for(server.url, fake, Path(tempfile.mkdtemp(prefix="rollback-")))
        r = connect(s.redis_url)
        await drain(flusher(s), r)
        agent = ThreadQueue(r, s)
        assert await agent.enqueue([msg(1, "m1")], now_ms=_now_ms()) == 1
        await r.execute_command("SAVE")
        for i in (2, 3):
            assert await agent.enqueue([msg(i, f"m{i}")], now_ms=_now_ms()) == 1
        await drain(flusher(s), r)
        r, agent = await _restart(server, r, agent)
        assert await agent.enqueue([msg(4, "m4")], now_ms=_now_ms()) == 1
        with caplog.at_level(logging.WARNING, logger="afterthought.worker.flush"):
            await drain(flusher(s), r)
        await r.aclose()
        found = {
            "stored": [m["content"] for m in fake.messages()],
            "unnamed": metrics.REDIS_SERVER_UNNAMED._value.get(),
            "told": any("does not name its server" in m for m in caplog.messages),
        }
    server.close()
    return found


def test_redis_without_info_reconciles_every_batch(caplog: pytest.LogCaptureFixture) -> None:
    # Before: "rollbacks unseen", m1 stored twice: ["m1", "m2", "m3", "m1", "m4"].
    found = asyncio.run(rollback_without_info(caplog))
    assert found == {"stored": ["m1", "m2", "m3", "m4"], "unnamed": 1, "told": True}, found


async def renumbered_then_rolled_back() -> dict:
    """A thread of five messages is stored, goes idle and its hash expires (numbered from 1
    again); n1, n2 queued, snapshot; n3, n4 queued; Redis restarts from the snapshot (n3, n4
    lost, never stored); the agent queues n5."""
    server = RedisServer()
    server.start()
    with ZepFake() as fake:
        s = settings_for(server.url, fake, Path(tempfile.mkdtemp(prefix="rollback-")))
        r = connect(s.redis_url)
        f = flusher(s)
        old = ThreadQueue(r, s)
        for i in range(1, 6):
            assert await old.enqueue([msg(i, f"old {i}")], now_ms=_now_ms()) == 1
        await drain(f, r)
        head = msg(0, "x")
        await r.delete(old.keys.thread(old.ref_of(head)))  # as its idle lifetime ends
        agent = ThreadQueue(r, s)  # a later process: it was handed none of the old numbers
        for i in (1, 2):
            assert await agent.enqueue([msg(10 + i, f"n{i}")], now_ms=_now_ms()) == 1
        await r.execute_command("SAVE")
        for i in (3, 4):
            assert await agent.enqueue([msg(10 + i, f"n{i}")], now_ms=_now_ms()) == 1
        r, agent = await _restart(server, r, agent)
        assert await agent.enqueue([msg(15, "n5")], now_ms=_now_ms()) == 1
        await drain(flusher(s), r)
        await r.aclose()
        found = {"stored": [m["content"] for m in fake.messages()], "lost": _lost(server, s)}
    server.close()
    return found


def test_lost_after_a_thread_numbers_again_are_counted() -> None:
    # Before: the old numbering's top (5) covered the new one's gap (3, 4): lost 0.
    found = asyncio.run(renumbered_then_rolled_back())
    old = [f"old {i}" for i in range(1, 6)]
    assert found == {"stored": [*old, "n1", "n2", "n5"], "lost": 2}, found


AHEAD_MS = 5_000


async def agent_ahead_rollback() -> list[str]:
    """An agent whose clock runs 5 s ahead of Redis': m1 queued, snapshot; m2, m3 queued and
    stored; Redis restarts from the snapshot (m1 queued again); the agent queues m4."""
    server = RedisServer()
    server.start()
    with ZepFake() as fake:
        s = settings_for(server.url, fake, Path(tempfile.mkdtemp(prefix="rollback-")))
        r = connect(s.redis_url)
        await drain(flusher(s), r)  # a worker runs: it has seen the server
        agent = ThreadQueue(r, s)

        async def say(i: int) -> None:
            ahead = msg(i, f"m{i}").model_copy(update={"said_ms": _now_ms() + AHEAD_MS})
            assert await agent.enqueue([ahead], now_ms=_now_ms() + AHEAD_MS) == 1

        await say(1)
        await r.execute_command("SAVE")
        await say(2)
        await say(3)
        await drain(flusher(s), r)
        r, agent = await _restart(server, r, agent)
        await say(4)
        await drain(flusher(s), r)
        await r.aclose()
        stored = [m["content"] for m in fake.messages()]
    server.close()
    return stored


def test_agent_clock_ahead_of_redis_does_not_hide_given_back_messages() -> None:
    # Before: m1 was queued 5 s "after" the restart by the agent's clock: sent again.
    assert asyncio.run(agent_ahead_rollback()) == ["m1", "m2", "m3", "m4"]


async def agent_ahead_after_forget(caplog: pytest.LogCaptureFixture) -> dict:
    """A user is forgotten (its time by Redis' clock); a message said half a second before
    it arrives from an agent whose clock runs 5 s ahead."""
    with RedisServer() as url, ZepFake() as fake:
        s = settings_for(url, fake, Path(tempfile.mkdtemp(prefix="rollback-")))
        r = connect(url)
        seconds, micros = await r.time()
        forgot = seconds * 1000 + micros // 1000
        await r.set(Keys.of(s).forgot("app", "ada"), forgot)
        said = msg(1, "said before the forget").model_copy(
            update={"said_ms": forgot - 500 + AHEAD_MS}
        )
        with caplog.at_level(logging.WARNING, logger="afterthought.queue"):
            outcome = await ThreadQueue(r, s).enqueue([said], now_ms=_now_ms() + AHEAD_MS)
        await r.aclose()
    return {
        "outcome": outcome,
        "told": any("clock off redis" in m for m in caplog.messages),
    }


def test_agent_clock_ahead_of_redis_is_refused_after_a_forget_and_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Before: accepted (1): its said_ms was 4.5 s past the forget by the agent's clock.
    found = asyncio.run(agent_ahead_after_forget(caplog))
    assert found == {"outcome": FORGOTTEN, "told": True}, found


def test_queue_numbers_and_stamps_by_redis_clock() -> None:
    """The payload's header: Redis' clock, the agent's skew, the numbering's name."""

    async def run() -> QueuedMessage:
        with RedisServer() as url, ZepFake() as fake:
            s = settings_for(url, fake, Path(tempfile.mkdtemp(prefix="rollback-")))
            r = connect(url)
            q = ThreadQueue(r, s)
            await q.enqueue([msg(1, "m1")], now_ms=_now_ms() + AHEAD_MS)
            (raw,) = await r.lrange(q.keys.pending(q.ref_of(msg(1, "m1"))), 0, -1)
            await r.aclose()
            return QueuedMessage.decode(raw)

    queued = asyncio.run(run())
    assert queued.queued_ms is not None and abs(queued.queued_ms - _now_ms()) < 2_000
    assert AHEAD_MS - 2_000 < queued.skew_ms <= AHEAD_MS
    assert queued.numbering is not None
