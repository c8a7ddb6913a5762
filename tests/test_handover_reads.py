"""A worker's read and its write on two masters (issue 21). In a ``SENTINEL FAILOVER`` a
worker's pooled connections still reach the old master, which serves clients until the
sentinels demote it (about 10 s), while its new connections reach the promoted one. A
batch's head read on the old master must not be recorded on the new one over the record
of calls already sent cut otherwise: the same messages would go out under two keys and be
stored twice (the handover run once stored two messages twice).

The two masters are played on one Redis: the old master's head is the one read before the
new master's writes, handed to the worker for its next read."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from afterthought.backends import open_backend
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys
from afterthought.queue import Head, ThreadQueue
from afterthought.settings import Settings
from afterthought.testing import ZepFake
from afterthought.worker.flush import Flusher
from tests.conftest import enqueue, queued


def _stale_once(queue: ThreadQueue, **old: Any) -> None:
    """The queue's next head read answered by the old master: ``old``'s fields as it has
    them, the others as read now."""
    read: Callable[..., Awaitable[Head]] = queue.head

    async def head(ref: str, **kwargs: Any) -> Head:
        live = await read(ref, **kwargs)
        queue.head = read  # type: ignore[method-assign]
        return dataclasses.replace(live, **old)

    queue.head = head  # type: ignore[method-assign]


async def test_a_head_read_on_the_old_master_is_never_recorded_over_the_new_masters_record(
    zep_settings: Settings,
    zep_fake: ZepFake,
    redis: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said = ["I live in Lisbon.", "I like green tea.", "I work at Acme."]
    messages = [queued(text, n) for n, text in enumerate(said, 1)]
    await enqueue(zep_settings, *messages[:2])
    queue = ThreadQueue(redis, zep_settings)
    tk = queue.ref_of(messages[0])
    old = await queue.head(tk, count=zep_settings.batch_size)  # the old master: 1, 2
    await enqueue(zep_settings, messages[2])  # queued on the new master only

    # A first attempt on the new master: 1..3 recorded, sent as one call and stored; its
    # acknowledgement went to the old master and was lost with it.
    backend = open_backend(zep_settings)
    first = Flusher(zep_settings, redis, backend)

    async def lost(ref: str, token: str, **_: object) -> int:
        return 0

    monkeypatch.setattr(first.queue, "ack", lost)
    await first.drain(budget=30)
    assert [m["content"] for m in zep_fake.messages()] == said
    assert await redis.hget(Keys.of(zep_settings).thread(tk), "inflight") == b"1:3"

    # The next attempt (its acknowledgement kept now) reads the head on the old master (1,
    # 2, nothing recorded) and records on the new one: it must send nothing of that batch.
    monkeypatch.undo()
    flusher = first
    _stale_once(flusher.queue, items=old.items, inflight=old.inflight, cut=old.cut)
    stats = await flusher.drain(budget=30)
    assert [m["content"] for m in zep_fake.messages()] == said
    assert stats["changed"] == 1 and not stats["calls"]

    # Read again on the new master: the recorded batch is reconciled, nothing doubled.
    keys = Keys.of(zep_settings)
    await redis.zadd(keys.ready(keys.shard_of_ref(tk)), {tk: int(time.time() * 1000)}, xx=True)
    stats = await flusher.drain(budget=30)
    await backend.aclose()
    assert stats["messages"] == 3 and not stats["calls"]
    assert [m["content"] for m in zep_fake.messages()] == said
    assert not await redis.llen(keys.pending(tk))


async def test_a_thread_the_old_master_names_is_not_sent_to_when_the_master_names_another(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    """The old master has another thread registered for the session than the master: a
    worker provisioned it there in the window (the handover run lost a whole session so:
    stored, in a thread no map names once the old master follows the new one). A head read
    there names that thread; the batch must be stored in the master's."""
    await enqueue(zep_settings, queued("I live in Lisbon.", 1))
    backend = open_backend(zep_settings)
    flusher = Flusher(zep_settings, redis, backend)
    await flusher.drain(budget=30)
    registry = IdentityRegistry(redis, zep_settings)
    known = await registry.lookup(app="memtest", user_id="alice", session_id="s1")
    assert known.user is not None and known.thread_uuid is not None
    orphan = await backend.create_thread(user=known.user, idempotency_key="the old master's")

    await enqueue(zep_settings, queued("I like green tea.", 2))
    _stale_once(flusher.queue, thread_uuid=orphan)
    stats = await flusher.drain(budget=30)
    assert stats["changed"] == 1 and not zep_fake.messages(orphan)

    keys = Keys.of(zep_settings)  # due again at once (not after the retry's pause)
    tk = keys.thread_ref("memtest", "alice", "s1")
    await redis.zadd(keys.ready(keys.shard_of_ref(tk)), {tk: int(time.time() * 1000)}, xx=True)
    await flusher.drain(budget=30)
    await backend.aclose()
    assert not zep_fake.messages(orphan)
    assert [m["content"] for m in zep_fake.messages(known.thread_uuid)] == [
        "I live in Lisbon.",
        "I like green tea.",
    ]
