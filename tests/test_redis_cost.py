"""Fewer Redis commands per message (issue 14), and the behaviour each cut must keep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from afterthought.backends import open_backend
from afterthought.backends.base import BackendError, MemoryBackend
from afterthought.context_cache import PENDING
from afterthought.keys import Keys
from afterthought.queue import Head
from afterthought.settings import Settings
from afterthought.testing import Fault, ZepFake
from afterthought.worker.flush import IDLE_SHARD_SECONDS, Flusher
from afterthought.worker.pacing import MAX_IN_JOB_WAIT, READ_SECONDS, Pacing
from tests.conftest import BOTH_LAYOUTS, enqueue, queued


@pytest.fixture
def two_workers(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> tuple[Pacing, Pacing]:
    keys = Keys.of(make_settings())
    return Pacing(redis, keys, pause_seconds=30), Pacing(redis, keys, pause_seconds=30)


async def test_a_hold_another_worker_set_is_honoured_within_the_bound(
    two_workers: tuple[Pacing, Pacing],
) -> None:
    mine, other = two_workers
    assert not await mine.wait()  # read now: no gate, and that is what it holds for a while
    await other.hold(30)  # another worker's 429
    await asyncio.sleep(READ_SECONDS)
    with pytest.raises(BackendError) as raised:  # a long hold defers the thread
        await mine.wait()
    assert raised.value.kind == "rate_limited"


async def test_a_short_hold_another_worker_set_is_waited_out(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    keys = Keys.of(make_settings())
    mine = Pacing(redis, keys, pause_seconds=30, sleep=sleep)
    other = Pacing(redis, keys, pause_seconds=30)
    await other.hold(MAX_IN_JOB_WAIT - 0.1)  # short: waited out in the job
    assert await mine.wait()  # it slept: the caller knows time passed
    assert len(slept) == 1 and 0 < slept[0] <= MAX_IN_JOB_WAIT - 0.1  # what is left of it


async def test_a_pause_another_worker_set_is_honoured_within_the_bound(
    two_workers: tuple[Pacing, Pacing],
) -> None:
    mine, other = two_workers
    assert not await mine.paused()
    await other.pause(BackendError("unauthorized", code="401"))
    await asyncio.sleep(READ_SECONDS)
    assert await mine.paused()


async def test_a_workers_own_hold_and_pause_apply_at_once(
    two_workers: tuple[Pacing, Pacing], redis: aioredis.Redis
) -> None:
    mine, _ = two_workers
    assert not await mine.wait() and not await mine.paused()  # both read, and kept
    await mine.hold(30)
    with pytest.raises(BackendError):
        await mine.wait()
    await mine.pause(BackendError("unauthorized", code="401"))
    assert await mine.paused()


async def test_the_shared_state_is_read_at_most_once_per_bound(
    two_workers: tuple[Pacing, Pacing], redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, _ = two_workers
    reads = 0
    pipeline = redis.pipeline

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal reads
        reads += 1
        return pipeline(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(redis, "pipeline", counted)
    began = time.monotonic()
    for _ in range(50):
        await mine.wait()
        await mine.paused()
    assert reads <= 1 + (time.monotonic() - began) / READ_SECONDS


# --- the epoch check folded into the batch's BEGIN ------------------------------------------
class CountingBackend:
    """Wraps a backend: counts add_messages calls and runs ``after_add`` after each."""

    def __init__(self, inner: MemoryBackend) -> None:
        self.inner = inner
        self.adds: list[list[str]] = []
        self.after_add: Callable[[], Awaitable[None]] | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def add_messages(self, **kwargs: Any) -> str | None:
        result = await self.inner.add_messages(**kwargs)
        self.adds.append([m.content for m in kwargs["messages"]])
        if self.after_add is not None:
            await self.after_add()
        return result


async def _forget_begins(redis: aioredis.Redis, settings: Settings) -> None:
    """What a forget of alice does first (``Forgetter._marks``): the mark and the epoch."""
    keys = Keys.of(settings)
    await redis.set(keys.forgetting("memtest", "alice"), PENDING, px=60_000)
    await redis.incr(keys.epoch("memtest", "alice"))


@BOTH_LAYOUTS
async def test_a_forget_that_begins_after_the_head_was_read_stops_the_batch_unsent(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    backend = CountingBackend(open_backend(local_settings))
    flusher = Flusher(local_settings, redis, backend)  # type: ignore[arg-type]
    await enqueue(local_settings, queued("hello", 1))
    await flusher.drain(budget=10)  # registered, and the process knows whose thread it is
    await enqueue(local_settings, queued("I live in Zorblaxia.", 2))
    heads: list[Head] = []
    read = flusher.queue.head

    async def head_then_forget(*args: Any, **kwargs: Any) -> Head:
        head = await read(*args, **kwargs)
        heads.append(head)
        if head.items:
            await _forget_begins(redis, local_settings)
        return head

    flusher.queue.head = head_then_forget  # type: ignore[method-assign]
    stats = await flusher.drain(budget=10)

    assert heads[0].epoch is not None  # the head read the epoch (the folded path)
    assert backend.adds == [["hello"]]  # nothing of the forgotten batch was sent
    assert stats["forgotten"] == 1
    await backend.aclose()


@BOTH_LAYOUTS
async def test_a_forget_that_begins_during_a_batch_stops_it_before_the_next_call(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> None:
    settings = make_settings(max_message_chars=100, batch_size=2)
    backend = CountingBackend(open_backend(settings))
    flusher = Flusher(settings, redis, backend)  # type: ignore[arg-type]
    await enqueue(settings, queued("hello", 1))
    await flusher.drain(budget=10)
    long = " ".join(f"word{i}" for i in range(60))  # four parts: two calls of one batch
    await enqueue(settings, queued(long, 2))

    async def forget() -> None:
        backend.after_add = None
        await _forget_begins(redis, settings)

    backend.after_add = forget
    await flusher.drain(budget=10)

    assert len(backend.adds) == 2  # "hello", then the first call of the long one only
    assert len(backend.adds[1]) == 2
    await backend.aclose()


async def test_a_pacing_wait_makes_the_next_epoch_check_read_again(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    """BEGIN's comparison stands for the check before the first call only while nothing
    takes time between them: a shared gate waited out in the job does."""
    backend = CountingBackend(open_backend(local_settings))
    flusher = Flusher(local_settings, redis, backend)  # type: ignore[arg-type]
    await enqueue(local_settings, queued("hello", 1))
    await flusher.drain(budget=10)
    await enqueue(local_settings, queued("I live in Zorblaxia.", 2))
    wait = flusher.pacing.wait

    async def gate_then_forget() -> bool:
        await wait()
        await _forget_begins(redis, local_settings)  # while this worker waited out a gate
        return True

    flusher.pacing.wait = gate_then_forget  # type: ignore[method-assign]
    stats = await flusher.drain(budget=10)

    assert backend.adds == [["hello"]]
    assert stats["forgotten"] == 1
    await backend.aclose()


async def test_a_shard_with_nothing_due_is_polled_again_only_after_a_while(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> None:
    """Sharded, a claim polls only the shards that had something due, and the others every
    ``IDLE_SHARD_SECONDS``: at light load a claim would cost a command per shard."""
    settings = make_settings(redis_shards=8)
    now = [0.0]
    flusher = Flusher(settings, redis, open_backend(settings), clock=lambda: now[0])
    assert await flusher.claim(limit=5) == []  # nothing due anywhere: every shard idles
    await enqueue(settings, queued("hello", 1))
    assert await flusher.claim(limit=5) == []  # its shard is not polled yet
    now[0] += IDLE_SHARD_SECONDS
    (lease,) = await flusher.claim(limit=5)
    assert lease.tk == Keys.of(settings).thread_ref("memtest", "alice", "s1")


@BOTH_LAYOUTS
async def test_a_forget_that_begins_while_a_batch_is_read_back_stops_it_unsent(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    """A batch read back before it is sent (a message whose earlier attempt may have
    landed): the read is a backend call between BEGIN's epoch comparison and the send, so
    the check before the send reads the epoch again (found by a reviewer: it did not)."""
    backend = CountingBackend(open_backend(local_settings))
    flusher = Flusher(local_settings, redis, backend)  # type: ignore[arg-type]
    await enqueue(local_settings, queued("hello", 1))
    await flusher.drain(budget=10)
    unsure = queued("I live in Zorblaxia.", 2).model_copy(update={"unsure": True})
    await enqueue(local_settings, unsure)
    read = backend.inner.message_page  # an unsure batch is read against the whole thread

    async def read_then_forget(**kwargs: Any) -> Any:
        found = await read(**kwargs)
        await _forget_begins(redis, local_settings)
        return found

    backend.message_page = read_then_forget  # type: ignore[attr-defined]
    stats = await flusher.drain(budget=10)
    assert stats["reconciled"] == 1
    assert backend.adds == [["hello"]]  # the read-back message was never sent
    await backend.aclose()


async def test_a_workers_own_pause_stops_its_other_threads_too(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    """A 401 pauses every worker; this one's other claimed threads stop before their next
    call as well, instead of draining on through the pause (found by a reviewer: 26 calls
    went out after it). A call another thread had already sent may still land."""
    settings = zep_settings.model_copy(update={"batch_size": 2, "worker_concurrency": 4})
    flusher = Flusher(settings, redis, open_backend(settings))
    for session in ("a", "b"):
        await enqueue(settings, queued(f"hi {session}", 0, session=session))
    await flusher.drain(budget=10)  # both threads provisioned
    for session in ("a", "b"):
        await enqueue(
            settings, *[queued(f"{session} {n}", n, session=session) for n in range(1, 41)]
        )
    zep_fake.inject(Fault(match="POST /threads/.*/messages", status=401, times=1))
    stats = await flusher.drain(budget=10)
    adds = [r for r in zep_fake.requests if r.method == "POST" and r.path.endswith("/messages")]
    refused = next(i for i, r in enumerate(adds) if r.status == 401)
    after = [r for r in adds[refused + 1 :] if r.status in (200, 201, 202)]
    assert stats["paused"] >= 1 and len(after) <= 2, len(after)
    assert await redis.exists(Keys.of(settings).paused)
