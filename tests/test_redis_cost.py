"""Fewer Redis commands per message (issue 14), and the behaviour each cut must keep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from afterthought.backends.base import BackendError
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.worker.pacing import READ_SECONDS, Pacing


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
    two_workers: tuple[Pacing, Pacing],
) -> None:
    mine, other = two_workers
    await asyncio.sleep(READ_SECONDS)
    await other.hold(0.5)
    began = time.monotonic()
    assert await mine.wait()  # it slept: the caller knows time passed
    assert time.monotonic() - began >= 0.4


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
