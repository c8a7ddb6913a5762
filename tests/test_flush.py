"""The worker's persist job against the Zep fake through the real SDK, on real Redis."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from afterthought.contract import DeadLetter, QueuedMessage
from afterthought.settings import Settings
from afterthought.testing import Fault, ZepFake
from tests.conftest import BOTH_LAYOUTS, drain, enqueue, queued, where

pytestmark = BOTH_LAYOUTS


def _contents(fake: ZepFake) -> list[str]:
    return [m["content"] for m in fake.messages()]


@pytest.mark.parametrize("honor", [True, False], ids=["keys-honoured", "keys-ignored"])
async def test_rerunning_the_job_after_a_lost_ack_adds_nothing(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis, honor: bool
) -> None:
    """A crash after the backend stored a batch but before Redis heard of it."""
    zep_fake.honor_idempotency = honor
    messages = [queued(f"fact {i}", i) for i in range(5)]
    await enqueue(zep_settings, *messages)
    keys, tk, shard = where(zep_settings, messages[0])
    sent = await redis.lrange(keys.pending(tk), 0, -1)
    await drain(zep_settings)
    assert _contents(zep_fake) == [f"fact {i}" for i in range(5)]

    # Put the same batch back as if the ack had never happened, in-flight mark included.
    await redis.rpush(keys.pending(tk), *sent)
    await redis.hset(keys.thread(tk), "inflight", "1:5")
    await redis.zadd(keys.ready(shard), {tk: 0})
    await drain(zep_settings)

    assert _contents(zep_fake) == [f"fact {i}" for i in range(5)]
    assert not await redis.llen(keys.pending(tk))


@pytest.mark.parametrize("honor", [True, False], ids=["keys-honoured", "keys-ignored"])
async def test_lost_reply_is_retried_without_duplicates(
    zep_settings: Settings, zep_fake: ZepFake, honor: bool
) -> None:
    zep_fake.honor_idempotency = honor
    zep_fake.inject(Fault(match="POST /threads/.*/messages", drop=True, after_commit=True))
    # The fake commits before it drops the reply: nothing lands later to wait for.
    settings = zep_settings.model_copy(update={"backend_settle_seconds": 0.0})
    await enqueue(settings, queued("I live in Lisbon.", 1), queued("I like tea.", 2))
    await drain(settings)

    assert _contents(zep_fake) == ["I live in Lisbon.", "I like tea."]
    # The retry asked the thread what it holds instead of sending blind.
    calls = [(r.method, r.status) for r in zep_fake.requests if r.path.endswith("/messages")]
    assert calls == [("POST", 202), ("GET", 200)]


async def test_rate_limit_is_retried_honouring_retry_after(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    zep_fake.inject(Fault(match="POST /threads/.*/messages", status=429, retry_after=0.3))
    zep_fake.inject(Fault(match="POST /threads/.*/messages", status=503))
    await enqueue(zep_settings, queued("I live in Lisbon.", 1))
    await drain(zep_settings)

    assert _contents(zep_fake) == ["I live in Lisbon."]
    adds = [r for r in zep_fake.requests if r.method == "POST" and r.path.endswith("/messages")]
    assert [r.status for r in adds] == [429, 503, 202]
    assert adds[1].at - adds[0].at >= 0.3
    assert len({r.idempotency_key for r in adds}) == 1


async def test_transient_failures_past_the_job_are_deferred_not_lost(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    zep_fake.inject(Fault(match="POST /threads/.*/messages", status=502, times=3))
    await enqueue(zep_settings, queued("I live in Lisbon.", 1))
    await drain(zep_settings, timeout=30)

    assert _contents(zep_fake) == ["I live in Lisbon."]
    posts = [r for r in zep_fake.requests if r.method == "POST" and r.path.endswith("/messages")]
    assert [r.status for r in posts] == [502, 502, 502, 202]  # 3 in the job, then deferred


async def test_long_content_is_split_into_ordered_parts(
    make_settings: Callable[..., Settings], zep_fake: ZepFake
) -> None:
    settings = make_settings(
        backend="zep", zep_api_key="k", zep_base_url=zep_fake.base_url, max_message_chars=1000
    )
    text = " ".join(f"word{i:04d}" for i in range(700))  # 6,299 characters
    await enqueue(settings, queued(text, 1), queued("short", 2))
    await drain(settings)

    stored = zep_fake.messages()
    parts = [m for m in stored if "afterthought_part" in m["metadata"]]
    assert len(parts) == 7 and all(len(m["content"]) <= 1000 for m in parts)
    assert "".join(m["content"] for m in parts) == text  # nothing cut, nothing lost
    assert [m["metadata"]["afterthought_part"] for m in parts] == [f"{i}/7" for i in range(1, 8)]
    assert stored[-1]["content"] == "short"


async def test_batches_hold_at_most_thirty_messages(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    await enqueue(zep_settings, *[queued(f"m{i}", i) for i in range(75)])
    await drain(zep_settings)

    assert _contents(zep_fake) == [f"m{i}" for i in range(75)]
    sizes = [len(r.body["messages"]) for r in zep_fake.requests if r.path.endswith("/messages")]
    assert sizes == [30, 30, 15]


async def test_malformed_payload_is_dead_lettered_and_the_rest_flows(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    good = queued("I live in Lisbon.", 1)
    keys, tk, shard = where(zep_settings, good)
    await redis.rpush(keys.pending(tk), b'{"seq":1,"not":"a message"}', b"\xff\xfe garbage")
    await redis.hset(keys.thread(tk), "seq", 2)
    await enqueue(zep_settings, good)
    await drain(zep_settings)

    assert _contents(zep_fake) == ["I live in Lisbon."]
    dead = [DeadLetter.parse(x) for x in await redis.lrange(keys.dead(shard), 0, -1)]
    assert [d.item for d in dead] == [b'{"seq":1,"not":"a message"}', b"\xff\xfe garbage"]
    assert all(d.reason.startswith("malformed") and d.thread == tk for d in dead)


async def test_permanent_error_dead_letters_with_reason(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    zep_fake.inject(Fault(match="POST /threads/.*/messages", status=400))
    await enqueue(zep_settings, queued("I live in Lisbon.", 1))
    await drain(zep_settings)

    assert _contents(zep_fake) == []
    keys, _, shard = where(zep_settings, queued("I live in Lisbon.", 1))
    dead = await redis.lrange(keys.dead(shard), 0, -1)
    (letter,) = [DeadLetter.parse(x) for x in dead]
    assert letter.reason.startswith("bad_request (status=400")
    assert QueuedMessage.decode(letter.item).content == "I live in Lisbon."


async def test_worker_provisions_once_per_user_and_session(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    await enqueue(zep_settings, queued("a", 1, session="s1"))
    await enqueue(zep_settings, queued("b", 2, session="s2"))
    await drain(zep_settings)
    await enqueue(zep_settings, queued("c", 3, session="s1"))
    await drain(zep_settings)

    assert len(zep_fake.users()) == 1
    assert len(zep_fake.threads()) == 2
    by_thread = {
        t["uuid"]: [m["content"] for m in zep_fake.messages(t["uuid"])] for t in zep_fake.threads()
    }
    assert sorted(by_thread.values()) == [["a", "c"], ["b"]]


async def test_unprovisioned_can_be_dead_lettered_instead(
    make_settings: Callable[..., Settings], zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    settings = make_settings(
        backend="zep", zep_api_key="k", zep_base_url=zep_fake.base_url, provision_on_worker=False
    )
    await enqueue(settings, queued("a", 1))
    await drain(settings)

    assert zep_fake.users() == []
    keys, _, shard = where(settings, queued("x", 1))
    (raw,) = await redis.lrange(keys.dead(shard), 0, -1)
    assert "unprovisioned" in DeadLetter.parse(raw).reason


async def test_a_long_backlog_yields_the_thread_when_the_job_is_out_of_time(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    import time

    from afterthought.backends import open_backend
    from afterthought.worker.flush import Flusher

    await enqueue(zep_settings, *[queued(f"m{i}", i) for i in range(90)])
    flusher = Flusher(zep_settings, redis, open_backend(zep_settings))
    (lease,) = await flusher.claim(limit=5)
    stats = await flusher.flush_thread(lease, until=time.monotonic())  # already out of time
    assert stats["messages"] == 30  # one batch, then the lease is given back
    keys, tk, shard = where(zep_settings, queued("m0", 0))
    assert tk == lease.tk
    assert not await redis.exists(keys.lease(tk)) and await redis.zscore(keys.ready(shard), tk)
    await drain(zep_settings)
    assert _contents(zep_fake) == [f"m{i}" for i in range(90)]


async def test_a_long_retry_after_defers_instead_of_sleeping_in_the_job(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    import time

    from tests.conftest import run_worker_once

    zep_fake.inject(Fault(match="POST /threads/.*/messages", status=429, retry_after=30))
    await enqueue(zep_settings, queued("I live in Lisbon.", 1))
    await run_worker_once(zep_settings)  # had it slept in the job, it would have sent

    keys, tk, shard = where(zep_settings, queued("x", 1))
    score = await redis.zscore(keys.ready(shard), tk)
    assert score is not None and score / 1000 - time.time() > 25  # deferred past the limit
    assert await redis.pttl(keys.rate_limit) > 25_000  # and every worker holds off
    assert _contents(zep_fake) == []


async def test_a_timeout_while_zep_is_still_working_is_retried_once_stored(
    make_settings: Callable[..., Settings], zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    """The worker gives up waiting, Zep finishes anyway: the outcome is unknown, so the
    worker lets the server settle, reads the thread back and sends nothing again. The
    request hangs until the worker's settle (its injected sleep) lets it commit, however
    slow the machine."""
    import threading

    from afterthought.backends import open_backend
    from afterthought.worker.flush import Flusher
    from tests.conftest import until

    settings = make_settings(
        backend="zep", zep_api_key="k", zep_base_url=zep_fake.base_url, backend_timeout=0.3
    )
    released = threading.Event()
    zep_fake.inject(Fault(match="POST /threads/.*/messages", hang=True, released=released))
    slept: list[float] = []

    async def settle(seconds: float) -> None:
        """Zep commits while the worker waits."""
        slept.append(seconds)
        released.set()
        await until(lambda: zep_fake.hanging == 0 and all(r.status for r in zep_fake.requests))

    await enqueue(settings, queued("I live in Lisbon.", 1), queued("I like tea.", 2))
    backend = open_backend(settings)
    try:
        flusher = Flusher(settings, redis, backend, sleep=settle)
        (lease,) = await flusher.claim(limit=1)
        await flusher.flush_thread(lease)
    finally:
        released.set()  # a failed test leaves no request hanging
        await backend.aclose()

    assert settings.backend_settle_seconds in slept
    assert _contents(zep_fake) == ["I live in Lisbon.", "I like tea."]
    posts = [r for r in zep_fake.requests if r.method == "POST" and r.path.endswith("/messages")]
    reads = [r for r in zep_fake.requests if r.method == "GET" and r.path.endswith("/messages")]
    assert len(posts) == 1 and reads


async def test_a_stop_in_the_middle_of_a_send_is_the_stop_not_a_failed_flush(
    zep_settings: Settings,
    zep_fake: ZepFake,
    redis: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """arq cancels a job's task when its worker is told to stop, and a client in the middle
    of a call may answer the cancellation with its own connection error. No ERROR line:
    the task ends cancelled, and the message waits for the next worker."""
    import asyncio
    import logging

    from afterthought.backends import open_backend
    from afterthought.worker.flush import Flusher

    backend = open_backend(zep_settings)
    sending = asyncio.Event()

    async def add_messages(**_: object) -> None:
        sending.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ConnectionError("Connection closed by server.") from None

    send = backend.add_messages
    backend.add_messages = add_messages  # type: ignore[method-assign,assignment]
    await enqueue(zep_settings, queued("stopped mid-send", 0))
    flusher = Flusher(zep_settings, redis, backend)
    (lease,) = await flusher.claim(limit=1)
    task = asyncio.create_task(flusher.flush_thread(lease))
    await sending.wait()
    with caplog.at_level(logging.INFO):
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    backend.add_messages = send  # type: ignore[method-assign]
    await drain(zep_settings)
    assert _contents(zep_fake) == ["stopped mid-send"]


async def test_a_worker_whose_job_ends_cancelled_still_closes(zep_settings: Settings) -> None:
    """A job the stop cancelled ends cancelled; arq's close gathered it and raised, so the
    worker command exited 1 and its shutdown (backend closed, announcement withdrawn)
    never ran."""
    import asyncio

    from afterthought.worker.jobs import create_worker

    worker = create_worker(zep_settings, burst=True, handle_signals=False)
    shut: list[bool] = []
    shutdown = worker.on_shutdown
    assert shutdown is not None

    async def on_shutdown(ctx: dict[str, object]) -> None:
        await shutdown(ctx)
        shut.append(True)

    worker.on_shutdown = on_shutdown
    await worker.main()  # burst: nothing queued, so it returns with its pool open
    job = asyncio.create_task(asyncio.Event().wait())
    worker.tasks["a-flush-the-stop-cancelled"] = job
    job.cancel()
    await worker.close()
    assert shut == [True]
