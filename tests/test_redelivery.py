"""Issue 21 (break-it round brk21): with keys honoured, every message is stored exactly once,
in order, or counted, through a Redis that goes back in time, an outage buffer, a spool
replayed after a re-import, two agent processes of one machine, and late copies deep in a
thread."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path

import pytest
from redis import Redis
from redis.exceptions import RedisError

from afterthought.agent_hooks.backfill import Backfill, Source
from afterthought.agent_hooks.messages import messages_from_events
from afterthought.backends import open_backend
from afterthought.connections import connect
from afterthought.contract import QueuedMessage
from afterthought.enqueue import Enqueuer
from afterthought.queue import ThreadQueue
from afterthought.spool import Spool, replay_into
from afterthought.testing.redis_proxy import RedisProxy
from afterthought.testing.redis_server import RedisServer, free_port
from afterthought.testing.zep_fake import Fault, ZepFake
from afterthought.worker import flush as flush_module
from afterthought.worker.flush import Flusher
from tests.conftest import until
from tests.redelivery_support import Clock, dup_report, flusher, session, settings_for, stand


def msg(i: int, text: str) -> QueuedMessage:
    return QueuedMessage.build(
        app="app",
        user_id="ada",
        session_id="s1",
        invocation_id=f"inv{i}",
        role="user",
        ordinal=0,
        content=text,
    )


async def drain(f, redis, rounds: int = 20) -> None:
    for _ in range(rounds):
        st = await f.drain(budget=3.0)
        if not await redis.zcard(f.keys.ready(None)) and not st:
            return


async def rollback(flush_first: bool) -> dict:
    """m1 queued, snapshot; m2, m3 queued; (the worker stores all three); Redis restarts
    from the snapshot (no AOF): m1 is queued again; the agent goes on with m4."""
    server = RedisServer()
    server.start()
    with ZepFake() as fake:
        s = settings_for(
            server.url, fake, Path(tempfile.mkdtemp(prefix="redelivery-")), enqueue_timeout=1.0
        )
        r = connect(s.redis_url)
        await drain(flusher(s), r)  # a worker runs: it has seen the server
        await r.aclose()
        agent = Enqueuer(s)
        assert await agent.enqueue([msg(1, "m1")])
        Redis.from_url(server.url).save()
        assert await agent.enqueue([msg(2, "m2")])
        assert await agent.enqueue([msg(3, "m3")])
        if flush_first:
            r = connect(s.redis_url)
            await drain(flusher(s), r)
            await r.aclose()
        server.stop()
        server.start()
        await asyncio.sleep(0.3)
        for _ in range(50):
            if await agent.enqueue([msg(4, "m4")]) or not agent.buffered:
                break
        agent.wait_empty(5.0)
        r = connect(s.redis_url)
        await drain(flusher(s), r)
        texts = [m["content"] for m in fake.messages()]
        lost = Redis.from_url(server.url).get(f"{s.key_prefix}:lost")
        await r.aclose()
        await agent.aclose()
        server.close()
        return {"stored": texts, "lost": int(lost or 0)}


def test_rollback_requeued_stored_messages_are_stored_once_and_not_counted_lost() -> None:
    found = asyncio.run(rollback(True))
    assert found == {"stored": ["m1", "m2", "m3", "m4"], "lost": 0}, found


def test_rollback_that_loses_unstored_messages_counts_them() -> None:
    found = asyncio.run(rollback(False))
    assert found == {"stored": ["m1", "m4"], "lost": 2}, found


async def buffer_resend_after_redis_loss() -> dict:
    """A turn's enqueue times out although the script ran; the drain thread cannot reach
    Redis; the worker stores the message; Redis restarts empty; the drain thread resends."""
    server = RedisServer()
    server.start()
    proxy = RedisProxy(server.url).start()
    with ZepFake() as fake:
        s = settings_for(
            server.url,
            fake,
            Path(tempfile.mkdtemp(prefix="redelivery-")),
            enqueue_timeout=5.0,
            # The drain thread's refused tries open the breaker: closed again soon, so the
            # resend does not wait out the default 5 s.
            breaker_seconds=0.05,
        )
        turns = s.model_copy(update={"redis_url": proxy.url})
        agent = Enqueuer(turns)
        assert await agent.enqueue([msg(0, "warm up")])
        # A turn's deadline from here on (a held reply outlasts any deadline).
        agent._settings = turns.model_copy(update={"enqueue_timeout": 0.1})
        proxy.hold_replies()
        queued = await agent.enqueue([msg(1, "said once")])  # times out
        await until(lambda: proxy.held_replies)  # it ran
        proxy.refuse()
        proxy.release_replies()
        r = connect(s.redis_url)
        await drain(flusher(s), r)
        await r.aclose()
        server.stop()
        server.start()  # back empty (no AOF)
        proxy.resume()
        drained = agent.wait_empty(10.0)
        r = connect(s.redis_url)
        await drain(flusher(s), r)
        texts = [m["content"] for m in fake.messages()]
        await r.aclose()
        await agent.aclose()
        proxy.close()
        server.close()
        return {"queued": queued, "drained": drained, "copies": texts.count("said once")}


def test_buffered_maybe_queued_message_resent_after_redis_restart_is_stored_once() -> None:
    found = asyncio.run(buffer_resend_after_redis_loss())
    assert found == {"queued": False, "drained": True, "copies": 1}, found


async def spool_after_reimport() -> dict:
    """Process A spools its turn (Redis unreachable); the session is re-imported with 300
    later messages and flushed; then A's spool is replayed."""
    with stand() as (url, fake, _clock, tmp):
        s = settings_for(url, fake, tmp)
        texts = [("user" if i % 2 == 0 else "assistant", f"line {i}") for i in range(302)]
        sess = session(texts)
        live = messages_from_events(
            sess.events, app="app", user_id="ada", session_id="s1", assistant_name=s.assistant_name
        )
        a_turn = [m.model_copy(update={"replay": False}) for m in live[:2]]
        dead = s.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
        a = Enqueuer(dead)
        await a.enqueue(a_turn)
        await a.aclose()

        async def sessions(report):
            yield sess

        redis = connect(s.redis_url)
        await Backfill(s, redis, Source("test", 1, sessions)).run()
        f = flusher(s)
        await drain(f, redis, 100)
        replayed = await replay_into(Spool.of(s), ThreadQueue(redis, s))
        await drain(f, redis, 100)
        stored = [m["content"] for m in fake.messages()]
        await redis.aclose()
        return {
            "replayed": replayed.replayed,
            "stored": len(stored),
            "copies": (stored.count("line 0"), stored.count("line 1")),
        }


def test_spooled_turn_replayed_after_long_reimport_is_stored_once() -> None:
    found = asyncio.run(spool_after_reimport())
    assert found == {"replayed": 2, "stored": 302, "copies": (1, 1)}, found


async def spool_order_two_processes() -> list[str]:
    """B runs; A exits with Redis unreachable and spools its turn; B takes the next turn;
    the machine's worker replays the spool."""
    with stand() as (url, fake, _clock, tmp):
        s = settings_for(url, fake, tmp)
        b = Enqueuer(s)
        dead = s.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
        a = Enqueuer(dead)
        await a.enqueue([msg(1, "first, in A")])
        await a.aclose()
        await b.enqueue([msg(2, "second, in B")])
        redis = connect(s.redis_url)
        # B's drain thread replays the spool too (Redis answers it), and B's turn waits
        # behind A's in its buffer or the spool: on a loaded machine either may still be
        # on its way when the machine's replay and the worker's drain have run once.
        until = time.monotonic() + 60.0
        while len(fake.messages()) < 2 and time.monotonic() < until:
            await replay_into(Spool.of(s), ThreadQueue(redis, s))
            await asyncio.to_thread(b.wait_empty, 1.0)
            await drain(flusher(s), redis)
        order = [m["content"] for m in fake.messages()]
        await b.aclose()
        await redis.aclose()
        return order


def test_spooled_turn_of_one_process_stays_before_the_next_turn_of_another() -> None:
    assert asyncio.run(spool_order_two_processes()) == ["first, in A", "second, in B"]


async def late_copies_deep(n: int) -> dict:
    """Keys ignored; the first call of an n-message re-import is served 300 s late."""
    with stand(honor_idempotency=False) as (url, fake, clock, tmp):
        s = settings_for(url, fake, tmp)
        texts = [("user" if i % 2 == 0 else "assistant", f"message number {i}") for i in range(n)]
        sess = session(texts)

        async def sessions(report):
            yield sess

        redis = connect(s.redis_url)
        await Backfill(s, redis, Source("test", 1, sessions)).run()
        fake.inject(Fault(match=r"POST .*/threads/.*/messages", late=300.0))
        f = flusher(s)
        await drain(f, redis, 200)
        clock.t += 301.0
        fake.messages()  # lands the late request
        repaired = await f.repair_late(now_ms=int(time.time() * 1000) + 120_000)
        after = dup_report(fake.messages())
        await redis.aclose()
        return {"repair": dict(repaired), "unmarked": after["unmarked_duplicates"]}


# 600 messages: the late copies lie 12 pages down, past LATE_MARGIN. The 6,000-message
# re-import (about 50 s of CPU, past the old 5,000-message cap) is the slow tier's.
@pytest.mark.parametrize(
    "n", [600, pytest.param(6000, marks=pytest.mark.timeout(600))], ids=["600", "6000"]
)
def test_late_copies_deep_below_the_top_of_a_long_thread_are_marked(n: int) -> None:
    found = asyncio.run(late_copies_deep(n))
    assert found["unmarked"] == 0, found


def _now_ms() -> int:
    return int(time.time() * 1000)


async def rollback_during_lease(*, past_check: bool = True) -> list[str]:
    """m2 queued and its thread claimed, snapshot; m3, m4 queued; the worker stores m2 and
    m3 in batches of two, then Redis restarts from the snapshot (m2 queued again, the lease
    still held) and the agent queues m5: the worker goes on with the same lease, its next
    batch past its once-a-second server check or (``past_check`` False) within it."""
    clock = Clock()
    server = RedisServer()
    server.start()
    with ZepFake() as fake:
        s = settings_for(
            server.url, fake, Path(tempfile.mkdtemp(prefix="redelivery-")), batch_size=2
        )
        agent_redis = connect(s.redis_url)
        agent = ThreadQueue(agent_redis, s)
        armed = False

        async def restart_after_first_batch(_: QueuedMessage) -> None:
            nonlocal armed
            if not armed:
                return
            armed = False
            with contextlib.suppress(RedisError):
                await agent_redis.execute_command("SHUTDOWN", "NOSAVE")
            server.stop()
            server.start()
            if past_check:  # no claim comes between
                clock.t += 1.5
            assert await agent.enqueue([msg(5, "m5")], now_ms=_now_ms()) == 1

        worker_redis = connect(s.redis_url)
        f = Flusher(
            s,
            worker_redis,
            open_backend(s),
            after_flush=restart_after_first_batch,
            clock=clock,
        )
        await f.drain(budget=5)  # records the server
        await agent.enqueue([msg(1, "m1")], now_ms=_now_ms())
        await f.drain(budget=5)
        await agent.enqueue([msg(2, "m2")], now_ms=_now_ms())
        (lease,) = await f.claim(limit=1)
        armed = True
        await agent_redis.execute_command("SAVE")
        await agent.enqueue([msg(3, "m3")], now_ms=_now_ms())
        await agent.enqueue([msg(4, "m4")], now_ms=_now_ms())
        await f.flush_thread(lease)
        clock.t += 1.5
        await asyncio.sleep(0.3)  # a batch refused at BEGIN is due again 250 ms on
        await f.drain(budget=10)
        texts = [m["content"] for m in fake.messages()]
        await agent_redis.aclose()
        await worker_redis.aclose()
    server.close()
    return texts


def test_rollback_while_a_thread_is_held_is_caught_at_its_next_batch() -> None:
    # m4 was queued after the snapshot and never stored: lost (counted); m2 once.
    assert asyncio.run(rollback_during_lease()) == ["m1", "m2", "m3", "m5"]


async def rollback_found_by_a_worker_behind(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """m1..m3 queued, snapshot, stored; Redis restarts from the snapshot; a worker whose
    clock is 4 s behind finds the new server first; the agent queues m4; the other worker
    (clock right) drains."""
    clock = Clock()
    server = RedisServer()
    server.start()
    with ZepFake() as fake:
        s = settings_for(server.url, fake, Path(tempfile.mkdtemp(prefix="redelivery-")))
        agent_redis = connect(s.redis_url)
        agent = ThreadQueue(agent_redis, s)
        worker_redis = connect(s.redis_url)
        f = Flusher(s, worker_redis, open_backend(s), clock=clock)
        await f.drain(budget=5)  # records the server
        for i in (1, 2, 3):
            assert await agent.enqueue([msg(i, f"m{i}")], now_ms=_now_ms()) == 1
        await agent_redis.execute_command("SAVE")
        await f.drain(budget=10)
        with contextlib.suppress(RedisError):
            await agent_redis.execute_command("SHUTDOWN", "NOSAVE")
        server.stop()
        server.start()
        behind = flusher(s)
        with monkeypatch.context() as m:
            m.setattr(flush_module, "_now_ms", lambda: _now_ms() - 4000)
            await behind._check_server((None,))  # finds the new server, claims nothing
        await behind.redis.aclose()
        assert await agent.enqueue([msg(4, "m4")], now_ms=_now_ms()) == 1
        clock.t += 1.5  # past the once-a-second server check
        await f.drain(budget=10)
        texts = [m["content"] for m in fake.messages()]
        await agent_redis.aclose()
        await worker_redis.aclose()
    server.close()
    return texts


def test_rollback_found_by_a_worker_whose_clock_is_behind_is_stored_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = asyncio.run(rollback_found_by_a_worker_behind(monkeypatch))
    assert found == ["m1", "m2", "m3", "m4"], found
